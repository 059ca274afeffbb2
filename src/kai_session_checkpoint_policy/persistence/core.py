"""What every persistence backend does the same way: queues, windows, flush barriers, cursors.

Each appended event is queued for its session (the event is immutable, so the queue holds the
event itself). A batch is written at the latest when the session's *window* expires: the window
opens with the first event queued after the previous batch was taken and is never extended by
later events. :meth:`WriteBehind.flush` is a barrier: it drains everything queued, including
events queued while it runs, and returns once all of it is durable. Concurrent flushes of one
session share one barrier, so a burst of tool checkpoints costs one durable write.

Every batch is checked against the durable cursor (the number of events the store holds)
before it is written: a gap or a repeat is refused, never written. A batch whose write failed
goes back to the head of the queue for the next flush. A write handed to a worker thread is
waited out whatever cancels its caller (:mod:`.workers`), so a batch and its session's lane
never change hands while a thread still works on them.

A backend subclasses :class:`WriteBehind` and says how a batch becomes durable and how a log is
read: :meth:`~WriteBehind._ready` (get the session's handle ready for a write: open it, lock or
lease it, learn its durable count), :meth:`~WriteBehind._append` (make one batch durable, all
or nothing), :meth:`~WriteBehind._release` (let go of the handle), and
:meth:`~WriteBehind._recover` (read a stored log and make its repair durable). Loading applies
the same repair on every backend (:func:`~.repair.interrupted_turn_closers`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, Protocol, TypeVar

import anyio
import anyio.lowlevel

from ..cancellation import checkpoint_if_cancelled
from ..contract import SessionExistsError
from ..events import MAX_TIME, time_problem
from ..hookspecs import hookimpl
from ..meta import SessionMeta
from .errors import EventTimeError, LiveSessionError, SeedMismatchError, SeqMismatchError
from .ids import check_session_id
from .repair import interrupted_turn_closers
from .values import PersistenceStatistics, SessionHeader, StoredLog
from .workers import (
    Gathering,
    idle_needs_a_round,
    loop_is_idle,
    run_in_worker,
    run_in_worker_shielded,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from anyio.abc import TaskGroup

    from ..contract import PluginHost, SessionLogLike
    from ..events import SessionEvent
    from ..hookspecs import FlushThunk
    from .observer import PersistenceObserver

__all__ = [
    "DEFAULT_BATCH_WINDOW",
    "MAX_RETRY_DELAY",
    "BatchWindow",
    "GroupWrite",
    "LogHandle",
    "Outcome",
    "PersistenceStatistics",
    "StoredLog",
    "WriteBehind",
    "Writer",
    "check_batch",
    "check_seed",
]

logger = logging.getLogger(__name__)

DEFAULT_BATCH_WINDOW: Final = 0.2
"""Seconds an admitted event may wait before a background batch writes it."""
MAX_RETRY_DELAY: Final = 30.0
"""The most seconds a failed background write waits before it is tried again."""


class LogHandle(Protocol):
    """A backend's state for writing one session: at least the durable cursor."""

    count: int
    """Durable events: the seq the next event must have."""


H = TypeVar("H", bound=LogHandle)


@dataclass(frozen=True, slots=True)
class _WholeLog:
    """A session known by its id and events alone: a log written whole
    (:meth:`WriteBehind.write_log`)."""

    id: str
    events: Sequence[SessionEvent]


class _Barrier:
    """One flush in progress that later flushes of the same session join."""

    __slots__ = ("_done", "drained", "error", "over")

    def __init__(self) -> None:
        self.error: Exception | None = None
        self.drained = False  # whether its leader saw the queue empty
        self.over = False  # whether its leader is done
        self._done: anyio.Event | None = None  # made for the first flush that joins it

    async def wait(self) -> None:
        """Wait until the leader is done (a cancel point even if it is)."""
        done = self._done
        if done is None:
            done = self._done = anyio.Event()
            if self.over:
                done.set()
        await done.wait()

    def end(self) -> None:
        """Mark the leader done, and wake the flushes that joined."""
        self.over = True
        if self._done is not None:
            self._done.set()


def _current_time() -> float:
    """The event loop's clock, as :func:`anyio.current_time` tells it, without looking up the
    loop's anyio backend on asyncio (where it is the loop's own ``time()``): a window opens
    with the first event after each flush."""
    loop = asyncio._get_running_loop()  # None off asyncio: no exception to raise
    return anyio.current_time() if loop is None else loop.time()


