"""The JSONL persistence backend: one log file per session, a batch per write and fsync.

The queue, the windows, the flush barrier and the seq check are the backend-neutral core's
(:mod:`..core`), the file format :mod:`.format`'s; this module makes a batch durable in a
file and reads logs back. A failed write or fsync truncates the partial bytes away and keeps
the batch queued for the next flush; after a failure the file is reopened and re-read before
the next write, so a failed fsync is never taken for success.

Where a write runs: a background batch always runs in a worker thread, since nobody waits for
it (a failed one is tried again in the next window). A flush that a caller awaits appends on
the event loop's own thread (never creates or re-reads a log there) when no other task is ready
to run (on trio, after one scheduler round: :func:`..workers.loop_is_idle`) and the session's
recent writes took less than ``inline_write_limit`` (2 ms by default):
handing a call to a thread and waking the loop again when it returns costs about as much as a
fast fsync (100-200 µs on a virtual machine), while a loop with nothing else to run loses
nothing by waiting for the disk itself. Otherwise the write runs in a worker thread, and the
tasks that are ready, or checkpoints that arrive meanwhile, run (and join the next batch) while
it is in flight.

Many sessions share a sync (``shared_sync``): the batches of other sessions handed off while a
write is in flight wait on the event loop, and the next worker job appends all of them, then
makes them durable with one ``syncfs`` of their filesystem where that is as safe as an fsync of
each (:meth:`.files.OsFiles.filesystem`). A failed ``syncfs`` is followed by an fsync of each
log, which tells which of them lost their write-back.
"""

from __future__ import annotations

import errno
import logging
import math
import resource
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from os import scandir as os_scandir
from pathlib import Path
from typing import TYPE_CHECKING, Final, NoReturn, final

import anyio
import anyio.lowlevel
import anyio.to_thread

from ...cancellation import checkpoint_if_cancelled
from ...hookspecs import hookimpl
from ..core import DEFAULT_BATCH_WINDOW, GroupWrite, Outcome, WriteBehind, Writer
from ..errors import (
    CorruptLogError,
    DuplicateLogError,
    EncodingMismatchError,
    InvalidSessionIdError,
    LogChangedError,
    MisplacedLogError,
    PersistenceError,
    RecoveryRequiredError,
    RollbackError,
    SessionLockedError,
    SessionNotFoundError,
    UnsupportedFormatError,
)
from ..ids import NO_CWD, earlier_directory, encode_session_id, project_directory
from ..legacy import LegacyRecordError, first_older, upgrade_events
from ..repair import repair_of
from ..values import (
    PersistenceStatistics,
    RawArtifact,
    SessionHeader,
    SessionListing,
    SessionLocation,
    SessionProblem,
    SessionSnapshot,
    StoredLog,
    StoredSuffix,
    check_from_seq,
)
from ..workers import Gathering
from .files import LockedError, OsFiles
from .format import (
    COMPRESSIONS,
    LOCK_NAME,
    LOG_NAME,
    ZSTD_LOG_NAME,
    Compression,
    Scan,
    Watch,
    compress_frame,
    decode_artifact,
    encode_events,
    encode_header,
    read_header,
    salvage,
    scan_file,
    scan_log,
)

if TYPE_CHECKING:
    import os
    from collections.abc import Iterator, Sequence

    from ...contract import SessionLogLike
    from ...events import SessionEvent, StoredEvents

__all__ = [
    "DEFAULT_COMPRESSION",
    "DEFAULT_INLINE_WRITE_LIMIT",
    "DEFAULT_PACK_CHUNKS",
    "JsonlSessionPersistence",
    "JsonlStatistics",
]

logger = logging.getLogger(__name__)

DEFAULT_INLINE_WRITE_LIMIT: Final = 0.002
"""Seconds a session's recent writes may take for an awaited flush to write on the loop."""
DEFAULT_COMPRESSION: Final[Compression] = "zstd"
"""How new logs are written: checksummed Zstandard frames (``session.jsonl.zstd``), as the
original harness writes them by default."""
DEFAULT_PACK_CHUNKS: Final = True
"""Whether runs of three or more deltas of one block are written as one packed row."""
MIGRATED_SUFFIX: Final = ".migrated"
"""Appended to the name of a log in the earlier format once recovery has converted it."""


def _default_max_open_sessions() -> int:
    """An eighth of the process's limit on open files: a quarter of them, at two per session."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 16
    return max(4, soft // 8)


@final
@dataclass(frozen=True, slots=True)
class JsonlStatistics(PersistenceStatistics):
    """Counters of a JSONL backend since it was created."""

    open_sessions: int
    """Sessions whose log and lock files are open."""
    writes: int
    """``write`` system calls on logs and temporary files."""
    fsyncs: int
    """``fsync`` system calls on files."""
    directory_fsyncs: int
    """``fsync`` system calls on directories."""
    syncfs: int = 0
    """``syncfs`` system calls: each made the batches of several sessions durable at once."""


_NOT_LOOKED_UP: Final = -1
"""A log's filesystem before it is looked up (no device number is negative)."""


class _Log:
    """The durable state of one session file. Touched only by the writer holding its lock.

    Its files (the lock and the log) are open while ``lock_fd`` is set; an idle session's may
    be closed to stay within :attr:`~JsonlSessionPersistence.max_open_sessions`, and are
    opened again, and checked, by its next write.
    """

    __slots__ = ("count", "fd", "filesystem", "header", "lock_fd", "path", "size", "suspect")

    def __init__(self, path: Path, lock_fd: int, header: SessionHeader | None = None) -> None:
        self.path = path
        self.header = header  # of the log this handle creates, if it creates it
        self.lock_fd: int | None = lock_fd
        self.fd: int | None = None  # None until the file exists, and while the files are closed
        self.size = 0  # committed bytes
        self.count = 0  # durable events: the seq the next event must have
        self.suspect = False  # a write failed: re-read the file before the next one
        self.filesystem: int | None = _NOT_LOOKED_UP  # where its shared sync goes, if any

    @property
    def compression(self) -> Compression:
        return _compression_of(self.path)


_STABLE_READS: Final = 16
"""How many times a log is read again while another process changes it, before giving up."""
_RECOVERED_KEPT: Final = 1024
"""Of how many recovered sessions the size and count are kept until their first write."""


def _corrupt_data(path: Path, seq: int, problem: str) -> CorruptLogError:
    return CorruptLogError(path, None, problem, seq=seq)


def _compression_of(path: Path) -> Compression:
    return "zstd" if path.name == ZSTD_LOG_NAME else "none"


@dataclass(frozen=True, slots=True)
class _Found:
    """Where the log of a session is: its file, and whether it is in the earlier layout."""

    path: Path
    earlier: bool = False


