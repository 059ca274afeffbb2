"""The JSONL write path's own machinery: its worker threads and its window timer."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from kai_session_checkpoint_policy import Host
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence
from kai_session_checkpoint_policy.persistence.workers import _Workers

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.anyio


async def test_a_job_runs_in_another_thread_and_its_error_is_raised() -> None:
    workers = _Workers()
    seen: list[threading.Thread] = []

    def fail() -> None:
        seen.append(threading.current_thread())
        raise OSError(5, "injected")

    with pytest.raises(OSError, match="injected"):
        await workers.run(fail)
    assert len(seen) == 1
    assert seen[0] is not threading.current_thread()


async def test_a_blocked_job_does_not_hold_up_another() -> None:
    workers = _Workers()
    second_ran = threading.Event()

    def first() -> None:
        assert second_ran.wait(10), "the second job never ran"

    def second() -> None:
        second_ran.set()

    async with anyio.create_task_group() as group:
        group.start_soon(workers.run, first)
        await workers.run(second)


async def test_at_most_limit_threads_run_jobs_the_rest_wait() -> None:
    workers = _Workers(limit=1)
    order: list[str] = []
    started, release = threading.Event(), threading.Event()

    def first() -> None:
        order.append("first")
        started.set()
        assert release.wait(10)

    def second() -> None:
        order.append("second")

    async with anyio.create_task_group() as group:
        group.start_soon(workers.run, first)
        assert await anyio.to_thread.run_sync(started.wait, 10)
        group.start_soon(workers.run, second)
        await anyio.wait_all_tasks_blocked()
        assert order == ["first"]  # one thread, busy: the second job waits in the queue
        release.set()
    assert order == ["first", "second"]


async def test_a_window_opened_after_a_flush_is_still_written_in_the_background(
    tmp_path: Path,
) -> None:
    backend = JsonlSessionPersistence(tmp_path, batch_window=0.05)
    async with Host([backend], autoload=False) as host:
        session = host.sessions.create("windows")
        for expected in (1, 2, 3):
            session.append("assistant/chunk", {"n": expected})  # opens a window
            if expected < 3:
                await host.sessions.flush(session)  # closes it before it expires
        assert backend.durable_count("windows") == 2
        with anyio.fail_after(10):
            # The timer that waited for the first window waits on for the last one.
            while backend.durable_count("windows") < 3:
                await anyio.lowlevel.checkpoint()
        assert await host.sessions.flush(session)  # waits for the background write to finish
        assert backend.statistics().batches == 3