class Outcome:
    """Whether a batch handed off the event loop's thread was made durable: set by the thread
    that wrote it, read once the write is over (even by a caller cancelled meanwhile)."""

    __slots__ = ("written",)

    def __init__(self) -> None:
        self.written = False


class GroupWrite(Generic[H]):
    """One session's batch handed off the event loop's thread, to be written in one worker
    job with the batches of other sessions (a :class:`~.workers.Gathering`'s item); the job
    keeps what became of it."""

    __slots__ = ("batch", "error", "outcome", "writer")

    def __init__(self, writer: Writer[H], batch: Sequence[SessionEvent], outcome: Outcome) -> None:
        self.writer = writer
        self.batch = batch
        self.outcome = outcome
        self.error: Exception | None = None

    async def submit(self, gathering: Gathering[Any]) -> None:
        """Hand this write to *gathering*; return once its job is over.

        :raises Exception: what made the batch fail (:attr:`error`), or the job itself.
        """
        await gathering.submit(self)
        if self.error is not None:
            raise self.error

    def written(self, log: H) -> None:
        """Count the batch durable in *log*, the writer's handle."""
        log.count += len(self.batch)
        self.outcome.written = True


class BatchWindow:
    """When a session's queued events are written at the latest: its window, and its timer.

    A window opens with the first event queued after a batch was taken, and expires
    :attr:`WriteBehind.batch_window` seconds later, never extended by later events. One timer
    task per session serves its windows one after another.
    """

    __slots__ = ("deadline", "failures", "is_open", "number", "timer")

    def __init__(self) -> None:
        self.failures = 0  # background writes failed in a row
        self.number = 0  # counts windows, so the timer can tell whether its window is still open
        self.is_open = False
        self.deadline = 0.0  # when the open window expires
        self.timer: anyio.CancelScope | None = None  # of the task waiting for window deadlines

    def open(self, seconds: float) -> None:
        """Open a new window, expiring *seconds* from now."""
        self.number += 1
        self.is_open = True
        self.deadline = _current_time() + seconds

    def close(self) -> None:
        """Close the open window: its events are being written."""
        self.is_open = False


class Writer(Generic[H]):
    """The queue of one session, its single writing lane, and the backend's handle for it."""

    __slots__ = (
        "barrier",
        "header",
        "lane",
        "log",
        "pending",
        "seed",
        "session",
        "session_id",
        "window",
        "write_seconds",
    )

    def __init__(self, session: SessionLogLike, header: SessionHeader | None = None) -> None:
        self.session = session
        self.session_id = session.id
        # The header a new log gets: from the session's metadata, else (a host that has none)
        # made of the first event's time.
        self.header = header
        # The events the session was created with, and how many, while they are not known to
        # be stored: a fork's seed, or a stored log the host passed back as a seed.
        self.seed: tuple[Sequence[SessionEvent], int] | None = None
        self.pending: list[SessionEvent] = []
        self.window = BatchWindow()
        self.barrier: _Barrier | None = None
        # At most one write per session at a time; taken at once when free, without the
        # scheduler round a plain anyio.Lock makes.
        self.lane = anyio.Lock(fast_acquire=True)
        self.log: H | None = None
        self.write_seconds = 0.0  # the slowest recent write, losing an eighth per later write

    def wrote_in(self, seconds: float) -> None:
        """Count a write that took *seconds* in :attr:`write_seconds`."""
        self.write_seconds = max(seconds, self.write_seconds * 0.875)

    @property
    def durable_count(self) -> int:
        """How many of the session's events are known to be durable."""
        return 0 if self.log is None else self.log.count

    @property
    def busy(self) -> bool:
        """Whether a write or a flush of the session is under way."""
        return self.lane.locked() or self.barrier is not None

    def window_is(self, number: int) -> bool:
        """Whether window *number* is the open one, and no flush is draining the queue."""
        window = self.window
        return window.number == number and window.is_open and self.barrier is None


async def _nothing_to_flush() -> None:
    """The flush of a session with nothing admitted: there is nothing to make durable."""


