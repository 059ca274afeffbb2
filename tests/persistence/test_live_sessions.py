"""A backend knows every live session: loads never repair under one, and a backend can be
swapped while sessions go on.

A session is live from the moment the host creates, resumes or seeds it (``session_attach``),
not only once it appends; a backend registered while sessions are live hears of each. Loading a
live session returns its log as it is, or refuses if its turn is open, and never races with the
session being detached. A backend disposed of on an open host writes what its sessions admitted
and releases their locks, so the next one goes on with them.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Final

import anyio
import pytest

from kai_session_checkpoint_policy import Host, StoredLog
from kai_session_checkpoint_policy.events import JSONObject
from kai_session_checkpoint_policy.host import Session
from kai_session_checkpoint_policy.persistence import (
    JsonlSessionPersistence,
    LiveSessionError,
    OsFiles,
)

from ..support.persistence_helpers import assistant, events, log_bytes, tool_call, write_log

pytestmark = pytest.mark.anyio

HOUR: Final = 3600.0
TURN: Final[list[tuple[str, JSONObject]]] = [
    ("turn/start", {"turn": 1}),
    ("user/message", {"turn": 1, "message": {"role": "user", "content": "hello"}}),
    ("turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
]


def append_turn(session: Session, turn: int) -> None:
    session.append("turn/start", {"turn": turn})
    session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


def provided(host: Host) -> object:
    """The host's persistence backend, as it is now."""
    return host.session_persistence


class GatedWrites(OsFiles):
    """Files whose next ``write``, once armed, waits for the test's word in its thread."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.entered = threading.Event()
        self.go = threading.Event()

    def write(self, fd: int, data: bytes) -> None:
        if self.armed:
            self.armed = False
            self.entered.set()
            assert self.go.wait(timeout=60), "the test never let the write go on"
        super().write(fd, data)


async def test_a_load_racing_a_detach_returns_the_log_once_the_detach_has_written_it(
    tmp_path: Path,
) -> None:
    files = GatedWrites()
    backend = JsonlSessionPersistence(
        tmp_path, batch_window=HOUR, inline_write_limit=0, files=files, compression="none"
    )
    async with Host([backend]) as host, anyio.create_task_group() as group:
        session = host.sessions.create("s")
        append_turn(session, 1)
        await host.sessions.flush(session)
        append_turn(session, 2)  # queued: the detach writes it in the background
        files.armed = True
        host.sessions.detach(session)
        await anyio.to_thread.run_sync(files.entered.wait)  # that write is in flight
        loaded: list[StoredLog] = []

        async def load() -> None:
            loaded.append(await backend.load("s"))

        group.start_soon(load)
        await anyio.wait_all_tasks_blocked()  # the load waits for the detach's write
        files.go.set()
    (log,) = loaded
    assert [event.type for event in log.events] == ["turn/start", "turn/end"] * 2
    assert log.repair == ()


async def test_a_load_never_repairs_the_log_a_seeded_live_session_goes_on_from(
    tmp_path: Path,
) -> None:
    stored = events(
        *TURN, ("turn/start", {"turn": 2}), assistant(2, 1, "c1"), tool_call(2, 1, "c1")
    )
    path = write_log(tmp_path, "s", log_bytes("s", stored))
    before = path.read_bytes()
    backend = JsonlSessionPersistence(tmp_path, batch_window=HOUR, compression="none")
    async with Host([backend]) as host:
        inspected = await backend.inspect("s")
        session = host.sessions.create("s", seed=inspected.events)  # live, nothing appended
        with pytest.raises(LiveSessionError, match="live turn is open"):
            await backend.load("s")
        assert path.read_bytes() == before  # nothing repaired under the live session
        session.append("tool/result", dict(inspected.repair[0].data))
        session.append("turn/end", {"turn": 2, "reason": {"kind": "interrupted"}})
        await host.sessions.flush(session)  # goes on where the log ends
    assert len((await JsonlSessionPersistence(tmp_path).inspect("s")).events) == len(stored) + 2


async def test_a_backend_disposed_on_an_open_host_writes_and_releases_for_the_next(
    tmp_path: Path,
) -> None:
    first = JsonlSessionPersistence(tmp_path, batch_window=HOUR, compression="none")
    second = JsonlSessionPersistence(tmp_path, batch_window=HOUR, compression="none")
    async with Host([first]) as host:
        session = host.sessions.create("s")
        append_turn(session, 1)  # queued in the first backend only
        await host.dispose(first)
        assert provided(host) is None
        assert [e.type for e in (await second.inspect("s")).events] == ["turn/start", "turn/end"]
        host.register(second)  # hears of the live session, and goes on writing it
        assert provided(host) is second
        session.append("turn/start", {"turn": 2})
        with pytest.raises(LiveSessionError, match="live turn is open"):
            await second.load("s")
        session.append("turn/end", {"turn": 2, "reason": {"kind": "completed"}})
        await host.sessions.flush(session)  # no lock left behind, no seq out of step
    stored = await JsonlSessionPersistence(tmp_path).inspect("s")
    assert [event.seq for event in stored.events] == [0, 1, 2, 3]


async def test_a_loaded_live_session_is_a_copy_its_reader_may_change(tmp_path: Path) -> None:
    backend = JsonlSessionPersistence(tmp_path, batch_window=HOUR, compression="none")
    async with Host([backend]) as host:
        session = host.sessions.create("s")
        append_turn(session, 1)
        loaded = await backend.load("s")
        assert list(loaded.events) == list(session.events)
        loaded.events[0].data["turn"] = 99  # the reader's own copy
        assert session.events[0].data == {"turn": 1}
        await host.sessions.flush(session)
    assert (await backend.inspect("s")).events[0].data == {"turn": 1}


class GatedHeads(OsFiles):
    """Files whose header reads wait for the test's word in their thread."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.go = threading.Event()

    def read_head(self, path: Path, limit: int = 1 << 16) -> bytes:
        self.entered.set()
        assert self.go.wait(timeout=60), "the test never let the read go on"
        return super().read_head(path, limit)


async def test_a_listing_cancelled_while_it_reads_returns_nothing(tmp_path: Path) -> None:
    write_log(tmp_path, "s", log_bytes("s", events(*TURN)))
    files = GatedHeads()
    backend = JsonlSessionPersistence(tmp_path, files=files)
    returned: list[object] = []
    async with anyio.create_task_group() as group:
        scope = anyio.CancelScope()

        async def list_them() -> None:
            with scope:
                returned.append(await backend.list_sessions())

        group.start_soon(list_them)
        await anyio.to_thread.run_sync(files.entered.wait)
        scope.cancel()
        files.go.set()
    assert (returned, scope.cancelled_caught) == ([], True)


async def test_a_live_session_goes_on_over_the_torn_tail_of_the_log_it_was_seeded_from(
    tmp_path: Path,
) -> None:
    committed = log_bytes("s", events(*TURN))
    path = write_log(tmp_path, "s", committed + b'{"type":"turn/st')  # a write that never ended
    backend = JsonlSessionPersistence(tmp_path, batch_window=HOUR, compression="none")
    async with Host([backend]) as host:
        session = host.sessions.create("s", seed=(await backend.inspect("s")).events)
        append_turn(session, 2)
        await host.sessions.flush(session)  # cuts the torn tail, as recovery would, and goes on
    assert path.with_name(f"{path.name}.torn-{len(committed)}").read_bytes() == b'{"type":"turn/st'
    stored = await JsonlSessionPersistence(tmp_path).inspect("s")
    assert ([event.seq for event in stored.events], stored.torn_bytes) == ([0, 1, 2, 3, 4], 0)
