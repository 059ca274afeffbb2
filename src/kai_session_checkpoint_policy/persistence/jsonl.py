"""The JSONL persistence backend: bounded background batches and group-commit flushes.

Each appended event is queued for its session (the event is immutable, so the queue holds the
event itself). A batch is written at the latest when the session's *window* expires: the window
opens with the first event queued after the previous batch was taken and is never extended by
later events. :meth:`JsonlSessionPersistence.flush` is a barrier: it drains everything queued,
including events queued while it runs, and returns once all of it is written and fsynced.
Concurrent flushes of one session share one barrier, so a burst of tool checkpoints costs one
write and one fsync.

Every batch is checked against the durable cursor (the number of events on disk) before it is
written: a gap or a repeat is refused, never written. A failed write or fsync truncates the
partial bytes away and keeps the batch queued for the next flush; after a failure the file is
reopened and re-read before the next write, so a failed fsync is never taken for success.

Where a write runs: a background batch always runs in a worker thread, since nobody waits for
it (a failed one is tried again in the next window). A flush that a caller awaits appends on
the event loop's own thread (never creates or re-reads a log there) when no other task is ready
to run (which only asyncio tells; on trio, writes always go to worker threads)
and the session's recent writes took less than ``inline_write_limit`` (2 ms by default):
handing a call to a thread and waking the loop again when it returns costs about as much as a
fast fsync (100-200 µs on a virtual machine), while a loop with nothing else to run loses
nothing by waiting for the disk itself. Otherwise the write runs in a worker thread, and the
tasks that are ready, or checkpoints that arrive meanwhile, run (and join the next batch) while
it is in flight.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio
import anyio.lowlevel
import anyio.to_thread

from ..hookspecs import hookimpl
from .errors import (
    InvalidSessionIdError,
    LiveSessionError,
    PersistenceError,
    RollbackError,
    SeqMismatchError,
    SessionLockedError,
    SessionNotFoundError,
)
from .files import LockedError, OsFiles
from .format import (
    LOCK_NAME,
    LOG_NAME,
    SessionHeader,
    decode_session_id,
    encode_events,
    encode_header,
    encode_session_id,
    scan_log,
)
from .repair import interrupted_turn_closers
from .workers import loop_is_idle, run_in_worker

if TYPE_CHECKING:
    import os
    from collections.abc import Sequence

    from anyio.abc import TaskGroup

    from ..events import SessionEvent
    from ..hookspecs import FlushThunk
    from ..host import Host, Session
    from .format import Scan

__all__ = [
    "DEFAULT_BATCH_WINDOW",
    "DEFAULT_INLINE_WRITE_LIMIT",
    "JsonlSessionPersistence",
    "PersistenceStatistics",
    "StoredLog",
]

logger = logging.getLogger(__name__)

DEFAULT_BATCH_WINDOW: Final = 0.2
"""Seconds an admitted event may wait before a background batch writes it."""

DEFAULT_INLINE_WRITE_LIMIT: Final = 0.002
"""Seconds a session's recent writes may take for an awaited flush to write on the loop."""


@dataclass(frozen=True, slots=True)
class StoredLog:
    """A session log as stored, and the repair that closes its open turn.

    From :meth:`~JsonlSessionPersistence.inspect`, ``events`` are the stored events and
    ``repair`` the closers recovery *would* append. From :meth:`~JsonlSessionPersistence.load`,
    ``events`` already end with ``repair``, which that call appended.
    """

    header: SessionHeader
    events: tuple[SessionEvent, ...]
    repair: tuple[SessionEvent, ...]
    torn_bytes: int
    path: Path

    def __repr__(self) -> str:
        # Not every event: a long log would take longer to show than to load.
        return (
            f"StoredLog(header={self.header!r}, events=<{len(self.events)} events>, "
            f"repair=<{len(self.repair)} events>, torn_bytes={self.torn_bytes}, "
            f"path={self.path!r})"
        )


