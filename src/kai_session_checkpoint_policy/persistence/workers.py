"""Where the blocking part of a write runs: worker threads, or the idle event loop itself.

A write of a small batch costs one ``write`` and one ``fsync``, about as long as handing the call
to a thread and back through ``anyio.to_thread.run_sync``. The threads here take jobs from a
queue and resolve each with a single call into the waiting event loop. Cheaper still is no hop
at all: :func:`loop_is_idle` tells when no other task is ready to run, so that blocking the
event loop's thread for a short write delays no one.

A job, once handed to a thread, is waited for until the thread has returned, whatever cancels
the caller meanwhile: anyio's cancel scopes (the wait is shielded) and a native asyncio
``Task.cancel()`` (which passes through anyio's shield) alike. The caller's state (a batch, a
lane) therefore never changes hands while a thread still works on it; the cancellation is
raised once the job is over.
"""

from __future__ import annotations

import asyncio
import copy
import queue
import threading
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

if TYPE_CHECKING:
    from collections.abc import Callable

    from trio.lowlevel import TrioToken

__all__ = [
    "Gathering",
    "idle_needs_a_round",
    "loop_is_idle",
    "run_in_worker",
    "run_in_worker_shielded",
]

T = TypeVar("T")
Item = TypeVar("Item")


def loop_is_idle(*, settled: bool = False) -> bool:
    """Whether no task or callback of the running event loop is ready to run, but the caller's.

    On asyncio, the loop's queue of ready callbacks tells (``False`` on a loop without the
    standard ``_ready`` queue, such as uvloop). Trio runs the ready tasks in batches and counts
    only those waiting for the next batch, not those of the current one that have yet to run:
    there the answer is ``True`` only when the caller is *settled*, just back from a scheduler
    checkpoint, so that every task that was ready before it has had its turn, and no task and
    no callback has become ready since. (Tasks woken at the very moment the caller was, which
    share its batch, are not seen: they wait for the caller's quick write.)
    """
    loop = asyncio._get_running_loop()  # None off asyncio: no exception to raise
    if loop is None:
        return settled and _trio_is_idle()
    ready = getattr(loop, "_ready", None)  # the standard loops' queue of ready callbacks
    return ready is not None and not ready


def idle_needs_a_round() -> bool:
    """Whether :func:`loop_is_idle` can say ``True`` only once the caller is *settled*: on
    any event loop but asyncio."""
    return asyncio._get_running_loop() is None  # as loop_is_idle does


def _trio_is_idle() -> bool:
    """Whether no trio task nor callback waits for the next batch (``False`` off trio)."""
    try:
        import trio
    except ImportError:
        return False
    try:
        statistics = trio.lowlevel.current_statistics()
    except RuntimeError:  # not trio either
        return False
    return statistics.tasks_runnable == 0 and statistics.run_sync_soon_queue_size == 0


class _Job(Generic[T]):
    """A blocking call handed to a worker thread, and how its caller learns that it is over.

    The thread runs :attr:`func`, keeps its outcome, and as its very last step hands the job
    to :attr:`returns`, which ends it on the event loop's thread (:meth:`finish`).
    """

    __slots__ = ("error", "finished", "func", "result", "returns", "waiter")

    def __init__(self, func: Callable[[], T]) -> None:
        self.func: Callable[[], T] | None = func
        self.result: T | None = None
        self.error: BaseException | None = None
        self.finished = False  # set on the event loop's thread
        self.waiter: asyncio.Future[None] | anyio.Event | None = None
        self.returns: _Returns | None = None  # set by the worker pool as it submits the job

    def run(self) -> None:
        """Run the call (in the worker thread), then let go of it.

        The call holds its caller's state (a batch, a session), which must not outlive the
        caller's interest in it while the thread still holds this job.
        """
        func, self.func = self.func, None
        assert func is not None, "a job runs once"
        try:
            self.result = func()
        except BaseException as error:  # raised again by the task waiting for the job
            self.error = error

    def run_here(self) -> T:
        """Run the call in this thread and return what it returned."""
        self.run()
        return self.outcome()

    def finish(self) -> None:
        """Mark the job over and wake its caller (on the event loop's thread)."""
        self.finished = True
        waiter = self.waiter
        if isinstance(waiter, asyncio.Future):
            if not waiter.done():  # its task may have cancelled it
                waiter.set_result(None)
        elif waiter is not None:
            waiter.set()

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]  # set by run() when error is None


class _Returns:
    """The jobs of one event loop that are over, handed back with one wake-up of the loop for
    all those that end before it gets to them.

    ``call_soon_threadsafe`` (and trio's ``run_sync_soon``) writes to the loop's wake-up socket
    on every call; many sessions writing at once would wake a busy loop once for every job.
    Here the first job over schedules the callback that ends them all, and the jobs that end
    before it runs join it.
    """

    __slots__ = ("_lock", "_over", "_schedule", "loop")

    def __init__(self, loop: object, schedule: Callable[[Callable[[], object]], object]) -> None:
        self.loop = loop  # the asyncio loop or trio token whose jobs these are
        self._schedule = schedule
        self._lock = threading.Lock()
        self._over: list[_Job[Any]] = []

    def add(self, job: _Job[Any]) -> None:
        """Hand *job*, over, back to its loop (in the worker thread)."""
        with self._lock:
            over = self._over
            over.append(job)
            if len(over) > 1:
                return  # the callback that ends it is scheduled, and has yet to run
        try:
            self._schedule(self._finish)
        except RuntimeError:  # the loop has ended: nobody waits any more
            with self._lock:
                self._over.clear()

    def _finish(self) -> None:
        with self._lock:
            over, self._over = self._over, []
        for job in over:
            job.finish()