def check_seed(
    session_id: str, seed: Sequence[SessionEvent], stored: Sequence[SessionEvent], where: str
) -> None:
    """Refuse a live session whose *seed* is not the log *stored* for its id, or a prefix of
    it extended by the seed: the first differing seq is named.

    :raises SeedMismatchError: if they differ.
    """
    for seq, (ours, theirs) in enumerate(zip(seed, stored, strict=False)):
        if ours.encode() != theirs.encode():
            raise SeedMismatchError(
                f"session {session_id!r}: its seed differs from the log stored at {where} at "
                f"seq {seq}: the seed has {ours.type!r} where the log has {theirs.type!r}; "
                "nothing was written",
                seq,
            )
    if len(stored) > len(seed):
        raise SeedMismatchError(
            f"session {session_id!r}: its seed ends at seq {len(seed)}, but the log stored at "
            f"{where} goes on to seq {len(stored) - 1} ({stored[len(seed)].type!r} at seq "
            f"{len(seed)}); nothing was written",
            len(seed),
        )


def header_of(session: SessionLogLike) -> SessionHeader | None:
    """The header of a new log of *session*, from its metadata (``session.meta``), if it has
    any."""
    meta = getattr(session, "meta", None)
    if not isinstance(meta, SessionMeta):
        return None
    if meta.created_at is None:  # the first event's time: known when it is written
        return None
    return SessionHeader.of(session.id, meta, meta.created_at)


def check_batch(session_id: str, count: int, batch: Sequence[SessionEvent], where: str) -> None:
    """Refuse a batch that does not continue a log of *count* events exactly.

    :raises SessionExistsError: if a new session's first batch meets a log another writer
        created meanwhile.
    :raises SeqMismatchError: naming the first seq that is not the one expected.
    :raises EventTimeError: naming an event whose time no log can hold (nothing is written).
    """
    if count and batch[0].seq == 0:
        raise SessionExistsError(
            f"session {session_id!r} already has a log of {count} events at {where}; a new "
            f"session cannot write over it: continue it with "
            f"'await host.sessions.resume({session_id!r})'"
        )
    for index, event in enumerate(batch):
        if event.seq != count + index:
            raise SeqMismatchError(
                f"session {session_id!r}: refusing to write seq {event.seq} at position "
                f"{index} of a batch; the stored log holds {count} events, so seq "
                f"{count + index} was expected"
            )
        time = event.time
        if type(time) is not int or not 0 <= time <= MAX_TIME:  # no log could be read back
            raise EventTimeError(
                f"session {session_id!r}: refusing to write seq {event.seq}: {time_problem(time)}"
            )