class JsonlSessionPersistence(WriteBehind["_Log"]):
    """Persist every live session of a host as a JSONL log under *root*.

    Register it on a :class:`~kai_session_checkpoint_policy.host.Host`: opening the host makes
    it the host's ``session_persistence``; closing the host drains every queue. Reading
    (:meth:`list_sessions`, :meth:`inspect`, :meth:`load`) also works without a host.

    The root is laid out as the original harness lays it out, and read whatever compression
    its logs use (and in this project's earlier layout too).

    :param root: The directory that holds the sessions; created on first write.
    :param batch_window: Seconds an event may wait before a background batch writes it.
    :param inline_write_limit: An awaited flush writes on the event loop's thread while the
        session's recent writes took less than this many seconds, and in a worker thread
        otherwise; ``0`` always uses a worker thread.
    :param max_open_sessions: At most this many sessions keep their two files (the log and
        its lock) open; the files of the least recently written idle session are closed to
        make room, and opened again by its next write. By default, an eighth of the process's
        limit on open files.
    :param compression: How a new log is written: ``"zstd"`` (one checksummed Zstandard frame
        per batch, ``session.jsonl.zstd``; the default, as the original's) or ``"none"``
        (plain lines, ``session.jsonl``). A log that exists keeps its own.
    :param pack_chunks: Whether three or more consecutive deltas of one block are written as
        one packed row (the default, as the original's).
    :param shared_sync: Whether the batches of sessions handed to a worker thread while another
        write runs are written together, and made durable with one ``syncfs`` of their
        filesystem instead of an fsync of each log, where that is as safe (Linux 5.8 or newer,
        on ext4, XFS or btrfs; elsewhere each log is fsynced). ``syncfs`` also writes out what
        other programs wrote to that filesystem: turn this off where the root shares its
        filesystem with a heavy writer.
    :param files: The file layer; replace it to inject faults.
    """

    name: Final = "session-persistence-jsonl"
    durable_unit = "fsyncs"  # a batch is one write and one fsync of the log

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        batch_window: float = DEFAULT_BATCH_WINDOW,
        inline_write_limit: float = DEFAULT_INLINE_WRITE_LIMIT,
        max_open_sessions: int | None = None,
        compression: Compression = DEFAULT_COMPRESSION,
        pack_chunks: bool = DEFAULT_PACK_CHUNKS,
        shared_sync: bool = True,
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
        most: object = max_open_sessions
        if most is None:
            most = _default_max_open_sessions()
        if type(most) is not int or most < 1:
            raise ValueError(f"max_open_sessions must be a positive integer, not {most!r}")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be 'zstd' or 'none', not {compression!r}")
        if not isinstance(pack_chunks, bool):
            raise ValueError(f"pack_chunks must be True or False, not {pack_chunks!r}")
        if not isinstance(shared_sync, bool):
            raise ValueError(f"shared_sync must be True or False, not {shared_sync!r}")
        super().__init__(batch_window=batch_window)
        self.root: Final = Path(root).absolute()
        self.inline_write_limit: Final = float(inline_write_limit)
        self.max_open_sessions: Final = most
        self.compression: Final[Compression] = compression
        self.pack_chunks: Final = pack_chunks
        self.files: Final = files if files is not None else OsFiles()
        self.shared_sync = shared_sync
        """Whether batches written at once share a ``syncfs``; cleared when the root's
        filesystem turns out not to allow it."""
        self._gathering: Final[Gathering[GroupWrite[_Log]]] = Gathering(self._write_group)
        self._sync_handles: dict[int, int] = {}  # filesystem -> handle syncfs is called on
        self._open: OrderedDict[str, Writer[_Log]] = OrderedDict()  # least recently written first
        self._opening: set[str] = set()  # sessions whose next write opens their files
        self._in_flight: set[str] = set()  # sessions with a write under way
        self._room: anyio.Event | None = None  # set when a write ends, for those waiting
        # What this backend's last recoveries left (path, size, count), for their first write.
        self._recovered: OrderedDict[str, tuple[Path, int, int]] = OrderedDict()
        self._held: OrderedDict[str, _Log] = OrderedDict()  # their locked logs, in a host
        self._recovered_lock = threading.Lock()  # recoveries run in worker threads
        self._encoding_checked = False  # whether the root holds no log of the other encoding

    def __repr__(self) -> str:
        return f"<JsonlSessionPersistence root={str(self.root)!r}>"

    def session_exists(self, session_id: str) -> bool:
        """Whether a log for *session_id* is stored under the root.

        A few ``lstat`` calls: the session's directory without a working directory, those of
        the project directories, and the earlier layout's.
        """
        return self._find(session_id) is not None

    def statistics(self) -> JsonlStatistics:
        core, calls = super().statistics(), self.files.calls
        return JsonlStatistics(
            sessions=core.sessions,
            pending_events=core.pending_events,
            batches=core.batches,
            open_sessions=len(self._open),
            writes=calls["write"],
            fsyncs=calls["fsync"],
            directory_fsyncs=calls["fsync_dir"],
            syncfs=calls["syncfs"],
        )

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            self._open.clear()
            with self._recovered_lock:
                held, self._held = list(self._held.values()), OrderedDict()
            for log in held:
                self._release(log)
            handles, self._sync_handles = list(self._sync_handles.values()), {}
            for handle in handles:
                self.files.close(handle)

    @hookimpl
    def session_detach(self, session: SessionLogLike) -> None:
        log = self._take_held(session.id)  # resumed, and never written
        if log is not None:
            self._release(log)
        super().session_detach(session)

    def _forget(self, writer: Writer[_Log]) -> None:
        if self._open.get(writer.session_id) is writer:
            del self._open[writer.session_id]
        super()._forget(writer)
        self._wake()

    # -- where logs are -------------------------------------------------------------------------

    def _session_directory(self, project: str, session_id: str) -> Path:
        directory = self.root / project / encode_session_id(session_id)
        for path in (directory.parent, directory):
            if path.is_symlink():
                _refuse_link(path)
        return directory

    def _find(self, session_id: str) -> _Found | None:
        """Where the log of *session_id* is, if anywhere.

        In the session's directory under ``_no-cwd``, or under a project directory
        (``--<key>--``), or else in the earlier layout. A log in the current layout wins over
        one in the earlier layout (left by a conversion that was interrupted).

        :raises PersistenceError: if the session has logs in two project directories, or
            both a plain and a compressed one.
        """
        found = self._log_in(self._session_directory(NO_CWD, session_id))
        if found is None:
            matches = [
                log
                for project in self._project_directories()
                if (log := self._log_in(self._session_directory(project, session_id)))
            ]
            if len(matches) > 1:
                raise DuplicateLogError(
                    f"session {session_id!r} has logs in several project directories: "
                    f"{', '.join(str(match) for match in matches)}"
                )
            found = matches[0] if matches else None
        if found is not None:
            return _Found(found)
        earlier = self.root / earlier_directory(session_id)
        if earlier.is_symlink():
            _refuse_link(earlier)
        if _is_earlier_log(earlier / LOG_NAME):
            return _Found(earlier / LOG_NAME, earlier=True)
        encoded = encode_session_id(session_id)
        for project in (NO_CWD, *self._project_directories()):
            for name in (f"{encoded}.jsonl", f"{encoded}.jsonl.zstd"):
                if _exists(self.root / project / name):
                    raise _flat_file(self.root / project / name)
        return None

    def _check_root_encoding(self) -> None:
        """Refuse to add a log to a root that holds logs in the other encoding, as the original
        harness refuses (it then refuses the whole root): checked once, before the first log
        this backend creates.

        :raises EncodingMismatchError: naming a log in the other encoding.
        """
        if self._encoding_checked:
            return
        other = LOG_NAME if self.compression == "zstd" else ZSTD_LOG_NAME
        for project in {NO_CWD, *self._project_directories()}:
            try:
                with os_scandir(self.root / project) as entries:
                    sessions = [
                        entry.path for entry in entries if entry.is_dir(follow_symlinks=False)
                    ]
            except (FileNotFoundError, NotADirectoryError):
                continue
            for directory in sorted(sessions):
                log = Path(directory) / other
                if _exists(log):
                    raise EncodingMismatchError(
                        f"{log} is a {'plain' if other == LOG_NAME else 'compressed'} log, and "
                        f"this backend writes compression {self.compression!r}: a root holds "
                        "logs in one encoding (the original harness refuses a root with both); "
                        "use another root, or the compression of the logs it holds"
                    )
        self._encoding_checked = True

    def _project_directories(self) -> list[str]:
        """The names of the directories under the root that may hold sessions with a cwd."""
        try:
            with os_scandir(self.root) as entries:
                return sorted(
                    entry.name
                    for entry in entries
                    if entry.name.startswith("--")
                    and entry.name.endswith("--")
                    and len(entry.name) >= 4
                    and entry.is_dir(follow_symlinks=False)
                )
        except FileNotFoundError:
            return []

    @staticmethod
    def _log_in(directory: Path) -> Path | None:
        plain, compressed = directory / LOG_NAME, directory / ZSTD_LOG_NAME
        has_plain, has_compressed = _exists(plain), _exists(compressed)
        if has_plain and has_compressed:
            raise DuplicateLogError(
                f"{directory} holds both {LOG_NAME} and {ZSTD_LOG_NAME}; a session has one log"
            )
        return plain if has_plain else compressed if has_compressed else None

    def _expected_log(self, header: SessionHeader, path: Path) -> None:
        """Refuse a log whose header does not name the place it is stored at.

        :raises PersistenceError: naming where the header's id and cwd put the session.
        """
        if header.earlier_format:
            expected = self.root / earlier_directory(header.id)
        else:
            expected = self.root / project_directory(header.cwd) / encode_session_id(header.id)
        if path.parent != expected:
            raise MisplacedLogError(
                f"{path}: its header's id {header.id!r} and working directory {header.cwd!r} "
                f"belong at {expected}; refusing to read it as stored elsewhere"
            )

    # -- writing --------------------------------------------------------------------------------

    def _may_write_inline(self, writer: Writer[_Log]) -> bool:
        """Whether an awaited write of *writer* should run on the event loop's thread.

        Only an append to an existing file may (opening it again first, if its files were
        closed while idle: two quick system calls): creating the file, or reading it again
        after a failed write (a whole log, for a resumed session), stays off the loop.
        """
        log = writer.log
        return (
            (
                log.size > 0 and not log.suspect  # the file exists, and holds what it should
                if log is not None
                else writer.session_id in self._held  # recovered here, locked since
            )
            and writer.write_seconds < self.inline_write_limit
            and not self._gathering.busy
        )

    def _files_open(self, writer: Writer[_Log]) -> bool:
        """Whether *writer*'s files are open: its log's, or those its recovery kept locked."""
        log = writer.log
        if log is not None:
            return log.lock_fd is not None
        return writer.session_id in self._held

    def _reserve(self, writer: Writer[_Log]) -> bool:
        """Count *writer* among the sessions opening their files, if that stays within
        :attr:`max_open_sessions` once idle sessions' files are closed; ``False`` if every
        session whose files are open is writing (then nothing is closed).

        Files kept by recoveries go first, then those of the least recently written sessions
        whose write is not in flight. Runs on the event loop's thread.
        """
        while len(self._open) + len(self._held) + len(self._opening) >= self.max_open_sessions:
            with self._recovered_lock:
                held = self._held.popitem(last=False)[1] if self._held else None
            if held is not None:
                self._release(held)
                continue
            idle = next(
                (other for other in self._open.values() if other.session_id not in self._in_flight),
                None,
            )
            if idle is None:
                return False
            del self._open[idle.session_id]
            if idle.log is not None:
                self._release(idle.log)
        self._opening.add(writer.session_id)
        return True

    async def _make_room(self, writer: Writer[_Log]) -> None:
        """Wait until *writer* may open its files within :attr:`max_open_sessions`.

        A burst of checkpoints of more sessions than that waits here, in turn, instead of
        opening files beyond the process's limit: a session that ends its write makes room.
        """
        while not (
            self._files_open(writer)
            or writer.session_id in self._opening
            or self._reserve(writer)
            or not (self._open or self._opening)  # nothing to wait for: the limit is tiny
        ):
            if self._room is None:
                self._room = anyio.Event()
            await self._room.wait()

    def _before_write(self, writer: Writer[_Log]) -> None:
        """Mark *writer*'s write in flight; reserve room for its files if it has none yet (an
        inline write, which cannot wait, goes over the limit if it must). Runs on the loop's
        thread."""
        self._in_flight.add(writer.session_id)
        if not (self._files_open(writer) or writer.session_id in self._opening):
            self._reserve(writer)

    def _after_write(self, writer: Writer[_Log]) -> None:
        """Keep the order of the sessions whose files are open, after a write of *writer*, and
        wake the writes waiting for room."""
        session_id = writer.session_id
        self._in_flight.discard(session_id)
        self._opening.discard(session_id)
        log = writer.log
        if log is not None and log.lock_fd is not None:
            self._open[session_id] = writer
            self._open.move_to_end(session_id)
        elif self._open.get(session_id) is writer:
            del self._open[session_id]
        self._wake()

    def _stored_size(self, writer: Writer[_Log]) -> int | None:
        log = writer.log
        return None if log is None else log.size

    def _wake(self) -> None:
        """Wake the writes waiting for room to open their files."""
        room, self._room = self._room, None
        if room is not None:
            room.set()

    def _ready(
        self, session_id: str, log: _Log | None, expected: int, header: SessionHeader | None
    ) -> _Log:
        if log is None:
            return self._open_for_writing(session_id, expected, header)
        if log.lock_fd is None:
            self._reopen(log, session_id)
        elif log.suspect:
            self._verify(log, session_id, expected)
        return log

    def _location(self, log: _Log) -> str:
        return str(log.path)

    def _encode(self, events: Sequence[SessionEvent], compression: Compression) -> bytes:
        return encode_events(events, pack=self.pack_chunks, compression=compression)

    def _append(self, log: _Log, session_id: str, batch: Sequence[SessionEvent]) -> None:
        compression = log.compression
        data = self._encode(batch, compression)
        if log.size == 0:  # the file does not exist yet
            header = _header_bytes(
                log.header or SessionHeader(session_id, batch[0].time), compression
            )
            try:
                self.files.publish(log.path, header + data)
            except BaseException:
                # Nothing exists: keep no lock; the next write opens and locks it again.
                self._release(log)
                raise
            log.size = len(header) + len(data)
        else:
            if log.fd is None:  # opened only now, so a failed open cannot undo the publish
                log.fd = self.files.open_append(log.path)
            self._append_bytes(log, log.fd, data)

    def _append_bytes(self, log: _Log, fd: int, data: bytes) -> None:
        """Write *data* at the end of the log and fsync; on failure, truncate it away."""
        with self._undone_on_failure(log, fd):
            self.files.write(fd, data)
            self.files.fsync(fd)
        log.size += len(data)

    @contextmanager
    def _undone_on_failure(self, log: _Log, fd: int) -> Iterator[None]:
        """If the write or sync inside fails, cut what it may have left after the bytes known
        durable (the log is read again before its next write), and raise its error.

        :raises RollbackError: if the cut failed too.
        """
        try:
            yield
        except BaseException as error:
            log.suspect = True
            try:
                self.files.truncate(fd, log.size)
                self.files.fsync(fd)
            except BaseException as rollback_error:
                raise RollbackError(log.path, error, rollback_error) from error
            raise

    # -- several sessions' batches, one sync --------------------------------------------------

    async def _write_off_loop(
        self, writer: Writer[_Log], batch: list[SessionEvent], outcome: Outcome
    ) -> None:
        """Write *batch* in a worker thread: with :attr:`shared_sync`, in one job with the
        batches of every other session handed off while the job before runs (``Gathering``),
        made durable together (:meth:`_write_group`)."""
        if self.shared_sync:
            await GroupWrite(writer, batch, outcome).submit(self._gathering)
        else:
            await super()._write_off_loop(writer, batch, outcome)

    def _write_group(self, group: list[GroupWrite[_Log]]) -> None:
        """Make the batches of *group* durable (in a worker thread; each write keeps its
        outcome).

        A batch alone, a new log (written whole and fsynced as it is published), or a log on a
        filesystem where ``syncfs`` cannot stand in for fsync, is written as
        :meth:`_write_batch` writes it. The rest are appended, and each filesystem that holds
        two or more of them is synced once (:meth:`_sync_together`).
        """
        if len(group) == 1:
            (write,) = group
            try:
                self._write_batch(write.writer, write.batch)
            except Exception as exc:
                write.error = exc
            else:
                write.outcome.written = True
            return
        start = time.perf_counter()
        together: dict[int, list[tuple[GroupWrite[_Log], _Log, bytes]]] = {}
        for write in group:
            try:
                log = self._ready_for(write.writer, write.batch)
                filesystem = self._shared_filesystem(log)
                if filesystem is None:
                    self._append(log, write.writer.session_id, write.batch)
                    write.written(log)
                    continue
                data = self._encode(write.batch, log.compression)
                assert log.fd is not None  # opened by _shared_filesystem
                with self._undone_on_failure(log, log.fd):
                    self.files.write(log.fd, data)
            except Exception as exc:
                write.error = exc
            else:
                together.setdefault(filesystem, []).append((write, log, data))
        for filesystem, written in together.items():
            self._sync_together(self._sync_handles[filesystem], written)
        took = time.perf_counter() - start
        for write in group:
            write.writer.wrote_in(took)

    def _shared_filesystem(self, log: _Log) -> int | None:
        """The filesystem whose one ``syncfs`` may make an append to *log* durable, with its
        handle open (opened before the writes it covers) and the log's file open; ``None`` for
        a new log, or where ``syncfs`` cannot stand in for an fsync (then :attr:`shared_sync`
        is turned off: the root's filesystem, most likely)."""
        if log.size == 0:  # a new log: published whole, with its own fsyncs
            return None
        if log.fd is None:  # its files were closed while idle, and opened again
            log.fd = self.files.open_append(log.path)
        if log.filesystem == _NOT_LOOKED_UP:  # once: the log stays where it is
            log.filesystem = self.files.filesystem(log.fd)
        filesystem = log.filesystem
        if filesystem is None:
            self.shared_sync = False
        elif filesystem not in self._sync_handles:
            self._sync_handles[filesystem] = self.files.open_filesystem(log.path.parent)
        return filesystem

    def _sync_together(
        self, handle: int, written: list[tuple[GroupWrite[_Log], _Log, bytes]]
    ) -> None:
        """Make the appends *written* to logs of one filesystem durable: one ``syncfs`` for
        two or more, an fsync for one.

        If ``syncfs`` fails, a write-back failed somewhere on the filesystem since the last
        sync: each log is then fsynced on its own, which fails for a log whose write-back
        failed (the kernel reports that to each open handle of the file), and only that log's
        batch is undone.
        """
        if len(written) > 1:
            try:
                self.files.syncfs(handle)
            except OSError:
                pass  # which logs it concerns, their own fsyncs tell
            else:
                for write, log, data in written:
                    log.size += len(data)
                    write.written(log)
                return
        for write, log, data in written:
            assert log.fd is not None  # written through it
            try:
                with self._undone_on_failure(log, log.fd):
                    self.files.fsync(log.fd)
            except Exception as exc:
                write.error = exc
            else:
                log.size += len(data)
                write.written(log)

    def _open_for_writing(
        self, session_id: str, expected: int, header: SessionHeader | None
    ) -> _Log:
        held = self._take_held(session_id)
        if held is not None:  # locked since its recovery: as the recovery left it
            with self._recovered_lock:
                self._recovered.pop(session_id, None)
            return held
        found = self._find(session_id)
        if found is not None and found.earlier:
            raise RecoveryRequiredError(
                f"session {session_id!r} has a log in this project's earlier format at "
                f"{found.path}; load it with recovery first, which converts it"
            )
        if found is None:  # in the project directory of its working directory
            self._check_root_encoding()
            project = project_directory(None if header is None else header.cwd)
            directory = self._session_directory(project, session_id)
            path = directory / ZSTD_LOG_NAME if self.compression == "zstd" else directory / LOG_NAME
        else:
            path = found.path
        self.files.makedirs(path.parent)
        log = _Log(path, self._lock(session_id, path.parent), header)
        try:
            if found is not None and not self._adopt(log, session_id):
                self._verify(log, session_id, expected)
            elif (other := self._find(session_id)) is not None and other.path != path:
                raise DuplicateLogError(  # another writer created it meanwhile, elsewhere
                    f"session {session_id!r} already has a log at {other.path}"
                )
        except BaseException:
            self._release(log)
            raise
        return log

    def _lock(self, session_id: str, directory: Path) -> int:
        """Take the session's lock; then remove the temporaries an earlier holder left.

        Only a lock holder publishes files, so no publish is in progress while this one holds
        it: a temporary file in the directory was left by a holder that was interrupted.
        """
        try:
            fd = self.files.lock(directory / LOCK_NAME)
        except LockedError:
            raise SessionLockedError(
                f"session {session_id!r} is being written by another process "
                f"(it holds {directory / LOCK_NAME})"
            ) from None
        self.files.remove_temporaries(directory)
        return fd

    def _verify(self, log: _Log, session_id: str, expected: int) -> None:
        """(Re)open an existing log, check what it holds, and take its size and count.

        A log opened for the first time must end cleanly, unless the live session goes on from
        exactly its committed events (*expected* of them, none salvaged from a torn frame):
        then its torn tail is a write that never ended, and is cut as recovery cuts it, a copy
        kept. A *suspect* log (a write to it failed) must still hold the bytes known durable;
        anything after them was never acknowledged and is cut off.
        """
        if log.fd is not None:
            self.files.close(log.fd)
            log.fd = None
        if log.suspect:
            data = self._read(log.path, session_id)
            if len(data) < log.size:
                raise LogChangedError(
                    f"{log.path} is {len(data)} bytes long, shorter than the {log.size} bytes "
                    "known durable"
                )
            scan = self._scan_session(log.path, session_id, data[: log.size])
        else:
            scan = self._scan_session(log.path, session_id)
        cut = (
            bool(scan.torn) and not (log.suspect or scan.salvaged) and len(scan.events) == expected
        )
        if scan.torn and not cut:
            raise RecoveryRequiredError(
                f"{log.path} ends in {len(scan.torn)} bytes that are not complete events; "
                "load the session with recovery before writing to it"
            )
        if log.suspect and len(scan.events) != log.count:
            raise LogChangedError(
                f"{log.path} holds {len(scan.events)} events in the {log.size} bytes known "
                f"durable, where {log.count} were written; another process changed it"
            )
        if cut:
            self._keep_torn(log.path, scan.committed_bytes, scan.torn)
        fd = self.files.open_append(log.path)
        try:
            if log.suspect or cut:
                self.files.truncate(fd, log.size if log.suspect else scan.committed_bytes)
                self.files.fsync(fd)
        except BaseException:
            self.files.close(fd)
            raise
        log.fd, log.size, log.count, log.suspect = fd, scan.committed_bytes, len(scan.events), False

    def _remember(
        self, session_id: str, path: Path, size: int, count: int, log: _Log | None = None
    ) -> bool:
        """Keep what a recovery left of a log, so that its first write need not read it again.

        In an open host, which loads a session to resume it, the recovery's lock and file
        (*log*) are kept for that write too; return whether they were.
        """
        released: list[_Log] = []
        with self._recovered_lock:
            self._recovered[session_id] = (path, size, count)
            self._recovered.move_to_end(session_id)
            while len(self._recovered) > _RECOVERED_KEPT:
                self._recovered.popitem(last=False)
            kept = log is not None and self._task_group is not None
            if log is not None and kept:
                log.size, log.count = size, count
                self._held[session_id] = log
                # Within max_open_sessions with the sessions whose files are open.
                while len(self._held) > max(1, self.max_open_sessions - len(self._open)):
                    released.append(self._held.popitem(last=False)[1])
        for old in released:
            self._release(old)
        return kept

    def _take_held(self, session_id: str) -> _Log | None:
        """The locked, checked log a recovery kept for *session_id*, if any (now the caller's)."""
        with self._recovered_lock:
            return self._held.pop(session_id, None)

    def _adopt(self, log: _Log, session_id: str) -> bool:
        """Open a log this backend recovered, if it is as the recovery left it: its size and
        count are known, and it ends cleanly. ``False`` if it must be read (:meth:`_verify`)."""
        with self._recovered_lock:
            recovered = self._recovered.pop(session_id, None)
        if recovered is None or recovered[0] != log.path:
            return False
        _, size, count = recovered
        fd = self.files.open_append(log.path)
        if self.files.size(fd) != size:  # another process wrote it since
            self.files.close(fd)
            return False
        log.fd, log.size, log.count = fd, size, count
        return True

    def _release(self, log: _Log) -> None:
        """Close the log's files; what is known of the log stays, for :meth:`_reopen`."""
        if log.fd is not None:
            self.files.close(log.fd)
            log.fd = None
        if log.lock_fd is not None:
            self.files.unlock(log.lock_fd)
            log.lock_fd = None

    def _reopen(self, log: _Log, session_id: str) -> None:
        """Open the files of a log closed while idle, and check that nobody changed it."""
        log.lock_fd = self._lock(session_id, log.path.parent)
        try:
            if log.size:
                log.fd = self.files.open_append(log.path)
                size = self.files.size(log.fd)
                if size != log.size:
                    raise LogChangedError(
                        f"{log.path} changed while its files were closed: it holds {size} "
                        f"bytes where {log.size} were written; another process wrote it"
                    )
        except BaseException:
            self._release(log)
            raise

    # -- reading --------------------------------------------------------------------------------

    async def list_sessions(self) -> list[SessionHeader]:
        """The headers of the intact sessions stored under the root, oldest first.

        A session whose log cannot be read is left out, with a warning naming it and why;
        :meth:`scan_sessions` reports it too.

        :raises NotADirectoryError: if the root is there but is not a directory.
        """
        listing = await self.scan_sessions()
        for problem in listing.problems:
            logger.warning(
                "session %s left out of the listing: %s", problem.directory, problem.error
            )
        return list(listing.headers)

    async def scan_sessions(self) -> SessionListing:
        """The headers of the intact sessions under the root, and the problems of the others.

        Reads only the header of each log. A session directory is one that holds a log (a
        ``session.jsonl`` or ``session.jsonl.zstd``, whatever it is), or a symbolic link
        (never followed), in a project directory (any directory of the root), or directly
        under the root in the earlier layout; other entries are not sessions. One bad session
        never hides the others.
        """
        listing = await anyio.to_thread.run_sync(self._scan_sessions)
        await checkpoint_if_cancelled()  # a listing cancelled meanwhile returns nothing
        return listing

    async def inspect(self, session_id: str, *, watch: Watch | None = None) -> StoredLog:
        """Read a log without changing anything; ``repair`` is what recovery would append.

        *watch*, if given, is called in a worker thread as the log is read, with its header
        and the events read so far (:data:`~.format.Watch`); what it raises stops the read.

        :raises SessionNotFoundError: if there is no log for *session_id*.
        :raises CorruptLogError: if the committed region is damaged.
        :raises UnsupportedFormatError: if the log has another format version, is not a
            session log, or holds an event of an unknown type not marked ignorable.
        :raises PersistenceError: if the log's header names another session.
        """
        found = await anyio.to_thread.run_sync(self._find_or_raise, session_id)
        read = partial(self._read_log, found.path, session_id, watch)
        scan, repair = await anyio.to_thread.run_sync(read)
        await checkpoint_if_cancelled()
        return StoredLog(scan.header, scan.events, repair, len(scan.torn), str(found.path))

    supports_raw_artifacts: Final = True
    """Whether :meth:`read_raw` gives a session's artifact (it does)."""

    def locate(self, session_id: str, cwd: str | None = None) -> SessionLocation:
        """Where the log of *session_id* (with working directory *cwd*) is, or would be
        created, in the compression this backend writes; no I/O (it may not exist).

        :raises InvalidSessionIdError: if the id (or *cwd*) cannot be stored.
        """
        directory = self.root / project_directory(cwd) / encode_session_id(session_id)
        name = ZSTD_LOG_NAME if self.compression == "zstd" else LOG_NAME
        return SessionLocation("jsonl", str(directory / name))

    async def revision(self, session_id: str) -> str | None:
        """The revision of the stored log of *session_id* (``None`` if there is none), from
        its file's metadata, without reading it: ``dev:ino:size:mtime:ctime``."""
        return await anyio.to_thread.run_sync(self._revision_if_any, session_id)

    def _revision_if_any(self, session_id: str) -> str | None:
        found = self._find(session_id)
        if found is None:
            return None
        try:
            return self.files.revision(found.path)
        except FileNotFoundError:
            return None

    async def list_snapshots(self) -> list[SessionSnapshot]:
        """The header and revision of each intact session under the root, oldest first; each
        log's header alone is read. A session that cannot be listed is left out, with a
        warning, as :meth:`list_sessions` leaves it out."""

        def snapshots() -> list[SessionSnapshot]:
            listing = self._scan_sessions()
            for problem in listing.problems:
                logger.warning(
                    "session %s left out of the listing: %s", problem.directory, problem.error
                )
            found = []
            for header, log in zip(listing.headers, listing.logs, strict=True):
                try:
                    found.append(SessionSnapshot(header, self.files.revision(log)))
                except FileNotFoundError:
                    continue  # removed since its header was read
            return found

        listed = await anyio.to_thread.run_sync(snapshots)
        await checkpoint_if_cancelled()
        return listed

    async def read_from(self, session_id: str, from_seq: int) -> StoredSuffix:
        """The stored events of *session_id* from seq *from_seq* on, exactly as stored: no
        closers, nothing cut (a torn tail is left out, as :meth:`inspect` leaves it out). A
        *from_seq* at or past the end gives no events. The log is read a chunk at a time, again
        if it changed meanwhile.

        :raises ValueError: if *from_seq* is not a non-negative integer.
        :raises SessionNotFoundError, CorruptLogError, UnsupportedFormatError: as
            :meth:`inspect`.
        """
        check_from_seq(from_seq)
        found = await anyio.to_thread.run_sync(self._find_or_raise, session_id)
        scan, revision = await anyio.to_thread.run_sync(self._stable_scan, found.path, session_id)
        await checkpoint_if_cancelled()
        return StoredSuffix(scan.header, from_seq, scan.events[from_seq:], revision)

    async def read_raw(self, session_id: str) -> RawArtifact | None:
        """The log of *session_id* as written, decompressed if it is compressed (``None`` if
        there is none): its header line, then its records, packed rows as packed.

        :raises CorruptLogError: if a whole frame of a compressed log is damaged.
        """

        def read() -> RawArtifact | None:
            found = self._find(session_id)
            if found is None:
                return None
            for _ in range(_STABLE_READS):
                try:
                    before = self.files.revision(found.path)
                    data = self.files.read(found.path)
                    after = self.files.revision(found.path)
                except FileNotFoundError:
                    return None
                if before == after:
                    header = read_header(data, found.path)
                    self._expected_log(header, found.path)
                    return RawArtifact(header, LOG_NAME, decode_artifact(data, found.path))
            raise LogChangedError(
                f"{found.path} changed during each of {_STABLE_READS} reads of it; another "
                "process keeps writing it"
            )

        artifact = await anyio.to_thread.run_sync(read)
        await checkpoint_if_cancelled()
        return artifact

    async def load(self, session_id: str) -> StoredLog:
        """Read a log with recovery: cut a torn tail (kept beside the log), close an open turn.

        The repair is made durable before this returns, so loading twice changes nothing more.
        A log in this project's earlier format is converted: written again, repaired, in the
        current layout and format, its old file renamed ``session.jsonl.migrated``.

        :raises LiveSessionError: if the session is live here and its turn is still open.
        :raises SessionLockedError: if another process is writing the session.
        :raises SessionNotFoundError, CorruptLogError, UnsupportedFormatError, PersistenceError:
            as :meth:`inspect`; nothing is changed.
        """
        return await super().load(session_id)

    def _find_or_raise(self, session_id: str) -> _Found:
        found = self._find(session_id)
        if found is None:
            raise SessionNotFoundError(f"no session {session_id!r} under {self.root}")
        return found

    def _recover(self, session_id: str) -> StoredLog:
        found = self._find_or_raise(session_id)
        if found.earlier:
            return self._convert(session_id, found.path)
        path = found.path
        directory = path.parent
        leftover = self.root / earlier_directory(session_id) / LOG_NAME
        unlocked: tuple[Scan, tuple[SessionEvent, ...]] | None = None
        held = self._take_held(session_id)  # loaded before, and not written since
        if held is None and not _exists(directory / LOCK_NAME) and not _exists(leftover):
            # No writer has held the session (writers create the lock file and never remove
            # it): read the log before creating one, so that a refused recovery, or one with
            # nothing to do outside a host, leaves nothing behind. A change is made, and a
            # lock kept for the session's first write in a host, under the lock.
            unlocked = scan, repair = self._read_log(path, session_id)
            if not (scan.torn or repair or scan.salvaged or self._task_group is not None):
                self._remember(session_id, path, scan.committed_bytes, len(scan.events))
                return StoredLog(scan.header, scan.events, (), 0, str(path))
        if held is None and unlocked is not None and not self.files.writable(path):
            # A change is needed, and could not be made: refuse before the lock file exists.
            raise PermissionError(
                errno.EACCES,
                f"cannot recover session {session_id!r}: its log needs a repair, and this "
                "process may not change it (inspect shows it)",
                str(path),
            )
        log = held or _Log(path, self._lock(session_id, directory))
        kept = False
        try:
            if unlocked is None or not self._unchanged(path, unlocked[0]):
                scan, repair = self._read_log(path, session_id)
            log.size = scan.committed_bytes
            if scan.torn:
                self._keep_torn(path, scan.committed_bytes, scan.torn)
            salvaged = scan.events[len(scan.events) - scan.salvaged :] if scan.salvaged else ()
            if scan.torn or repair or salvaged:
                if log.fd is None:
                    log.fd = self.files.open_append(path)
                fd = log.fd
                self.files.truncate(fd, scan.committed_bytes)
                self.files.fsync(fd)  # the cut is durable before anything follows it
                if repair or salvaged:
                    self._append_bytes(log, fd, self._encode(salvaged + repair, log.compression))
            if _exists(leftover):  # a conversion was interrupted after its new log was written
                self._retire_earlier(session_id, leftover)
            events = scan.events + repair
            kept = self._remember(session_id, path, log.size, len(events), log)
            return StoredLog(scan.header, events, repair, len(scan.torn), str(path))
        finally:
            if not kept:
                self._release(log)

    def _unchanged(self, path: Path, scan: Scan) -> bool:
        """Whether the log at *path* still holds what *scan* read of it (without the lock).

        Writers only append, and recovery cuts only the torn tail a scan of the same bytes
        finds: the committed bytes stay as they were, so the log is unchanged if what follows
        them is still the torn tail, and nothing more.
        """
        return self.files.read_from(path, scan.committed_bytes) == scan.torn

    def _convert(self, session_id: str, earlier: Path) -> StoredLog:
        """Recover a log in the earlier format into a new log in the current layout and format.

        The new log (header, every stored event, the repair, as one batch) is published
        atomically; only then is the old file renamed, so a crash in between leaves both, and
        the next recovery finds the new one and renames the old one.
        """
        old_lock = self._lock(session_id, earlier.parent)
        try:
            scan, repair = self._read_log(earlier, session_id)
            if scan.torn:
                self._keep_torn(earlier, scan.committed_bytes, scan.torn)
            directory = self._session_directory(NO_CWD, session_id)
            path = directory / ZSTD_LOG_NAME if self.compression == "zstd" else directory / LOG_NAME
            self.files.makedirs(directory)
            log = _Log(path, self._lock(session_id, directory))
            try:
                header = SessionHeader(session_id, scan.header.created_at)
                events = scan.events + repair
                data = _header_bytes(header, self.compression) + self._encode(
                    events, self.compression
                )
                self.files.publish(path, data)
                self._retire_earlier(session_id, earlier)
                self._remember(session_id, path, len(data), len(events))
            finally:
                self._release(log)
            return StoredLog(header, events, repair, len(scan.torn), str(path))
        finally:
            self.files.unlock(old_lock)

    def _retire_earlier(self, session_id: str, earlier: Path) -> None:
        """Rename a converted log of the earlier format, so that it is read no more."""
        target = earlier.with_name(earlier.name + MIGRATED_SUFFIX)
        attempt = 1
        while _exists(target):
            attempt += 1
            target = earlier.with_name(f"{earlier.name}{MIGRATED_SUFFIX}.{attempt}")
        self.files.rename(earlier, target)

    def _read_log(
        self, path: Path, session_id: str, watch: Watch | None = None
    ) -> tuple[Scan, tuple[SessionEvent, ...]]:
        """Read the log of *session_id* at *path*: what it holds, and the closers it needs.

        Bytes were cut after the events if they are torn now, or if a recovery cut them there
        and stopped before closing the turn (the bytes it kept are named after the offset);
        what that recovery salvaged from them is salvaged again from the kept copy.
        """
        scan, _ = self._stable_scan(path, session_id, watch)
        kept = _kept_copies(path, scan.committed_bytes)
        tail_cut = bool(scan.torn) or bool(kept)
        if not scan.torn and kept and path.name == ZSTD_LOG_NAME:
            # The last copy kept at this offset holds the bytes the last cut there removed.
            scan = _upgraded(salvage(scan, self.files.read(kept[-1]), path), path, session_id)
        return scan, repair_of(scan.events, partial(_corrupt_data, path), tail_cut=tail_cut)

    def _keep_torn(self, path: Path, offset: int, torn: bytes) -> None:
        """Keep the bytes cut at *offset* beside the log, unless the last copy kept there holds
        them already (an earlier attempt of this recovery kept them)."""
        kept = _kept_copies(path, offset)
        if kept and self.files.read(kept[-1]) == torn:
            return
        name = f"{path.name}.torn-{offset}"
        self.files.publish(path.with_name(f"{name}.{len(kept) + 1}" if kept else name), torn)

    def _scan_sessions(self) -> SessionListing:
        if not self.root.is_dir():
            if _exists(self.root):
                raise NotADirectoryError(
                    errno.ENOTDIR, "the session root is not a directory", str(self.root)
                )
            return SessionListing((), ())
        found: list[tuple[SessionHeader, Path]] = []
        earlier: list[tuple[SessionHeader, Path]] = []
        problems: list[SessionProblem] = []
        seen: dict[str, Path] = {}
        for entry in sorted(self.root.iterdir()):
            try:
                if entry.is_symlink():
                    _refuse_link(entry)
                if not entry.is_dir():
                    continue
                if _is_earlier_log(entry / LOG_NAME):  # a session of the earlier layout
                    log = entry / LOG_NAME
                    earlier.append((self._listed_header(log), log))
                    continue
                directories = sorted(entry.iterdir())
            except (PersistenceError, OSError) as exc:
                problems.append(SessionProblem(entry, exc))
                continue
            for directory in directories:
                try:
                    if directory.is_symlink():
                        _refuse_link(directory)
                    if directory.name.endswith((".jsonl", ".jsonl.zstd")) and not (
                        directory.is_dir()
                    ):
                        raise _flat_file(directory)
                    listed = self._log_in(directory) if directory.is_dir() else None
                    if listed is None:
                        continue  # not a session, or one whose log was never published
                    log = listed
                    header = self._listed_header(log)
                    if header.id in seen:
                        raise DuplicateLogError(
                            f"session {header.id!r} has logs in several project directories: "
                            f"{seen[header.id]} and {log}"
                        )
                    seen[header.id] = log
                    found.append((header, log))
                except (PersistenceError, OSError) as exc:
                    problems.append(SessionProblem(directory, exc))
        # A log left in the earlier layout by an interrupted conversion is not listed twice.
        found += [(header, log) for header, log in earlier if header.id not in seen]
        found.sort(key=lambda listed: (listed[0].created_at, listed[0].id))
        return SessionListing(
            tuple(header for header, _ in found),
            tuple(problems),
            tuple(log for _, log in found),
        )

    def _listed_header(self, log: Path) -> SessionHeader:
        header = read_header(self.files.read_head(log), log)
        self._expected_log(header, log)
        return header

    def _read(self, path: Path, session_id: str) -> bytes:
        try:
            return self.files.read(path)
        except FileNotFoundError:
            raise SessionNotFoundError(f"no session {session_id!r} under {self.root}") from None

    def _stable_scan(
        self, path: Path, session_id: str, watch: Watch | None = None
    ) -> tuple[Scan, str]:
        """Scan the log at *path* (a chunk at a time) until its revision is the same before and
        after: a scan that another process's append or repair overlapped is made again, as the
        original harness reads. Return the scan and that revision.

        *watch* sees the events as they are read, each scan's anew (:data:`~.format.Watch`),
        up to the batch holding the first record of an older shape, which only the whole scan
        converts (:mod:`..legacy`).

        :raises LogChangedError: if the log changed during each of several scans.
        """
        current = None if watch is None else _CurrentOnly(watch, session_id)
        for _ in range(_STABLE_READS):
            before = self._revision_of(path, session_id)
            scan = self._scan_session(path, session_id, watch=current)
            after = self._revision_of(path, session_id)
            if before == after:
                return _upgraded(scan, path, session_id), after
        raise LogChangedError(
            f"{path} changed during each of {_STABLE_READS} reads of it; another process keeps "
            "writing it"
        )

    def _revision_of(self, path: Path, session_id: str) -> str:
        try:
            return self.files.revision(path)
        except FileNotFoundError:
            raise SessionNotFoundError(f"no session {session_id!r} under {self.root}") from None

    def _scan_session(
        self,
        path: Path,
        session_id: str,
        data: bytes | None = None,
        *,
        watch: Watch | None = None,
    ) -> Scan:
        """Scan the log at *path* (or its bytes *data*), refusing a log whose header names
        another session (a copied log), or a place other than where it is (before *watch* sees
        any of it)."""
        checked = False

        def check(header: SessionHeader) -> None:
            nonlocal checked
            if not checked:
                if header.id != session_id:
                    raise MisplacedLogError(
                        f"{path} belongs to session {header.id!r}, not {session_id!r}; "
                        "refusing to read or change it as that session"
                    )
                self._expected_log(header, path)
                checked = True

        def watched(header: SessionHeader, events: StoredEvents) -> None:
            check(header)
            if watch is not None:
                watch(header, events)

        seen = None if watch is None else watched
        if data is not None:
            scan = scan_log(data, path, watch=seen)
        else:
            try:
                scan = scan_file(partial(self.files.reader, path), path, watch=seen)
            except FileNotFoundError:
                raise SessionNotFoundError(f"no session {session_id!r} under {self.root}") from None
        check(scan.header)
        return scan


