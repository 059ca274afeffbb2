"""A long session is read once per load, and holds as objects only the events someone reads."""

from __future__ import annotations

import contextlib
import gc
from typing import TYPE_CHECKING

import anyio.lowlevel
import pytest

from kai_session_checkpoint_policy import (
    Agent,
    Host,
    JsonlSessionPersistence,
    SessionEvent,
    SessionLockedError,
    TextDelta,
    policy,
)
from kai_session_checkpoint_policy.persistence import OsFiles, SeedMismatchError
from kai_session_checkpoint_policy.pytest_plugin import RecordingAdapter

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from kai_session_checkpoint_policy import JSONObject

pytestmark = pytest.mark.anyio

CHUNKS = 300
"""Chunks of each response: most of a long session's events."""


async def live_chunks() -> int:
    """How many ``assistant/chunk`` event objects exist in this process.

    The count comes after a checkpoint: closing a host cancels its background tasks, and until
    the task that closed it next suspends, the coroutine can still refer to that cancellation's
    exception, whose traceback reaches the frames that held the closed host's sessions (seen
    with asyncio on Python 3.13). Suspending once lets those go; then a collection frees what
    only cycles still hold."""
    await anyio.lowlevel.checkpoint()
    gc.collect()
    return sum(
        isinstance(item, SessionEvent) and item.type == "assistant/chunk"
        for item in gc.get_objects()
    )