class WriteBehind(ABC, Generic[H]):
    """The plugin half of a persistence backend: admit events, write batches, answer flushes.

    :param batch_window: Seconds an event may wait before a background batch writes it.
    """

    name: str
    durable_unit: ClassVar[str] = "batches"
    """What makes one batch durable, in the plural, as observers name it (``fsyncs``)."""
    observer: PersistenceObserver | None = None
    """Hears of every batch written, recovery and lease (:mod:`.observer`); ``None`` by
    default, when the write path does nothing for it."""

    def __init__(self, *, batch_window: float = DEFAULT_BATCH_WINDOW) -> None:
        self.batch_window: Final = float(batch_window)
        self._writers: dict[str, Writer[H]] = {}
        self._task_group: TaskGroup | None = None
        self._batches = 0
        self._created: dict[str, SessionHeader] = {}  # created here, not yet written
        self._rounds = 0  # flushes in a scheduler round before they write (_round)

    # -- plugin hooks ---------------------------------------------------------------------------

    @hookimpl
    def host_configure(self, host: PluginHost[Any]) -> None:
        host.provide_session_persistence(self)
        self._task_group = host.task_group
        host.add_cleanup(self.aclose)

    @hookimpl
    def host_unconfigure(self, host: PluginHost[Any]) -> None:
        host.withdraw_session_persistence(self)

    @hookimpl
    def session_attach(self, session: SessionLogLike) -> None:
        """Know *session* as live: a load never repairs its log, even before it appends.

        This is the original harness's ``session/created``: the session's metadata is kept
        for its log's header, and the events it was created with (a seed) are to be stored
        once, before its own. Hearing of the same session again changes nothing.
        """
        writer = self._writers.get(session.id)
        if writer is None:
            writer = self._writers[session.id] = Writer(session)
        elif writer.session is session:
            return  # announced again: initialized already
        else:
            writer.session = session  # a session live again under the same id goes on
            if writer.pending or writer.busy or writer.log is not None:
                return
        created = self._created.pop(session.id, None)
        writer.header = created if created is not None else header_of(session)
        events = session.events
        first: object = getattr(session, "first_live_seq", None)
        count = first if type(first) is int and 0 <= first <= len(events) else len(events)
        if count and not getattr(session, "seed_stored", False):
            writer.seed = (events, count)
            self._open_window(writer)  # the seed is written in the background, as events are

    @hookimpl
    def session_event(self, session: SessionLogLike, event: SessionEvent) -> None:
        writer = self._writers.get(session.id)
        if writer is None:
            writer = self._writers[session.id] = Writer(session)
        writer.session = session  # a session resumed under the same id continues the same log
        writer.pending.append(event)
        if not writer.window.is_open and writer.barrier is None:
            self._open_window(writer)

    @hookimpl
    def session_detach(self, session: SessionLogLike) -> None:
        """Release what the session holds here once what it admitted is written.

        A session with nothing queued and no write in flight is released at once (after
        ``sessions.close()``, always); otherwise its queue is written in the background first.
        A session whose last events cannot be written keeps its writer, so that closing the
        backend tries again and reports the failure.
        """
        writer = self._writers.get(session.id)
        if writer is None or writer.session is not session:
            return
        if not (writer.pending or writer.busy or writer.seed is not None):
            self._forget(writer)
        elif self._task_group is not None:  # else the backend is closing, and drains it
            self._task_group.start_soon(self._retire, writer, session)

    @hookimpl
    def session_flush(self, session: SessionLogLike) -> FlushThunk | None:
        """Take part in every flush of a live session, as the original harness's backends do
        (so ``host.sessions.flush`` reports success): with nothing admitted, everything is
        durable already, and the thunk returns at once."""
        writer = self._writers.get(session.id)
        if writer is None or not (
            writer.pending or writer.log is not None or writer.busy or writer.seed is not None
        ):
            return _nothing_to_flush  # known live, and nothing admitted: durable already
        return lambda: self._flush(writer)

    # -- what the backend provides ----------------------------------------------------------------

    @abstractmethod
    def session_exists(self, session_id: str) -> bool:
        """Whether the backend holds a log for *session_id*; answers at once."""

    @abstractmethod
    async def inspect(self, session_id: str) -> StoredLog:
        """Read a stored log and the repair recovery would add, changing nothing."""

    @abstractmethod
    def _ready(
        self, session_id: str, log: H | None, expected: int, header: SessionHeader | None
    ) -> H:
        """Get the session's handle ready for a write (blocking): its durable count known.

        *expected* is how many events the live session holds before the batch to be written;
        *header* is the header a log created now gets (``None``: one made of the first
        event's time).
        """

    @abstractmethod
    def _append(self, log: H, session_id: str, batch: Sequence[SessionEvent]) -> None:
        """Make *batch* durable after what *log* holds, all or nothing (blocking)."""

    @abstractmethod
    def _release(self, log: H) -> None:
        """Let go of a handle: nothing is being written with it (quick; on the loop's thread)."""

    @abstractmethod
    def _recover(self, session_id: str) -> StoredLog:
        """Read a stored log and make its repair durable (blocking)."""

    @abstractmethod
    def _location(self, log: H) -> str:
        """Where *log* is stored, for messages."""

    def _may_write_inline(self, writer: Writer[H]) -> bool:
        """Whether an awaited write of *writer* may block the event loop's thread, when no other
        task is ready to run (never, unless the backend says so)."""
        return False

    async def _make_room(self, writer: Writer[H]) -> None:
        """Wait until *writer* may open what a write in a worker thread needs (on the loop's
        thread, before :meth:`_before_write`); by default at once."""

    def _before_write(self, writer: Writer[H]) -> None:
        """Called on the loop's thread before a batch of *writer* is written."""

    def _after_write(self, writer: Writer[H]) -> None:
        """Called on the loop's thread after a write of *writer*, whether it succeeded or not."""

    async def create(self, session_id: str, meta: SessionMeta | None = None) -> SessionHeader:
        """Create the session *session_id*: its header is kept, its durable cursor is 0, and
        nothing is written until its first events are (by the live session that takes the id,
        or by :meth:`write_log`), so that it is not listed until then.

        :param meta: The creation metadata; the creation time is now unless it gives one.
        :return: The header its log will have.
        :raises SessionExistsError: if the id has a stored log, or was created here already,
            or is live here.
        """
        check_session_id(session_id)
        meta = SessionMeta() if meta is None else meta
        if not isinstance(meta, SessionMeta):
            raise TypeError(f"meta must be a SessionMeta, not {meta!r}")
        if session_id in self._created or session_id in self._writers:
            raise SessionExistsError(f"session {session_id!r} already exists in {self.name}")
        if await run_in_worker(partial(self.session_exists, session_id)):
            raise SessionExistsError(
                f"session {session_id!r} already has a log in {self.name}: continue it with "
                f"'await host.sessions.resume({session_id!r})'"
            )
        header = SessionHeader.of(session_id, meta, time.time_ns() // 1_000_000)
        self._created[session_id] = header
        return header

    def _stored_size(self, writer: Writer[H]) -> int | None:
        """How many bytes *writer*'s stored log holds, if the backend knows (for observers)."""
        return None

    # -- flushing -------------------------------------------------------------------------------

    async def flush(self, session_id: str) -> None:
        """Make every event admitted for *session_id* durable (nothing to do if none were); a
        cancel point on every path."""
        writer = self._writers.get(session_id)
        if writer is not None:
            await self._flush(writer)
        await checkpoint_if_cancelled()

    def durable_count(self, session_id: str) -> int:
        """How many events of the live session *session_id* are known to be durable."""
        writer = self._writers.get(session_id)
        return 0 if writer is None else writer.durable_count

    def statistics(self) -> PersistenceStatistics:
        return PersistenceStatistics(
            sessions=len(self._writers),
            pending_events=sum(len(writer.pending) for writer in self._writers.values()),
            batches=self._batches,
        )

    async def aclose(self) -> None:
        """Drain every queue, then release every handle; the first drain failure is raised.

        No window timer starts once closing has begun, and events admitted while the queues
        drain are drained too. Each handle is released only when no write with it is in
        flight.
        """
        self._task_group = None
        failures: dict[str, Exception] = {}
        while draining := [
            writer
            for writer in self._writers.values()
            if (writer.pending or writer.lane.locked() or writer.seed is not None)
            and writer.session_id not in failures
        ]:
            for writer in draining:
                try:
                    await self._flush(writer)
                except Exception as exc:
                    failures[writer.session_id] = exc
        for writer in list(self._writers.values()):
            async with writer.lane:
                if writer.log is not None:
                    self._release(writer.log)
                    writer.log = None
        self._writers.clear()
        if failures:
            raise next(iter(failures.values()))

    async def _retire(self, writer: Writer[H], session: SessionLogLike) -> None:
        try:
            await self._flush(writer)
        except Exception:
            logger.exception(
                "session %r was detached, and its last events could not be written; "
                "closing the backend tries again",
                writer.session_id,
            )
            return
        async with writer.lane:
            # Unless the id became live again meanwhile, with a new session that goes on.
            if writer.session is session and not (writer.pending or writer.seed is not None):
                self._forget(writer)

    def _forget(self, writer: Writer[H]) -> None:
        """Drop a drained writer, releasing its handle."""
        if self._writers.get(writer.session_id) is writer:
            del self._writers[writer.session_id]
        if writer.log is not None:
            self._release(writer.log)
            writer.log = None
        if writer.window.timer is not None:
            writer.window.timer.cancel()  # its task holds the writer, and the writer the session

    def _open_window(self, writer: Writer[H], seconds: float | None = None) -> None:
        """Open a window for *writer*'s queue, started now and lasting *seconds* (the batch
        window by default); a timer task writes it at its end.

        Nothing opens once the backend is closing (or before a host opened it).
        """
        if self._task_group is None:
            return
        window = writer.window
        window.open(self.batch_window if seconds is None else seconds)
        if window.timer is None:
            window.timer = anyio.CancelScope()
            self._task_group.start_soon(self._window_timer, writer, window.timer)

    async def _flush(self, writer: Writer[H]) -> None:
        """Drain *writer*'s queue, or join the drain in progress.

        A cancellation met on the way is raised once what was written is durable; one that
        was pending when nothing needed to wait is not looked for here: the host's
        ``sessions.flush`` ends with a cancel point on every path, and so does :meth:`flush`.
        """
        settled = False  # whether this is just back from a scheduler round (loop_is_idle)
        while True:
            while (barrier := writer.barrier) is not None:
                await barrier.wait()
                if barrier.error is not None:
                    raise barrier.error
                if barrier.drained:
                    return
                # Its leader was cancelled before the queue was empty: lead the next drain.
            if writer.lane.locked() or writer.seed is not None:
                break
            if writer.pending and self._may_write_inline(writer):
                if self._loop_is_idle(settled=settled):
                    # No other task can run before this returns: no barrier to share, no
                    # await to shield. Nor a scheduler round after it (which costs a sixth of
                    # a small flush): what became ready meanwhile runs at the caller's next
                    # await.
                    self._write_now(writer)
                elif not settled and idle_needs_a_round():
                    # Trio: one round lets every task ready now run first (those appending to
                    # this session too: the write then takes their events as well), and then
                    # tells whether any other is ready. Not a cancel point: a cancellation is
                    # raised at the end, as after a write.
                    await self._round(shielded=False)
                    settled = True
                    continue
            if not writer.pending:
                return
            break
        await self._drain(writer)

    async def _round(self, *, shielded: bool) -> None:
        """One scheduler round, counted while it lasts, which anyio's cancellation does not
        interrupt: a *shielded* caller's shield covers it; otherwise it makes its own."""
        self._rounds += 1
        try:
            if shielded:
                await anyio.lowlevel.checkpoint()
            else:
                await anyio.lowlevel.cancel_shielded_checkpoint()
        finally:
            self._rounds -= 1

    def _loop_is_idle(self, *, settled: bool) -> bool:
        """Whether no other task is ready to run (:func:`.workers.loop_is_idle`), nor still in
        a round of its own flush here: on trio, flushes released together share the
        scheduler's batch, where it does not see them."""
        return loop_is_idle(settled=settled) and not (settled and self._rounds)

    async def _drain(self, writer: Writer[H]) -> None:
        """Write batches until the queue is empty, as the leader of a new barrier.

        The barrier is *drained* only if this saw the queue empty; a leader cancelled before
        that (natively: anyio's cancellation cannot reach into the shield) leaves it undrained,
        and its joiners drain on.
        """
        barrier = writer.barrier = _Barrier()
        writer.window.close()
        try:
            with anyio.CancelScope(shield=True):
                await writer.lane.acquire()
                try:
                    await self._round(shielded=True)  # checkpoints ready now join this batch
                    while writer.pending or writer.seed is not None:
                        inline = (
                            writer.seed is None
                            and self._loop_is_idle(settled=True)  # back from a round, or a write
                            and self._may_write_inline(writer)
                        )
                        await self._write_pending(writer, inline=inline)
                    barrier.drained = True
                    writer.barrier = None  # in the same step that saw the queue empty
                finally:
                    writer.lane.release()
        except Exception as exc:
            barrier.error = exc
            raise
        finally:
            if writer.barrier is barrier:
                writer.barrier = None
            barrier.end()

    async def _window_timer(self, writer: Writer[H], scope: anyio.CancelScope) -> None:
        """Write each window's batch when the window expires, one window after another.

        One task serves the windows of a writer in turn: if the window it waits for was closed
        (by a flush) and a new one opened meanwhile, it waits on for the new one's deadline, so
        a session that flushes every few events does not start a task for every window. Found
        with no window open, it ends only if none opened since it last looked: a session that
        is busy flushing keeps its task (one wake-up a window) rather than starting one for
        every window the timer finds already flushed. The task ends early (*scope* cancelled)
        when its session is released.
        """
        window = writer.window
        number, deadline = window.number, window.deadline
        try:
            with scope:
                while True:
                    # Sleep even if a flush already took the window: a task that exited at
                    # once would be started again by the next event, for every flush.
                    await anyio.sleep_until(deadline)
                    if writer.window_is(number):
                        async with writer.lane:
                            if writer.window_is(number):  # no flush took it meanwhile
                                await self._write_in_background(writer)
                    if window.is_open:
                        number, deadline = window.number, window.deadline
                    elif window.number != number:  # opened and flushed since: look again later
                        number, deadline = window.number, _current_time() + self.batch_window
                    else:
                        return
        finally:
            if window.timer is scope:
                window.timer = None

    async def _write_in_background(self, writer: Writer[H]) -> None:
        """Write the window's batch; after a failure, try again later and later.

        The first failure is logged with its traceback; the retries wait twice as long each
        time, up to :data:`MAX_RETRY_DELAY`, and are logged once more only when one succeeds
        (a flush still tries at once, and fails closed, in the meantime).
        """
        try:
            with anyio.CancelScope(shield=True):
                await self._write_pending(writer, inline=False)
        except Exception:
            window = writer.window
            window.failures += 1
            delay = min(
                self.batch_window * 2**window.failures, max(MAX_RETRY_DELAY, self.batch_window)
            )
            if window.failures == 1:
                logger.exception(
                    "background write of session %r failed; the batch stays queued, and is "
                    "tried again in %.3g s, then less and less often",
                    writer.session_id,
                    delay,
                )
            self._open_window(writer, delay)

    async def _write_pending(self, writer: Writer[H], *, inline: bool) -> None:
        """Write the whole queue as one batch, *inline* on this thread or in a worker thread.

        The caller holds the lane, shielded, unless *inline* (then this never suspends). The
        batch goes back to the head of the queue only if its write failed: a worker's write is
        waited out even when the caller is cancelled meanwhile, and the cancellation is raised
        after it, with the batch durable.
        """
        if inline:
            self._write_now(writer)
            return
        if writer.seed is not None:
            await self._settle_seed(writer)
            if not writer.pending:
                return
        await self._make_room(writer)  # may wait: the caller holds the lane, shielded
        observed = self._observe_start(writer)
        batch, writer.pending = writer.pending, []
        writer.window.is_open = False
        self._before_write(writer)
        outcome = Outcome()
        failure: Exception | None = None
        try:
            await self._write_off_loop(writer, batch, outcome)
        except Exception as exc:
            failure = exc
            raise
        finally:
            # A cancellation met meanwhile is raised after the write, the batch durable.
            if outcome.written:
                self._written(writer)
            else:
                writer.pending[:0] = batch
                self._after_write(writer)
            if observed is not None:
                self._observe_end(writer, observed, len(batch), failure)

    async def _write_off_loop(
        self, writer: Writer[H], batch: list[SessionEvent], outcome: Outcome
    ) -> None:
        """Make *batch* of *writer* durable off the event loop's thread (:meth:`_write_batch` in
        a worker thread, by default), and set *outcome* once it is.

        Returns or raises only once the write is over, whatever cancels the caller meanwhile:
        the caller holds the lane, shielded from anyio's cancellation, and a native
        cancellation is raised afterwards (with *outcome* telling whether the batch is durable).
        """

        def write() -> None:
            self._write_batch(writer, batch)
            outcome.written = True

        await run_in_worker_shielded(write)

    def _write_now(self, writer: Writer[H]) -> None:
        """Write the whole queue as one batch on this thread (blocking: no other task runs)."""
        observed = self._observe_start(writer)
        batch, writer.pending = writer.pending, []
        writer.window.is_open = False
        self._before_write(writer)
        try:
            self._write_batch(writer, batch)
        except BaseException as exc:
            writer.pending[:0] = batch
            self._after_write(writer)
            if observed is not None:
                failure = exc if isinstance(exc, Exception) else None
                self._observe_end(writer, observed, len(batch), failure)
            raise
        self._written(writer)
        if observed is not None:
            self._observe_end(writer, observed, len(batch), None)

    def _written(self, writer: Writer[H]) -> None:
        """Count a batch of *writer* written, and end its write."""
        self._batches += 1
        if writer.window.failures:
            logger.warning(
                "session %r written again after %d failed background writes",
                writer.session_id,
                writer.window.failures,
            )
            writer.window.failures = 0
        self._after_write(writer)

    def _observe_start(self, writer: Writer[H]) -> tuple[float, int | None] | None:
        """When a batch's write starts and the stored size then, if an observer listens."""
        if self.observer is None:
            return None
        size = self._stored_size(writer)
        if size is None and writer.log is None and writer.pending[0].seq == 0:
            size = 0  # a new session's log, not opened yet, holds nothing
        return time.perf_counter(), size

    def _observe_end(
        self,
        writer: Writer[H],
        started: tuple[float, int | None],
        count: int,
        failure: Exception | None,
    ) -> None:
        """Tell the observer (if one still listens) of a batch's write that ended."""
        observer = self.observer
        if observer is None:
            return
        start, size = started
        grown = self._stored_size(writer)
        observer.batch_written(
            self,
            writer.session_id,
            count,
            None if grown is None or size is None else grown - size,
            time.perf_counter() - start,
            failure,
        )

    async def _settle_seed(self, writer: Writer[H]) -> None:
        """Queue what the store lacks of *writer*'s seed, ahead of its events.

        The seed of a session whose id has no log is queued whole (a fork's seed, and its
        ``session/end-seed``); a seed of a stored session must be that log (or the log a
        prefix of it), and only what follows the stored events is queued.

        :raises SeedMismatchError: if the seed differs from the stored log; it stays
            unsettled, so every later flush fails alike, and nothing is written.
        """
        assert writer.seed is not None
        events, count = writer.seed
        stored = 0
        if await run_in_worker(partial(self.session_exists, writer.session_id)):
            log = await self.inspect(writer.session_id)
            seed = events[:count]
            check_seed(writer.session_id, seed, log.events, log.location)
            stored = len(log.events)
        writer.pending[:0] = events[stored:count]
        writer.seed = None

    def _write_batch(self, writer: Writer[H], batch: Sequence[SessionEvent]) -> None:
        """Check *batch* against the durable cursor and make it durable (blocking).

        Keeps the duration of the slowest recent write, for :meth:`_may_write_inline`.
        """
        start = time.perf_counter()
        try:
            log = self._ready_for(writer, batch)
            self._append(log, writer.session_id, batch)
            log.count += len(batch)
        finally:
            writer.wrote_in(time.perf_counter() - start)

    def _ready_for(self, writer: Writer[H], batch: Sequence[SessionEvent]) -> H:
        """*writer*'s handle, made ready for *batch* (:meth:`_ready`), once the batch is
        checked against its durable cursor (blocking).

        :raises SeqMismatchError: and what :func:`check_batch` and :meth:`_ready` raise.
        """
        log = writer.log = self._ready(writer.session_id, writer.log, batch[0].seq, writer.header)
        check_batch(writer.session_id, log.count, batch, self._location(log))
        return log

    async def write_log(
        self,
        session_id: str,
        events: Sequence[SessionEvent],
        header: SessionHeader | None = None,
    ) -> None:
        """Store *events*, a whole log from seq 0, as the new session *session_id*: all of it,
        or nothing.

        The backend's own write path: its lock or lease, the seq check (which refuses a log
        stored meanwhile), one durable batch; then the handle is let go. A write started is
        finished, whatever cancels the caller meanwhile.

        :raises SessionExistsError: if the store holds the session already.
        :raises LiveSessionError: if the session is live here.
        """
        if session_id in self._writers:
            raise LiveSessionError(f"cannot write session {session_id!r} whole: it is live here")
        if header is None:
            header = self._created.get(session_id)
        writer: Writer[H] = Writer(_WholeLog(session_id, events), header)
        try:
            await run_in_worker(partial(self._write_batch, writer, events))
            self._created.pop(session_id, None)
        finally:
            if writer.log is not None:
                self._release(writer.log)

    # -- loading ----------------------------------------------------------------------------------

    async def load(self, session_id: str) -> StoredLog:
        """Read a log with recovery: the repair it needs is durable before this returns.

        A session that is live here is returned as it is, once flushed, if its turn is closed.

        :raises LiveSessionError: if the session is live here and its turn is still open.
        """
        writer = self._writers.get(session_id)
        if writer is not None:
            events = writer.session.events
            if interrupted_turn_closers(events):
                raise LiveSessionError(
                    f"cannot load session {session_id!r} while its live turn is open"
                )
            await self._flush(writer)
            if self._writers.get(session_id) is writer:  # still live here
                log = writer.log
                if log is not None:
                    # Copies: a reader changing what it loaded changes neither the live
                    # session nor what it will write.
                    header = writer.header or SessionHeader(session_id, events[0].time)
                    # Made for the copy and not kept: the live log's older events stay in
                    # its compact form (a session's events have ``fresh``).
                    fresh = getattr(events, "fresh", None)
                    source = events if fresh is None else fresh(range(len(events)))
                    loaded = tuple(event.copy() for event in source)
                    return StoredLog(header, loaded, (), 0, self._location(log))
                # Live, and nothing written here yet: its log is what is stored, and a log
                # under a live session is never repaired (the session goes on from it).
                stored = await self.inspect(session_id)
                if stored.repair:
                    raise LiveSessionError(
                        f"cannot load session {session_id!r}: it is live here, and its stored "
                        "log ends inside a turn that recovery would close"
                    )
                return stored
            # Detached while it was flushed: all it admitted is durable, and it is not live.
        # The repair is written once started, whatever cancels the caller meanwhile.
        observer = self.observer
        if observer is None:
            return await run_in_worker(partial(self._recover, session_id))
        started = time.time_ns()
        try:
            stored = await run_in_worker(partial(self._recover, session_id))
        except Exception as exc:
            observer.recovered(self, session_id, None, started, exc)
            raise
        observer.recovered(self, session_id, stored, started, None)
        return stored