def _upgraded(scan: Scan, path: Path, session_id: str) -> Scan:
    """*scan* with its older records converted (:mod:`..legacy`).

    :raises CorruptLogError: naming an older record that is malformed or retired.
    """
    try:
        events = upgrade_events(scan.events, session_id)
    except LegacyRecordError as error:
        raise CorruptLogError(path, None, error.problem, seq=error.seq) from None
    return scan if events is scan.events else replace(scan, events=events)


class _CurrentOnly:
    """A :data:`~.format.Watch` passing on the events of a scan up to the batch that holds the
    first record of an older shape (later ones are not passed on: the whole scan converts
    them); a scan started again is passed on from where the last one was checked."""

    __slots__ = ("_checked", "_events", "_older", "_session_id", "_watch")

    def __init__(self, watch: Watch, session_id: str) -> None:
        self._watch = watch
        self._session_id = session_id
        self._events: StoredEvents | None = None
        self._checked = 0
        self._older = False

    def __call__(self, header: SessionHeader, events: StoredEvents) -> None:
        if self._older:
            return
        if events is not self._events:  # a scan started again
            self._events, self._checked = events, 0
        if first_older(events, self._session_id, self._checked) is not None:
            self._older = True
            return
        self._checked = len(events)
        self._watch(header, events)