@dataclass(frozen=True, slots=True)
class PersistenceStatistics:
    """Counters of one backend since it was created."""

    sessions: int
    """Sessions with a writer (sessions that admitted events)."""
    pending_events: int
    """Events admitted and not yet durable."""
    batches: int
    """Batches made durable."""
    writes: int
    """``write`` system calls on logs and temporary files."""
    fsyncs: int
    """``fsync`` system calls on files."""
    directory_fsyncs: int
    """``fsync`` system calls on directories."""


class _Log:
    """The durable state of one session file. Touched only by the writer holding its lock."""

    __slots__ = ("count", "fd", "lock_fd", "path", "size", "suspect")

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path = path
        self.lock_fd = lock_fd
        self.fd: int | None = None  # None until the file exists
        self.size = 0  # committed bytes
        self.count = 0  # durable events: the seq the next event must have
        self.suspect = False  # a write failed: re-read the file before the next one


class _Barrier:
    """One flush in progress that later flushes of the same session join."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: Exception | None = None


class _Writer:
    """The queue of one session and its single writing lane."""

    __slots__ = (
        "barrier",
        "deadline",
        "lane",
        "log",
        "pending",
        "session",
        "session_id",
        "timer",
        "window",
        "window_open",
        "write_seconds",
    )

    def __init__(self, session: Session) -> None:
        self.session = session
        self.session_id = session.id
        self.pending: list[SessionEvent] = []
        self.window = 0  # counts windows, so the timer can tell whether its window is still open
        self.window_open = False
        self.deadline = 0.0  # when the open window expires
        self.timer = False  # whether a task is waiting for the window deadlines
        self.barrier: _Barrier | None = None
        # At most one write per session at a time; taken at once when free, without the
        # scheduler round a plain anyio.Lock makes.
        self.lane = anyio.Lock(fast_acquire=True)
        self.log: _Log | None = None
        self.write_seconds = 0.0  # the slowest recent write, losing an eighth per later write

    def window_is(self, window: int) -> bool:
        """Whether *window* is the open window, and no flush is draining the queue."""
        return self.window == window and self.window_open and self.barrier is None


class JsonlSessionPersistence:
    """Persist every live session of a host as a JSONL log under *root*.

    Register it on a :class:`~kai_session_checkpoint_policy.host.Host`: opening the host makes
    it the host's ``session_persistence``; closing the host drains every queue. Reading
    (:meth:`list_sessions`, :meth:`inspect`, :meth:`load`) also works without a host.

    :param root: The directory that holds one directory per session; created on first write.
    :param batch_window: Seconds an event may wait before a background batch writes it.
    :param inline_write_limit: An awaited flush writes on the event loop's thread while the
        session's recent writes took less than this many seconds, and in a worker thread
        otherwise; ``0`` always uses a worker thread.
    :param files: The file layer; replace it to inject faults.
    """

    name: Final = "session-persistence-jsonl"

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        batch_window: float = DEFAULT_BATCH_WINDOW,
        inline_write_limit: float = DEFAULT_INLINE_WRITE_LIMIT,
        files: OsFiles | None = None,
    ) -> None:
        window: object = batch_window
        if not isinstance(window, (int, float)) or not math.isfinite(window) or window <= 0:
            raise ValueError(f"batch_window must be a positive number of seconds, not {window!r}")
        limit: object = inline_write_limit
        if not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit < 0:
            raise ValueError(
                f"inline_write_limit must be a number of seconds, 0 or more, not {limit!r}"
            )
        self.root: Final = Path(root).absolute()
        self.batch_window: Final = float(batch_window)
        self.inline_write_limit: Final = float(inline_write_limit)
        self.files: Final = files if files is not None else OsFiles()
        self._writers: dict[str, _Writer] = {}
        self._task_group: TaskGroup | None = None
        self._batches = 0

    def __repr__(self) -> str:
        return f"<JsonlSessionPersistence root={str(self.root)!r}>"

    # -- plugin hooks ---------------------------------------------------------------------------

    @hookimpl
    def host_configure(self, host: Host) -> None:
        host.session_persistence = self
        self._task_group = host.task_group
        host.add_cleanup(self.aclose)

    @hookimpl
    def host_unconfigure(self, host: Host) -> None:
        if host.session_persistence is self:
            host.session_persistence = None

    @hookimpl
    def session_event(self, session: Session, event: SessionEvent) -> None:
        writer = self._writers.get(session.id)
        if writer is None:
            writer = self._writers[session.id] = _Writer(session)
        writer.session = session  # a session resumed under the same id continues the same log
        writer.pending.append(event)
        if not writer.window_open and writer.barrier is None:
            self._open_window(writer)

    def _open_window(self, writer: _Writer) -> None:
        """Open a window for *writer*'s queue, started now; a timer task writes it at its end.

        Nothing opens once the backend is closing (or before a host opened it).
        """
        if self._task_group is None:
            return
        writer.window += 1
        writer.window_open = True
        writer.deadline = anyio.current_time() + self.batch_window
        if not writer.timer:
            writer.timer = True
            self._task_group.start_soon(self._window_timer, writer)

    @hookimpl
    def session_flush(self, session: Session) -> FlushThunk | None:
        writer = self._writers.get(session.id)
        if writer is None:
            return None
        return lambda: self._flush(writer)

    # -- writing --------------------------------------------------------------------------------

    async def flush(self, session_id: str) -> None:
        """Make every event admitted for *session_id* durable (nothing to do if none were)."""
        writer = self._writers.get(session_id)
        if writer is not None:
            await self._flush(writer)

    def durable_count(self, session_id: str) -> int:
        """How many events of the live session *session_id* are known to be on disk."""
        writer = self._writers.get(session_id)
        return 0 if writer is None or writer.log is None else writer.log.count

    def statistics(self) -> PersistenceStatistics:
        calls = self.files.calls
        return PersistenceStatistics(
            sessions=len(self._writers),
            pending_events=sum(len(writer.pending) for writer in self._writers.values()),
            batches=self._batches,
            writes=calls["write"],
            fsyncs=calls["fsync"],
            directory_fsyncs=calls["fsync_dir"],
        )

    async def aclose(self) -> None:
        """Drain every queue, then release every file; the first drain failure is raised.

        No window timer starts once closing has begun, and events admitted while the queues
        drain are drained too. Each file is released only when no write to it is in flight.
        """
        self._task_group = None
        failures: dict[str, Exception] = {}
        while draining := [
            writer
            for writer in self._writers.values()
            if (writer.pending or writer.lane.locked()) and writer.session_id not in failures
        ]:
            for writer in draining:
                try:
                    await self._flush(writer)
                except Exception as exc:
                    failures[writer.session_id] = exc
        for writer in self._writers.values():
            async with writer.lane:
                if writer.log is not None:
                    await anyio.to_thread.run_sync(self._release, writer.log)
                    writer.log = None
        self._writers.clear()
        if failures:
            raise next(iter(failures.values()))

    async def _flush(self, writer: _Writer) -> None:
        barrier = writer.barrier
        if barrier is not None:
            await barrier.done.wait()
            if barrier.error is not None:
                raise barrier.error
            return
        if not writer.lane.locked():
            if not writer.pending:
                return
            if self._may_write_inline(writer):
                # No other task can run before this returns: no barrier to share, no await
                # to shield. Nor a scheduler round after it (which costs a sixth of a small
                # flush): what became ready meanwhile runs at the caller's next await.
                await self._write_pending(writer, inline=True)  # never suspends
                return
        barrier = writer.barrier = _Barrier()
        writer.window_open = False
        try:
            with anyio.CancelScope(shield=True):
                await writer.lane.acquire()
                try:
                    await anyio.lowlevel.checkpoint()  # checkpoints ready now join this batch
                    while writer.pending:
                        await self._write_pending(writer, inline=self._may_write_inline(writer))
                    writer.barrier = None  # in the same step that saw the queue empty
                finally:
                    writer.lane.release()
        except Exception as exc:
            barrier.error = exc
            raise
        finally:
            if writer.barrier is barrier:
                writer.barrier = None
            barrier.done.set()

    async def _window_timer(self, writer: _Writer) -> None:
        """Write each window's batch when the window expires, one window after another.

        One task serves the windows of a writer in turn: if the window it waits for was closed
        (by a flush) and a new one opened meanwhile, it waits on for the new one's deadline, so
        a session that flushes every few events does not start a task for every window.
        """
        window, deadline = writer.window, writer.deadline
        try:
            while True:
                # Sleep even if a flush already took the window: a task that exited at once
                # would be started again by the next event, for every flush.
                await anyio.sleep_until(deadline)
                if writer.window_is(window):
                    async with writer.lane:
                        if writer.window_is(window):  # no flush took it while the lane was busy
                            await self._write_in_background(writer)
                if not writer.window_open:
                    return
                window, deadline = writer.window, writer.deadline
        finally:
            writer.timer = False

    async def _write_in_background(self, writer: _Writer) -> None:
        try:
            with anyio.CancelScope(shield=True):
                await self._write_pending(writer, inline=False)
        except Exception:
            logger.exception(
                "background write of session %r failed; %s",
                writer.session_id,
                "the batch stays queued for the next window",
            )
            self._open_window(writer)

    def _may_write_inline(self, writer: _Writer) -> bool:
        """Whether an awaited write of *writer* should run on the event loop's thread.

        Only a plain append may: creating the file, or reading it again after a failed write
        (a whole log, for a resumed session), stays off the loop.
        """
        log = writer.log
        return (
            log is not None
            and not log.suspect
            and writer.write_seconds < self.inline_write_limit
            and loop_is_idle()
        )

    async def _write_pending(self, writer: _Writer, *, inline: bool) -> None:
        """Write the whole queue as one batch, *inline* on this thread or in a worker thread.

        The caller holds the lane, shielded, unless *inline* (then this never suspends).
        """
        batch, writer.pending = writer.pending, []
        writer.window_open = False
        try:
            if inline:
                self._timed_append(writer, batch)
            else:
                await run_in_worker(partial(self._timed_append, writer, batch))
        except BaseException:
            writer.pending[:0] = batch
            raise
        self._batches += 1

    def _timed_append(self, writer: _Writer, batch: Sequence[SessionEvent]) -> None:
        """:meth:`_append`, keeping the slowest recent write's duration for the next choice."""
        start = time.perf_counter()
        try:
            self._append(writer, batch)
        finally:
            took = time.perf_counter() - start
            writer.write_seconds = max(took, writer.write_seconds * 0.875)

    def _append(self, writer: _Writer, batch: Sequence[SessionEvent]) -> None:
        """Append *batch* to the session's file durably (blocking)."""
        log = writer.log
        if log is None:
            log = writer.log = self._open_for_writing(writer.session_id)
        elif log.suspect:
            self._verify(log, writer.session_id)
        seqs = [event.seq for event in batch]
        if seqs != list(range(log.count, log.count + len(seqs))):
            index, seq = next((i, seq) for i, seq in enumerate(seqs) if seq != log.count + i)
            raise SeqMismatchError(
                f"session {writer.session_id!r}: refusing to write seq {seq} at "
                f"position {index} of a batch; the log on disk holds {log.count} events, "
                f"so seq {log.count + index} was expected"
            )
        data = encode_events(batch)
        if log.size == 0:  # the file does not exist yet
            header = encode_header(SessionHeader(writer.session_id, batch[0].time))
            self.files.publish(log.path, header + data)
            log.size = len(header) + len(data)
        else:
            if log.fd is None:  # opened only now, so a failed open cannot undo the publish
                log.fd = self.files.open_append(log.path)
            self._append_bytes(log, log.fd, data)
        log.count += len(batch)

    def _append_bytes(self, log: _Log, fd: int, data: bytes) -> None:
        """Write *data* at the end of the log and fsync; on failure, truncate it away."""
        try:
            self.files.write(fd, data)
            self.files.fsync(fd)
        except BaseException as error:
            log.suspect = True
            try:
                self.files.truncate(fd, log.size)
                self.files.fsync(fd)
            except BaseException as rollback_error:
                raise RollbackError(log.path, error, rollback_error) from error
            raise
        log.size += len(data)

    def _open_for_writing(self, session_id: str) -> _Log:
        directory = self._directory(session_id)
        self.files.makedirs(directory)
        log = _Log(directory / LOG_NAME, self._lock(session_id, directory))
        try:
            if log.path.exists() or log.path.is_symlink():
                self._verify(log, session_id)
        except BaseException:
            self._release(log)
            raise
        return log

    def _lock(self, session_id: str, directory: Path) -> int:
        try:
            return self.files.lock(directory / LOCK_NAME)
        except LockedError:
            raise SessionLockedError(
                f"session {session_id!r} is being written by another process "
                f"(it holds {directory / LOCK_NAME})"
            ) from None

    def _verify(self, log: _Log, session_id: str) -> None:
        """(Re)open an existing log, check what it holds, and take its size and count.

        A log opened for the first time must end cleanly. A *suspect* log (a write to it
        failed) must still hold the bytes known durable; anything after them was never
        acknowledged and is cut off.
        """
        if log.fd is not None:
            self.files.close(log.fd)
            log.fd = None
        data = self._read(log.path)
        if log.suspect:
            if len(data) < log.size:
                raise PersistenceError(
                    f"{log.path} is {len(data)} bytes long, shorter than the {log.size} bytes "
                    "known durable"
                )
            data = data[: log.size]
        scan = _scan_session(data, log.path, session_id)
        if scan.torn or (log.suspect and len(scan.events) != log.count):
            raise PersistenceError(
                f"{log.path} ends in {len(scan.torn)} bytes that are not complete events; "
                "load the session with recovery before writing to it"
            )
        fd = self.files.open_append(log.path)
        try:
            if log.suspect:
                self.files.truncate(fd, log.size)
                self.files.fsync(fd)
        except BaseException:
            self.files.close(fd)
            raise
        log.fd, log.size, log.count, log.suspect = fd, scan.committed_bytes, len(scan.events), False

    def _release(self, log: _Log) -> None:
        if log.fd is not None:
            self.files.close(log.fd)
            log.fd = None
        self.files.unlock(log.lock_fd)

    # -- reading --------------------------------------------------------------------------------

    async def list_sessions(self) -> list[SessionHeader]:
        """The headers of the sessions stored under the root, oldest first."""
        return await anyio.to_thread.run_sync(self._list)

    async def inspect(self, session_id: str) -> StoredLog:
        """Read a log without changing anything; ``repair`` is what recovery would append.

        :raises SessionNotFoundError: if there is no log for *session_id*.
        :raises CorruptLogError: if the committed region is damaged.
        :raises UnsupportedFormatError: if the log has another format version.
        :raises PersistenceError: if the log's header names another session.
        """
        path = self._directory(session_id) / LOG_NAME
        scan, repair = await anyio.to_thread.run_sync(self._read_log, path, session_id)
        return StoredLog(scan.header, scan.events, repair, len(scan.torn), path)

    async def load(self, session_id: str) -> StoredLog:
        """Read a log with recovery: cut a torn tail (kept beside the log), close an open turn.

        The repair is made durable before this returns, so loading twice changes nothing more.

        :raises LiveSessionError: if the session is live here and its turn is still open.
        :raises SessionLockedError: if another process is writing the session.
        :raises SessionNotFoundError, CorruptLogError, UnsupportedFormatError,
            PersistenceError: as :meth:`inspect`; nothing is changed.
        """
        writer = self._writers.get(session_id)
        if writer is not None:
            events = writer.session.events
            if interrupted_turn_closers(events):
                raise LiveSessionError(
                    f"cannot load session {session_id!r} while its live turn is open"
                )
            await self._flush(writer)
            assert writer.log is not None
            header = SessionHeader(session_id, events[0].time)
            return StoredLog(header, tuple(events), (), 0, writer.log.path)
        with anyio.CancelScope(shield=True):
            recovered = await anyio.to_thread.run_sync(self._recover, session_id)
        return recovered

    def _recover(self, session_id: str) -> StoredLog:
        directory = self._directory(session_id)
        path = directory / LOG_NAME
        if not (path.exists() or path.is_symlink()):
            raise SessionNotFoundError(f"no session {session_id!r} under {self.root}")
        log = _Log(path, self._lock(session_id, directory))
        try:
            scan, repair = self._read_log(path, session_id)
            if scan.torn:
                self._keep_torn(directory, scan.committed_bytes, scan.torn)
            if scan.torn or repair:
                fd = log.fd = self.files.open_append(path)
                self.files.truncate(fd, scan.committed_bytes)
                self.files.fsync(fd)  # the cut is durable before anything follows it
                log.size = scan.committed_bytes
                if repair:
                    self._append_bytes(log, fd, encode_events(repair))
            return StoredLog(scan.header, scan.events + repair, repair, len(scan.torn), path)
        finally:
            self._release(log)

    def _read_log(self, path: Path, session_id: str) -> tuple[Scan, tuple[SessionEvent, ...]]:
        """Read the log of *session_id* at *path*: what it holds, and the closers it needs.

        Bytes were cut after the events if they are torn now, or if a recovery cut them there
        and stopped before closing the turn (the bytes it kept are named after the offset).
        """
        scan = _scan_session(self._read(path), path, session_id)
        kept = path.with_name(f"{LOG_NAME}.torn-{scan.committed_bytes}")
        tail_cut = bool(scan.torn) or kept.exists()
        return scan, interrupted_turn_closers(scan.events, tail_cut=tail_cut)

    def _keep_torn(self, directory: Path, offset: int, torn: bytes) -> None:
        """Keep the bytes cut at *offset* beside the log, unless an earlier attempt did."""
        name, attempt = f"{LOG_NAME}.torn-{offset}", 1
        keep = directory / name
        while keep.exists():
            if self.files.read(keep) == torn:
                return
            attempt += 1
            keep = directory / f"{name}.{attempt}"
        self.files.publish(keep, torn)

    def _list(self) -> list[SessionHeader]:
        if not self.root.is_dir():
            return []
        headers = []
        for entry in self.root.iterdir():
            path = entry / LOG_NAME
            if entry.is_symlink() or not path.is_file():
                continue
            line = self.files.read_first_line(path)
            headers.append(scan_log(line, path).header)
        return sorted(headers, key=lambda header: (header.created_at, header.id))

    def _read(self, path: Path) -> bytes:
        try:
            return self.files.read(path)
        except FileNotFoundError:
            session_id = decode_session_id(path.parent.name)
            raise SessionNotFoundError(f"no session {session_id!r} under {self.root}") from None
        except OSError as exc:
            if path.is_symlink():
                raise PersistenceError(f"{path} is a symbolic link; refusing to follow it") from exc
            raise

    def _directory(self, session_id: str) -> Path:
        directory = self.root / encode_session_id(session_id)
        if directory.is_symlink():
            raise InvalidSessionIdError(
                f"{directory} is a symbolic link; refusing to follow it out of the root"
            )
        return directory


def _scan_session(data: bytes, path: Path, session_id: str) -> Scan:
    """:func:`scan_log`, refusing a log whose header names another session (a copied log)."""
    scan = scan_log(data, path)
    if scan.header.id != session_id:
        raise PersistenceError(
            f"{path} belongs to session {scan.header.id!r}, not {session_id!r}; "
            "refusing to read or change it as that session"
        )
    return scan
