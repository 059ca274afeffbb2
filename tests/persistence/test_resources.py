"""What a backend holds for a session, and when it lets go: files, locks, events.

A host that runs for months serves session after session; the backend must hold descriptors
and memory only for the sessions that are live, and stay within the process's limit on open
files even when more sessions are live than it allows.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Final

import anyio
import pytest

from kai_session_checkpoint_policy import Host, JsonlSessionPersistence, PersistenceError

from ..support import SUPPORT, figures
from ..support.persistence_helpers import find_log, lines, log_path

LONG_RUN_CHILD: Final = SUPPORT / "long_run_child.py"


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def stored_types(root: Path, session_id: str) -> list[object]:
    return [record["type"] for record in lines(find_log(root, session_id))[1:]]


@pytest.mark.anyio
async def test_closing_a_session_releases_its_files_and_its_events(tmp_path: Path) -> None:
    backend = JsonlSessionPersistence(tmp_path)
    async with Host([backend]) as host:
        before = open_descriptors()
        session = host.sessions.create("s")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
        assert open_descriptors() == before + 1  # the lock (the log is opened by an append)
        session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        await host.sessions.flush(session)
        assert open_descriptors() == before + 2
        assert backend.statistics().open_sessions == 1
        await host.sessions.close(session)
        assert open_descriptors() == before
        assert (backend.statistics().sessions, backend.statistics().open_sessions) == (0, 0)
        released = weakref.ref(session)
        del session
        await anyio.wait_all_tasks_blocked()  # the window's timer task ends, and lets go too
        gc.collect()
        assert released() is None  # nothing of the backend keeps the session or its events
    assert stored_types(tmp_path, "s") == ["turn/start", "turn/end"]


@pytest.mark.anyio
async def test_a_session_detached_with_queued_events_is_written_then_released(
    tmp_path: Path,
) -> None:
    backend = JsonlSessionPersistence(tmp_path, batch_window=3600)
    async with Host([backend]) as host:
        before = open_descriptors()
        session = host.sessions.create("s")
        session.append("turn/start", {"turn": 1})
        host.sessions.detach(session)  # the queue is written in the background
        await backend.flush("s")  # waits for it
        await anyio.wait_all_tasks_blocked()  # the background write lets go of the session
        assert stored_types(tmp_path, "s") == ["turn/start"]
        assert backend.statistics().sessions == 0
        assert open_descriptors() == before


@pytest.mark.anyio
async def test_more_live_sessions_than_open_files_allowed(tmp_path: Path) -> None:
    backend = JsonlSessionPersistence(tmp_path, max_open_sessions=2)
    async with Host([backend]) as host:
        before = open_descriptors()
        sessions = [host.sessions.create(f"s{index}") for index in range(6)]
        for turn in (1, 2):
            for session in sessions:
                session.append("turn/start", {"turn": turn})
                await host.sessions.flush(session)
                assert backend.statistics().open_sessions <= 2
                assert open_descriptors() <= before + 4
        assert backend.statistics().sessions == 6
    for index in range(6):
        assert stored_types(tmp_path, f"s{index}") == ["turn/start", "turn/start"]


@pytest.mark.anyio
async def test_a_log_changed_while_its_files_were_closed_is_refused(tmp_path: Path) -> None:
    backend = JsonlSessionPersistence(tmp_path, max_open_sessions=1, compression="none")
    log = log_path(tmp_path, "first")
    refused = r"session.jsonl changed while its files were closed: it holds 179 bytes where 159"
    with pytest.raises(PersistenceError, match=refused):  # noqa: PT012 - the close tries again
        async with Host([backend]) as host:
            first, second = host.sessions.create("first"), host.sessions.create("second")
            for session in (first, second):  # the second's write closes the first's files
                session.append("turn/start", {"turn": 1})
                await host.sessions.flush(session)
            with log.open("ab") as another_writer:
                another_writer.write(b'{"type":"turn/end"}\n')
            changed = log.read_bytes()
            first.append("step/start", {"turn": 1, "step": 1})
            with pytest.raises(PersistenceError, match=refused):
                await host.sessions.flush(first)
            assert log.read_bytes() == changed  # nothing written over the other writer's bytes
    assert log.read_bytes() == changed


def test_ten_thousand_sessions_one_after_another_under_a_small_file_limit(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """In a child limited to 256 open files: every flush succeeds, descriptors stay bounded."""
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path  # speed, not durability
    sessions = 10_000
    result = subprocess.run(
        [sys.executable, str(LONG_RUN_CHILD), str(root), str(sessions), "256"],
        capture_output=True,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    report = json.loads(result.stdout)
    figures.add(
        request,
        long_run_sessions=report["sessions"],
        long_run_peak_descriptors=report["peak_descriptors"],
        long_run_rss_growth_kib=report["rss_growth_kib"],
    )
    assert report["sessions"] == sessions
    assert report["flushes"] == 3 * sessions
    assert report["peak_descriptors"] <= report["descriptors_at_start"] + 8
    assert report["rss_growth_kib"] < 16 * 1024
    assert report["live_phase_sessions"] > report["file_limit"]  # more live than it could open
    assert report["live_phase_peak_descriptors"] < report["file_limit"]
