"""The JSONL write path's own machinery: its worker threads and its window timer."""

from __future__ import annotations

import re
import threading
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from kai_session_checkpoint_policy import Host
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence, OsFiles
from kai_session_checkpoint_policy.persistence import core as core_module
from kai_session_checkpoint_policy.persistence.workers import (
    _Job,
    _Returns,
    _Workers,
    loop_is_idle,
)

from ..support.persistence_helpers import FailingFiles, GatedFiles

if TYPE_CHECKING:
    from collections.abc import Callable
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


async def test_a_hundred_jobs_waiting_for_each_other_each_get_a_thread() -> None:
    """As 100 sessions' writes waiting for the group commit that takes them all: none ends
    before every one has started, so a smaller pool would wait for ever."""
    workers = _Workers()
    everyone = threading.Barrier(100, timeout=10)
    async with anyio.create_task_group() as group:
        for _ in range(100):
            group.start_soon(workers.run, everyone.wait)
    assert not everyone.broken


async def test_jobs_that_end_while_the_loop_is_busy_wake_it_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workers = _Workers()
    scheduled: list[object] = []
    returns_of = _Workers._returns_of

    def counted_returns_of(
        self: _Workers, loop: object, schedule: Callable[[Callable[[], object]], object]
    ) -> _Returns:
        def counted(callback: Callable[[], object]) -> object:
            scheduled.append(callback)
            return schedule(callback)

        return returns_of(self, loop, counted)

    handed_back = threading.Semaphore(0)
    add = _Returns.add

    def noted_add(self: _Returns, job: _Job[Any]) -> None:
        add(self, job)
        handed_back.release()

    monkeypatch.setattr(_Workers, "_returns_of", counted_returns_of)
    monkeypatch.setattr(_Returns, "add", noted_add)
    started, go = threading.Semaphore(0), threading.Event()
    results: list[int] = []

    def job(number: int) -> int:
        started.release()
        assert go.wait(10)
        return number

    async def run(number: int) -> None:
        results.append(await workers.run(partial(job, number)))

    async with anyio.create_task_group() as group:
        for number in range(3):
            group.start_soon(run, number)
        await anyio.to_thread.run_sync(lambda: [started.acquire(timeout=10) for _ in range(3)])
        # The loop's thread blocks while the three jobs end and are handed back.
        go.set()
        for _ in range(3):
            assert handed_back.acquire(timeout=10)
    assert sorted(results) == [0, 1, 2]
    assert len(scheduled) == 1  # one wake-up for the three


def test_a_hand_back_to_an_ended_loop_is_dropped() -> None:
    tries: list[object] = []

    def ended(callback: Callable[[], object]) -> object:
        tries.append(callback)
        raise RuntimeError("Event loop is closed")

    returns = _Returns(object(), ended)
    returns.add(_Job(lambda: None))
    returns.add(_Job(lambda: None))
    assert len(tries) == 2  # each tried on its own: nothing is kept for a loop that is gone


async def test_a_window_opened_after_a_flush_is_still_written_in_the_background(
    tmp_path: Path,
) -> None:
    backend = JsonlSessionPersistence(tmp_path, batch_window=0.05)
    async with Host([backend]) as host:
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


class ThreadRecordingFiles(FailingFiles):
    """Real files that note which thread makes each ``write`` call, and signal each one."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []
        self.written = threading.Event()

    def write(self, fd: int, data: bytes) -> None:
        on_loop = threading.current_thread() is threading.main_thread()
        self.threads.append("loop" if on_loop else "worker")
        super().write(fd, data)
        self.written.set()


async def _flush_three_times(backend: JsonlSessionPersistence) -> None:
    """Flush one event into a new file (a publish), then one more twice (appends)."""
    async with Host([backend]) as host:
        session = host.sessions.create("placed")
        for turn in (1, 2, 3):
            session.append("turn/start", {"turn": turn})
            await host.sessions.flush(session)


async def test_an_awaited_append_on_an_idle_loop_is_written_on_the_loop_thread(
    tmp_path: Path,
) -> None:
    files = ThreadRecordingFiles()
    # A limit no write here reaches, so that only the kind of write and the loop decide.
    await _flush_three_times(JsonlSessionPersistence(tmp_path, inline_write_limit=60, files=files))
    # Creating the file stays off the loop. On trio, the appends are written on the loop after
    # one scheduler round, which shows that no other task was ready.
    assert files.threads == ["worker", "loop", "loop"]


async def test_flushes_of_tasks_ready_together_share_one_write_on_the_loop(
    tmp_path: Path,
) -> None:
    """Tasks that append and flush one session in the same scheduler round join the first
    one's flush: one write for all of them, although the loop would let each write inline."""
    files = ThreadRecordingFiles()
    backend = JsonlSessionPersistence(tmp_path, inline_write_limit=60, files=files)
    async with Host([backend]) as host:
        session = host.sessions.create("together")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
        go = anyio.Event()

        async def checkpoint(step: int) -> None:
            await go.wait()
            session.append("step/start", {"turn": 1, "step": step})
            await host.sessions.flush(session)

        async with anyio.create_task_group() as group:
            for step in range(1, 9):
                group.start_soon(checkpoint, step)
            await anyio.wait_all_tasks_blocked()
            go.set()
    assert files.threads == ["worker", "loop"]  # the log created, then the 8 steps at once
    assert backend.statistics().batches == 2