async def _wait_on_asyncio(job: _Job[T], loop: asyncio.AbstractEventLoop) -> None:
    """Wait until *job* is over; a cancellation met meanwhile is raised afterwards."""
    cancelled: BaseException | None = None
    while not job.finished:
        waiter = job.waiter = loop.create_future()
        try:
            await waiter
        except asyncio.CancelledError as exc:  # Task.cancel() cancelled the waiter: wait on
            cancelled = exc
    if cancelled is not None:
        raise cancelled


async def _wait_on_trio(job: _Job[T]) -> None:
    event = anyio.Event()
    job.waiter = event
    if not job.finished:
        await event.wait()


class _Workers:
    """The threads that run the blocking part of every write: a cheaper hop than anyio's.

    ``anyio.to_thread.run_sync`` takes longer to hand a call over and back (a capacity
    limiter, scheduler checkpoints, a condition variable) than a small fsync takes. Here a job
    goes to an idle thread through a ``SimpleQueue``, and the thread's very last step hands it
    back to the event loop (:class:`_Returns`: ``call_soon_threadsafe`` on asyncio,
    ``run_sync_soon`` on trio, once for all the jobs that end before the loop gets to them),
    so the waiting task resumes while the thread is already blocked on the queue again. A
    thread is started when none is idle, up to ``limit``, and ends after ``idle_seconds``
    without work. An event loop other than asyncio or trio falls back to
    ``anyio.to_thread.run_sync``.

    The limit is higher than anyio's 40: a PostgreSQL write waits in its thread for the group
    commit that takes it, so most threads of a busy pool are waiting, not working. At 100
    sessions checkpointing at once, 40 threads kept each flush queued for a thread about as
    long as its commit took (15 ms of 34).
    """

    def __init__(self, *, limit: int = 128, idle_seconds: float = 10.0) -> None:
        self._limit = limit
        self._idle_seconds = idle_seconds
        self._jobs: queue.SimpleQueue[_Job[object]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting for a job, minus jobs queued; changed under the lock
        self._local = threading.local()  # the hand-back of the loop running in each thread

    async def run(self, func: Callable[[], T]) -> T:
        """Call *func* in a worker thread and return (or raise) what it did, once it is over.

        A cancellation of the caller is raised only after the call has returned.
        """
        job = _Job(func)
        with anyio.CancelScope(shield=True):  # anyio's cancellation; Task.cancel() is waited out
            await self._run(job)
        return job.outcome()

    async def run_shielded(self, func: Callable[[], T]) -> T:
        """:meth:`run`, for a caller inside a shielding cancel scope already."""
        job = _Job(func)
        await self._run(job)
        return job.outcome()

    async def _run(self, job: _Job[T]) -> None:
        loop = _asyncio_loop()
        if loop is not None:
            job.returns = self._returns_of(loop, loop.call_soon_threadsafe)
            self._submit(job)
            await _wait_on_asyncio(job, loop)
            return
        token = _trio_token()
        if token is None:  # another event loop: anyio's own threads
            job.result = await anyio.to_thread.run_sync(job.run_here)
            return
        job.returns = self._returns_of(token, token.run_sync_soon)
        self._submit(job)
        await _wait_on_trio(job)

    def _returns_of(
        self, loop: object, schedule: Callable[[Callable[[], object]], object]
    ) -> _Returns:
        """The hand-back of *loop*, the event loop running in this thread: kept per thread, so
        that an ended loop is held only until the thread runs another."""
        returns: _Returns | None = getattr(self._local, "returns", None)
        if returns is None or returns.loop is not loop:
            returns = self._local.returns = _Returns(loop, schedule)
        return returns

    def _submit(self, job: _Job[T]) -> None:
        with self._lock:
            if self._idle <= 0 and self._threads < self._limit:
                thread = threading.Thread(target=self._serve, name="kai-jsonl-writer", daemon=True)
                thread.start()
                self._threads += 1
                self._idle += 1
            self._idle -= 1
            self._jobs.put(job)  # type: ignore[arg-type]  # the queue holds jobs of any result

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
            job.run()
            with self._lock:
                self._idle += 1
            returns = job.returns
            if returns is not None:
                returns.add(job)
            del job, returns  # while idle, hold nothing of the last job


class _Gathered(Generic[Item]):
    """One item waiting on the event loop for the job that takes it."""

    __slots__ = ("error", "finished", "item", "lead", "waiter")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.finished = False  # a job that took it is over
        self.error: Exception | None = None  # what that job raised
        self.lead = False  # asked to run the next job
        self.waiter: asyncio.Future[None] | anyio.Event | None = None

    def wake(self) -> None:
        waiter = self.waiter
        if isinstance(waiter, asyncio.Future):
            if not waiter.done():  # its task may have cancelled it
                waiter.set_result(None)
        elif waiter is not None:
            waiter.set()

    async def wait(self) -> BaseException | None:
        """Wait until a job took the item and is over, or the item is asked to lead; return
        the native cancellation met meanwhile, for the caller to raise when it is done."""
        cancelled: BaseException | None = None
        loop = _asyncio_loop()
        while not (self.finished or self.lead):
            if loop is None:
                event = self.waiter = anyio.Event()
                await event.wait()  # the caller is shielded from anyio's cancellation
                continue
            waiter = self.waiter = loop.create_future()
            try:
                await waiter
            except asyncio.CancelledError as exc:  # Task.cancel() cancelled the waiter: wait on
                cancelled = exc
        return cancelled


class Gathering(Generic[Item]):
    """One job in a worker thread for the items of every task that asks while the last runs.

    The first task to :meth:`submit` runs a job for its item, at once or, on asyncio while
    other tasks are ready to run, after letting them run for a few rounds, so that those about
    to submit join its job. Tasks that submit while a job runs wait together; when the job is
    over, the first of them runs the next one, for all of their items. So many tasks pay one
    hand-off to a thread and back per job, not one each, and one thread works for all of them.
    *run* gets the items of a job in the order they were submitted; it keeps each item's
    outcome in the item (an exception it raises is the outcome of every item of its job).

    Like :func:`run_in_worker_shielded`, :meth:`submit` returns only once the job that took
    its item is over, whatever cancels its caller meanwhile (who is shielded from anyio's
    cancellation): a native ``Task.cancel()`` is raised afterwards; a task asked to run the
    next job runs it first.
    """

    def __init__(self, run: Callable[[list[Item]], None]) -> None:
        self._run = run
        self._waiting: list[_Gathered[Item]] = []
        self._running = False
        self.jobs = 0
        """Jobs run so far."""

    @property
    def busy(self) -> bool:
        """Whether a job is running or about to (an item submitted now would wait for it)."""
        return self._running

    async def submit(self, item: Item) -> None:
        """Return once a job that took *item* is over.

        :raises Exception: what the job raised, if it raised.
        """
        mine = _Gathered(item)
        self._waiting.append(mine)
        cancelled: BaseException | None = None
        if self._running:
            cancelled = await mine.wait()
        led = not mine.finished  # the first, or asked to lead
        if led:
            self._running = True
            held = await _let_ready_tasks_run()
            cancelled = cancelled or held
            group, self._waiting = self._waiting, []
            self.jobs += 1
            error: Exception | None = None
            try:
                await run_in_worker_shielded(partial(self._run, [each.item for each in group]))
            except asyncio.CancelledError as exc:  # natively, with the job over
                cancelled = exc
            except Exception as exc:
                error = exc
            finally:
                for each in group:
                    each.finished = True
                    each.error = error
                    if each is not mine:
                        each.wake()
                if self._waiting:
                    successor = self._waiting[0]
                    successor.lead = True
                    successor.wake()
                else:
                    self._running = False
        if cancelled is not None:
            raise cancelled
        if mine.error is not None:
            if led:
                raise mine.error
            raise copy.copy(mine.error) from mine.error  # an exception of this task's own


GATHERING_ROUNDS: Final = 4
"""At most this many scheduler rounds a job's leader lets pass before the job, on asyncio,
while other tasks are ready to run."""


async def _let_ready_tasks_run() -> BaseException | None:
    """On asyncio, let the tasks that are ready run first, for at most
    :data:`GATHERING_ROUNDS` scheduler rounds; return the native cancellation met meanwhile.

    The tasks that the last job woke are ready together, and each reaches its next flush a
    round or two later: without these rounds the first of them would run a job for its batch
    alone, and the others would wait for it. The caller counts as running a job meanwhile, so
    those tasks queue behind it. Trio does not tell whether tasks of its current batch are still
    to run (:func:`loop_is_idle`), so there the job starts at once.
    """
    if _asyncio_loop() is None:
        return None
    cancelled: BaseException | None = None
    for _ in range(GATHERING_ROUNDS):
        if loop_is_idle():
            break
        try:
            await anyio.lowlevel.cancel_shielded_checkpoint()
        except asyncio.CancelledError as exc:  # natively: raised once the job is over
            cancelled = exc
    return cancelled


def _asyncio_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # not asyncio
        return None


def _trio_token() -> TrioToken | None:
    try:
        import trio
    except ImportError:
        return None
    try:
        return trio.lowlevel.current_trio_token()
    except RuntimeError:  # not trio either
        return None


_workers: Final = _Workers()
run_in_worker: Final = _workers.run
"""Call a blocking function in a worker thread; return (or raise) what it did once it is over."""
run_in_worker_shielded: Final = _workers.run_shielded
""":data:`run_in_worker` for a caller shielded from anyio's cancellation already."""
