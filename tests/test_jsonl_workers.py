"""The worker threads that run the blocking part of JSONL writes."""

from __future__ import annotations

import threading

import anyio
import anyio.to_thread
import pytest

from kai_session_checkpoint_policy.persistence.jsonl import _Workers

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