class CountingFiles(OsFiles):
    """The real file layer, counting the logs it reads whole (at once, or a chunk at a time)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def read(self, path: Path) -> bytes:
        self.reads += 1
        return super().read(path)

    @contextlib.contextmanager
    def reader(self, path: Path) -> Iterator[Callable[[int], bytes]]:
        self.reads += 1
        with super().reader(path) as read:
            yield read


async def run_turns(root: Path, count: int, files: OsFiles | None = None) -> list[str]:
    """Run *count* turns of session ``"long"`` (resumed if stored); the texts the model was
    sent in the last request."""
    adapter = RecordingAdapter()
    backend = JsonlSessionPersistence(root, files=files, pack_chunks=False)
    async with Host([backend, policy]) as host:
        host.llm.register_adapter("mock", adapter)
        session = await host.sessions.open("long")
        agent = Agent(host, session, provider="mock", model="m")
        for _ in range(count):
            adapter.script(*(TextDelta(f"{i} ") for i in range(CHUNKS)))
            outcome = await agent.run_turn(f"question {session.seq}")
            assert outcome.reason == {"kind": "completed"}
    return [str(message["role"]) for message in adapter.requests[-1].messages]


async def test_resuming_reads_the_log_once_and_the_first_write_does_not_read_it(
    tmp_path: Path,
) -> None:
    await run_turns(tmp_path, 3)
    files = CountingFiles()
    roles = await run_turns(tmp_path, 1, files)
    assert files.reads == 1
    assert roles == ["user", "assistant"] * 3 + ["user"]  # the whole transcript, from one read
    stored = await JsonlSessionPersistence(tmp_path).load("long")
    turns = [event.data["turn"] for event in stored.events if event.type == "turn/start"]
    assert (turns, stored.repair) == ([1, 2, 3, 4], ())


async def test_a_resumed_session_keeps_its_lock_until_it_is_detached(tmp_path: Path) -> None:
    """In a host, the recovery's lock is kept for the session's first write: no other process
    writes the log in between, so that write needs to read nothing."""
    await run_turns(tmp_path, 1)
    files = CountingFiles()
    async with Host([JsonlSessionPersistence(tmp_path, files=files)]) as host:
        session = await host.sessions.resume("long")
        with pytest.raises(SessionLockedError, match="is being written by another process"):
            await run_turns(tmp_path, 1)  # another host
        host.sessions.detach(session)  # never written: its lock is let go
        await run_turns(tmp_path, 1)
        await host.sessions.resume("long")  # held again, until the host closes
    await run_turns(tmp_path, 1)
    assert files.reads == 2
    stored = await JsonlSessionPersistence(tmp_path).load("long")
    turns = [event.data["turn"] for event in stored.events if event.type == "turn/start"]
    assert turns == [1, 2, 3]


async def test_a_log_written_elsewhere_after_the_load_is_read_again(tmp_path: Path) -> None:
    """Loaded outside a host, a log is not locked: a session seeded with what the load found
    writes only if the log is still that (the seed is checked against it first)."""
    await run_turns(tmp_path, 1)
    files = CountingFiles()
    backend = JsonlSessionPersistence(tmp_path, files=files)
    loaded = await backend.load("long")
    await run_turns(tmp_path, 1)  # another host writes a turn meanwhile
    refusals: list[str] = []

    async def write_after_another_host() -> None:
        async with Host([backend]) as host:
            session = host.sessions.create("long", seed=loaded.events)
            session.append("turn/start", {"turn": 2})
            with pytest.raises(SeedMismatchError) as refused:
                await host.sessions.flush(session)
            assert refused.value.seq == len(loaded.events)
            refusals.append(str(refused.value))

    with pytest.raises(SeedMismatchError) as closing:  # closing the host drains it again
        await write_after_another_host()
    count = len(loaded.events)
    path = tmp_path / "_no-cwd" / "long" / "session.jsonl.zstd"
    assert (
        refusals
        == [str(closing.value)]
        == [
            f"session 'long': its seed ends at seq {count}, but the log stored at {path} goes "
            f"on to seq {2 * count - 1} ('turn/start' at seq {count}); nothing was written"
        ]
    )
    assert files.reads == 3  # the load, and the seed's check at the flush and at the close
    stored = await JsonlSessionPersistence(tmp_path).load("long")
    assert (len(stored.events), stored.repair) == (2 * count, ())


async def test_a_resumed_session_holds_as_objects_only_the_events_read(tmp_path: Path) -> None:
    await run_turns(tmp_path, 3)
    before = await live_chunks()
    async with Host([JsonlSessionPersistence(tmp_path)]) as host:
        session = await host.sessions.resume("long")
        assert session.seq == 3 * (CHUNKS + 6) + 2  # one request header and context
        assert await live_chunks() == before
        tracked = session.events.select({"turn/start", "user/message", "assistant/message"})
        assert [event.type for event in tracked] == [
            "turn/start",
            "user/message",
            "assistant/message",
        ] * 3
        assert await live_chunks() == before
        chunk = session.events[10]
        assert (chunk.type, chunk.data["chunk"]) == (
            "assistant/chunk",
            {"type": "text-delta", "index": 0, "text": "5 "},
        )
        assert await live_chunks() == before + 1
        host.sessions.detach(session)


async def test_an_agent_reads_only_what_its_requests_need(tmp_path: Path) -> None:
    await run_turns(tmp_path, 3)
    before = await live_chunks()
    adapter = RecordingAdapter()
    async with Host([JsonlSessionPersistence(tmp_path), policy]) as host:
        host.llm.register_adapter("mock", adapter)
        session = await host.sessions.resume("long")
        agent = Agent(host, session, provider="mock", model="m")
        adapter.script(*(TextDelta(f"{i} ") for i in range(CHUNKS)))
        await agent.run_turn("one more")
        assert await live_chunks() == before + CHUNKS  # the new turn's, in the session
        assert [message["role"] for message in adapter.requests[0].messages] == [
            "user",
            "assistant",
        ] * 3 + ["user"]
        host.sessions.detach(session)


async def test_the_locks_kept_for_resumed_sessions_stay_within_max_open_sessions(
    tmp_path: Path,
) -> None:
    closed: JSONObject = {"turn": 1, "reason": {"kind": "completed"}}
    for number in range(4):
        async with Host([JsonlSessionPersistence(tmp_path)]) as host:
            session = host.sessions.create(f"s{number}")
            session.append("turn/start", {"turn": 1})
            session.append("turn/end", closed)
    backend = JsonlSessionPersistence(tmp_path, max_open_sessions=2)
    async with Host([backend]) as host:
        sessions = [await host.sessions.resume(f"s{number}") for number in range(4)]
        other = JsonlSessionPersistence(tmp_path)
        for number in (0, 1):  # the oldest gave their locks back
            assert len((await other.load(f"s{number}")).events) == 2
        for number in (2, 3):
            with pytest.raises(SessionLockedError):
                await other.load(f"s{number}")
        for session in sessions:  # each writes on, whether it kept its lock or not
            session.append("turn/start", {"turn": 2})
            await host.sessions.flush(session)
    for number in range(4):
        stored = await JsonlSessionPersistence(tmp_path).load(f"s{number}")
        assert [event.type for event in stored.events[:3]] == [
            "turn/start",
            "turn/end",
            "turn/start",
        ]