def _header_bytes(header: SessionHeader, compression: Compression) -> bytes:
    """The header record: a line, or a frame of its own in a compressed log."""
    line = encode_header(header)
    return compress_frame(line) if compression == "zstd" else line


def _flat_file(path: Path) -> UnsupportedFormatError:
    return UnsupportedFormatError(
        f"{path} is a session log in the obsolete flat-file layout (<project>/<id>.jsonl); "
        "a log is read only from its session's directory (<project>/<id>/session.jsonl): move "
        "it there, or use another root"
    )


def _refuse_link(directory: Path) -> NoReturn:
    raise InvalidSessionIdError(
        f"{directory} is a symbolic link; refusing to follow it out of the root"
    )


def _kept_copies(path: Path, offset: int) -> list[Path]:
    """The copies of torn tails cut from *path* at *offset*, oldest first: ``.torn-<offset>``,
    then ``.torn-<offset>.2`` and on, each kept by a later cut at that offset."""
    name = f"{path.name}.torn-{offset}"
    copies: list[Path] = []
    while _exists(candidate := path.with_name(f"{name}.{len(copies) + 1}" if copies else name)):
        copies.append(candidate)
    return copies


def _exists(path: Path) -> bool:
    """Whether anything has the name *path*: a dangling symbolic link does too."""
    return path.is_symlink() or path.exists()


def _is_earlier_log(path: Path) -> bool:
    """Whether *path* names a log of the earlier layout (anything but a directory: a session
    directory of the current layout may have that name)."""
    return path.is_symlink() or (path.exists() and not path.is_dir())