async def test_after_a_failed_write_the_log_is_read_again_off_the_loop(
    tmp_path: Path, anyio_backend: str
) -> None:
    files = ThreadRecordingFiles()
    backend = JsonlSessionPersistence(tmp_path, inline_write_limit=60, files=files)
    async with Host([backend]) as host:
        session = host.sessions.create("suspect")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
        session.append("step/start", {"turn": 1, "step": 1})
        files.fail["fsync"] = 1
        with pytest.raises(OSError, match="injected fsync failure"):
            await host.sessions.flush(session)
        await host.sessions.flush(session)  # re-reads the log, then writes the batch again
    assert files.threads == ["worker", "loop", "worker"]
    assert backend.statistics().batches == 2


async def test_a_loop_is_idle_only_while_no_other_task_is_ready(anyio_backend: str) -> None:
    await anyio.wait_all_tasks_blocked()
    # Trio cannot tell whether tasks of its current batch have yet to run, unless the caller
    # is just back from a scheduler round.
    assert loop_is_idle() is (anyio_backend == "asyncio")
    await anyio.lowlevel.checkpoint()
    assert loop_is_idle(settled=True)
    async with anyio.create_task_group() as group:
        group.start_soon(anyio.lowlevel.checkpoint)  # ready to run, not yet started
        assert not loop_is_idle()
        assert not loop_is_idle(settled=True)
    await anyio.lowlevel.checkpoint()
    assert loop_is_idle(settled=True)


async def test_an_awaited_flush_writes_in_a_worker_while_another_task_is_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = ThreadRecordingFiles()
    monkeypatch.setattr(core_module, "loop_is_idle", lambda **_: False)
    await _flush_three_times(JsonlSessionPersistence(tmp_path, inline_write_limit=60, files=files))
    assert files.threads == ["worker", "worker", "worker"]


async def test_a_zero_inline_write_limit_always_writes_in_a_worker(tmp_path: Path) -> None:
    files = ThreadRecordingFiles()
    await _flush_three_times(JsonlSessionPersistence(tmp_path, inline_write_limit=0, files=files))
    assert files.threads == ["worker", "worker", "worker"]


async def test_after_a_write_slower_than_the_limit_the_next_goes_to_a_worker(
    tmp_path: Path,
) -> None:
    files = ThreadRecordingFiles()
    # Every real write takes longer than a nanosecond: the appends, which an idle asyncio loop
    # would take with a long limit (above), go to a worker.
    backend = JsonlSessionPersistence(tmp_path, inline_write_limit=1e-9, files=files)
    await _flush_three_times(backend)
    assert files.threads == ["worker", "worker", "worker"]


async def test_a_background_batch_is_written_in_a_worker(tmp_path: Path) -> None:
    files = ThreadRecordingFiles()
    backend = JsonlSessionPersistence(tmp_path, batch_window=0.01, files=files)
    async with Host([backend]) as host:
        session = host.sessions.create("background")
        session.append("turn/start", {"turn": 1})
        assert await anyio.to_thread.run_sync(files.written.wait, 10)
    assert files.threads == ["worker"]


@pytest.mark.parametrize("limit", [-0.001, float("nan"), float("inf"), "0.002"])
def test_the_inline_write_limit_must_be_zero_or_more_seconds(limit: float) -> None:
    message = f"inline_write_limit must be a number of seconds, 0 or more, not {limit!r}"
    with pytest.raises(ValueError, match=re.escape(message)):
        JsonlSessionPersistence("root", inline_write_limit=limit)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # trio writes after a scheduler round
async def test_a_flush_that_writes_on_the_loop_returns_without_a_scheduler_round(
    tmp_path: Path,
) -> None:
    order: list[str] = []

    async def other_task() -> None:
        order.append("other task")

    async with anyio.create_task_group() as group:

        class StartingFiles(OsFiles):
            """Real files whose append starts a task, as I/O arriving meanwhile would."""

            def write(self, fd: int, data: bytes) -> None:
                super().write(fd, data)
                if self.calls["write"] == 2:  # not the publication of the file: the append
                    order.append("written")
                    group.start_soon(other_task)

        backend = JsonlSessionPersistence(tmp_path, inline_write_limit=60, files=StartingFiles())
        async with Host([backend]) as host:
            session = host.sessions.create("inline")
            for turn in (1, 2):
                session.append("turn/start", {"turn": turn})
                await host.sessions.flush(session)
            order.append("flushed")

    # The task started during the write runs at the caller's next await, not inside the flush.
    assert order == ["written", "flushed", "other task"]


