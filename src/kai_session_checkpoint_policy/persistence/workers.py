"""Where the blocking part of a write runs: worker threads, or the idle event loop itself.

A write of a small batch costs one ``write`` and one ``fsync``, about as long as handing the call
to a thread and back through ``anyio.to_thread.run_sync``. The threads here take jobs from a
queue and resolve each with a single call into the waiting event loop. Cheaper still is no hop
at all: :func:`loop_is_idle` tells when no other task is ready to run, so that blocking the
event loop's thread for a short write delays no one.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from functools import partial
from typing import TYPE_CHECKING, Final

import anyio
import anyio.to_thread

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["loop_is_idle", "run_in_worker"]


def loop_is_idle() -> bool:
    """Whether no task or callback of the running asyncio event loop is ready to run, but the
    caller's.

    ``False`` when that cannot be told: on trio, which runs the ready tasks in batches and tells
    only how many wait for the next batch, not how many of the current one have yet to run; on
    an asyncio loop without the standard ``_ready`` queue (uvloop).
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio
        return False
    ready = getattr(loop, "_ready", None)  # the standard loops' queue of ready callbacks
    return ready is not None and not ready


def _completion() -> tuple[Callable[[], object], Callable[[], Awaitable[object]]] | None:
    """A signal that another thread can send, and how the running event loop waits for it.

    ``signal()`` may be called once, from any thread; ``wait()`` returns once it has been.
    ``None`` when the event loop is neither asyncio nor trio.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio
        pass
    else:
        future = loop.create_future()
        return partial(loop.call_soon_threadsafe, _resolve, future), lambda: future
    try:
        import trio
    except ImportError:
        return None
    try:
        token = trio.lowlevel.current_trio_token()
    except RuntimeError:  # not trio either
        return None
    event = trio.Event()
    return partial(token.run_sync_soon, event.set), event.wait


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # its task may have been cancelled by asyncio itself
        future.set_result(None)


class _Job:
    """A blocking call handed to a worker thread, and the signal the thread sends when done."""

    __slots__ = ("error", "func", "signal")

    def __init__(self, func: Callable[[], None], signal: Callable[[], object]) -> None:
        self.func = func
        self.signal = signal
        self.error: BaseException | None = None


class _Workers:
    """The threads that run the blocking part of every write: a cheaper hop than anyio's.

    ``anyio.to_thread.run_sync`` takes longer to hand a call over and back (a capacity
    limiter, scheduler checkpoints, a condition variable) than a small fsync takes. Here a job
    goes to an idle thread through a ``SimpleQueue``, and the thread's very last step is one
    call into the event loop that resolves the job (``call_soon_threadsafe`` on asyncio,
    ``run_sync_soon`` on trio), so the waiting task resumes while the thread is already
    blocked on the queue again. A thread is started when none is idle, up to ``limit`` (as
    anyio's default limiter), and ends after ``idle_seconds`` without work. An event loop
    other than asyncio or trio falls back to ``anyio.to_thread.run_sync``.
    """

    def __init__(self, *, limit: int = 40, idle_seconds: float = 10.0) -> None:
        self._limit = limit
        self._idle_seconds = idle_seconds
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting for a job, minus jobs queued; changed under the lock

    async def run(self, func: Callable[[], None]) -> None:
        """Call *func* in a worker thread and return (or raise) when it has."""
        completion = _completion()
        if completion is None:
            await anyio.to_thread.run_sync(func)
            return
        signal, wait = completion
        job = _Job(func, signal)
        with self._lock:
            if self._idle <= 0 and self._threads < self._limit:
                thread = threading.Thread(target=self._serve, name="kai-jsonl-writer", daemon=True)
                thread.start()
                self._threads += 1
                self._idle += 1
            self._idle -= 1
            self._jobs.put(job)
        await wait()
        if job.error is not None:
            raise job.error

    def _serve(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._idle -= 1
                        self._threads -= 1
                        return
                continue
            try:
                job.func()
            except BaseException as error:  # raised again by the task waiting for the job
                job.error = error
            with self._lock:
                self._idle += 1
            with contextlib.suppress(RuntimeError):  # the loop has ended: nobody waits any more
                job.signal()


_workers: Final = _Workers()
run_in_worker: Final = _workers.run
"""Call a blocking function in a worker thread; return (or raise) when it has."""