async def test_closing_drains_events_admitted_meanwhile_and_releases_every_session(
    tmp_path: Path,
) -> None:
    files = GatedFiles()
    backend = JsonlSessionPersistence(tmp_path, inline_write_limit=0, files=files)
    async with Host([backend]) as host:
        first, second = host.sessions.create("first"), host.sessions.create("second")
        for session in (first, second):
            session.append("turn/start", {"turn": 1})
            await host.sessions.flush(session)
        second.append("step/start", {"turn": 1, "step": 1})
        files.gate_next = True
        async with anyio.create_task_group() as group:
            group.start_soon(backend.aclose)
            assert await anyio.to_thread.run_sync(files.entered.wait, 10)  # draining "second"
            first.append("step/start", {"turn": 1, "step": 1})  # after "first" was drained
            files.release.set()
        assert backend.statistics().sessions == 0
    for session_id in ("first", "second"):  # durable, and no lock is left held
        loaded = await JsonlSessionPersistence(tmp_path).load(session_id)
        assert [event.type for event in loaded.events[:2]] == ["turn/start", "step/start"]


async def test_a_failed_background_batch_is_written_again_in_the_next_window(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = FailingFiles()
    backend = JsonlSessionPersistence(tmp_path, batch_window=0.01, files=files)
    async with Host([backend]) as host:
        session = host.sessions.create("retried")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
        files.fail["fsync"] = 1
        session.append("step/start", {"turn": 1, "step": 1})  # opens a window; nothing else
        with anyio.fail_after(10):  # the window's write fails; the next window's holds
            while backend.durable_count("retried") < 2:
                await anyio.lowlevel.checkpoint()  # no flush: only the windows write
        assert files.fail == {"fsync": 0}
    assert [record.getMessage() for record in caplog.records] == [
        "background write of session 'retried' failed; the batch stays queued, and is tried "
        "again in 0.02 s, then less and less often",
        "session 'retried' written again after 1 failed background writes",
    ]


def on_a_virtual_clock(threshold: float = 0.05) -> object:
    """trio on a clock that jumps to the next deadline once every task has waited *threshold*
    seconds (a worker thread's write counts as waiting: a jump during one only makes fewer
    tries)."""
    from trio.testing import MockClock

    return ("trio", {"clock": MockClock(autojump_threshold=threshold)})


@pytest.mark.parametrize("anyio_backend", [on_a_virtual_clock()], ids=["trio-virtual-clock"])
async def test_a_write_that_keeps_failing_is_tried_less_and_less_often(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A minute of a disk that refuses every write: at a window of 10 ms, the batch is tried a
    dozen times, not six thousand, and the failure is logged once."""
    files = FailingFiles()
    backend = JsonlSessionPersistence(tmp_path, batch_window=0.01, files=files)
    async with Host([backend]) as host:
        session = host.sessions.create("failing")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
        files.fail["write"] = 10**9
        session.append("step/start", {"turn": 1, "step": 1})  # opens a window; nothing else
        await anyio.sleep(60)  # on the virtual clock: windows expire as fast as they can
        tries = 10**9 - files.fail["write"]
        files.fail["write"] = 0
    # 20 ms, 40 ms, ... 30 s: 12 tries in a minute at most (without the backoff, 6,000).
    assert 2 <= tries <= 13, tries
    errors = [record.getMessage() for record in caplog.records if record.levelname == "ERROR"]
    assert len(errors) == 1, errors  # the first failure; the retries are not logged again


@pytest.mark.parametrize("anyio_backend", [on_a_virtual_clock(0)], ids=["trio-virtual-clock"])
async def test_a_session_that_keeps_flushing_keeps_one_window_timer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each window is flushed before it expires, so the timer always wakes to a closed window;
    it ends only once no new window opened while it slept."""
    starts = 0
    timer = core_module.WriteBehind._window_timer

    async def counted(self: JsonlSessionPersistence, *args: Any) -> None:
        nonlocal starts
        starts += 1
        await timer(self, *args)

    monkeypatch.setattr(core_module.WriteBehind, "_window_timer", counted)
    # Every flush writes on the loop, so that the clock jumps only when the test sleeps.
    backend = JsonlSessionPersistence(tmp_path, batch_window=0.01, inline_write_limit=60)
    async with Host([backend]) as host:
        session = host.sessions.create("busy")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)  # the log exists: later flushes write on the loop
        await anyio.sleep(0.05)  # the first window's timer ends
        for step in range(30):  # 30 steps of 4 ms: a dozen windows, each flushed
            session.append("step/start", {"turn": 1, "step": step})  # opens a window
            await host.sessions.flush(session)
            await anyio.sleep(0.004)
        assert starts == 2  # the first window's timer, then one for all 30 steps
        assert backend.statistics().batches == 31  # every batch by a flush, none by a timer
        await anyio.sleep(0.05)  # idle: the timer finds no new window, and ends
        session.append("turn/end", {"turn": 1})  # a new window: a new timer
        await anyio.sleep(0.02)  # the window expires: its timer writes it
        assert await host.sessions.flush(session)  # waits for that write
        assert starts == 3
        assert backend.durable_count("busy") == 32
