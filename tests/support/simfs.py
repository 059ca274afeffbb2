"""A simulated file layer that owns the bytes, to show what a power loss can leave behind.

:class:`SimFiles` replaces :class:`~kai_session_checkpoint_policy.persistence.OsFiles` under the
JSONL backend, method for method, in the manner of LazyFS and SQLite's crash VFS: SIGKILL lets
the kernel write the page cache out, so it cannot show a lost write; this layer can.

The model
    Every file has two contents: ``cache``, what reads see (the page cache), and ``disk``, what
    survives a power loss, plus the data operations (writes, truncates) made since its last
    fsync. ``fsync`` applies those operations to ``disk`` and persists the size. Every
    directory likewise has its entries, its durable entries, and the entry changes (create,
    mkdir, link, unlink) made since its last directory fsync. A file reachable only through an
    entry that is not durable may vanish.

Crash images (:func:`crash_images`)
    From any recorded state: the durable contents, then a prefix of each file's pending
    operations, the last one possibly damaged: cut short (a prefix), its tail left as zeros or
    as garbage (the appended-region states of ALICE and SQLite's ``test6.c``), or, with
    *sectors*, each 512-byte sector of it independently old, new or garbage. Pending directory
    changes are all lost or all kept.

One sync for many files
    ``syncfs`` applies every file's pending operations, as an fsync of each would; directory
    entries are left to directory fsyncs (the backend never counts on ``syncfs`` for them). A
    failed ``syncfs`` persists what a failed fsync would of each file, and the next fsync of
    each file that lost changes fails, as Linux reports a failed write-back to every handle of
    the file.

Faults (:class:`FaultPlan`)
    The *nth* call of one kind of operation fails, once or from then on. A failed write first
    writes half of its data (a short write, then the error). A failed fsync (of a file or of a
    directory) leaves nothing (even *seed*) or an arbitrary prefix (odd *seed*) of the pending
    changes on disk and marks the rest clean, as Linux does: a later fsync does not write them
    again (PostgreSQL's "fsyncgate").

The backend also asks the real file system whether paths exist; the layer therefore mirrors its
namespace (not its bytes) as empty files and directories under the real *base* directory.

Keeping it honest (:class:`RecordingOs`)
    The layer re-implements the composite steps of the real one (``makedirs``, ``publish``).
    :class:`RecordingOs` stands in for :mod:`os` under the real layer, records its calls and
    injects the same faults, so that tests can require both layers to make the same calls.

Recovering images (:class:`Explorer`, :func:`explore`)
    Every image is recovered by a fresh backend on a layer holding it, loaded again after a
    second power loss, and checked with :func:`~.invariants.check_recovery`; a log refused as
    corrupt instead is checked with :func:`~.invariants.refusal_problems`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import re
import tempfile
import threading
import zlib
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Final, Literal, TypeAlias, TypeVar

import anyio

from kai_session_checkpoint_policy.persistence import (
    CorruptLogError,
    JsonlSessionPersistence,
    LockedError,
    OsFiles,
    SessionNotFoundError,
    StoredLog,
)
from kai_session_checkpoint_policy.persistence.jsonl.files import TEMPORARY_NAME

from .crash_child import MemoryRecorder, Workload, run_workload
from .invariants import Expected, check_recovery, refusal_problems

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

__all__ = [
    "DIR",
    "FAULT_KINDS",
    "STORE",
    "CrashImage",
    "Explorer",
    "FaultPlan",
    "Mirror",
    "RecordingOs",
    "SimFiles",
    "SimState",
    "crash_images",
    "durable_image_of",
    "explore",
    "materialize",
    "normalized",
]

T = TypeVar("T")

DIR: Final = -1
"""The node of a directory entry; files are numbered from 0."""
SECTOR: Final = 512

FaultKind: TypeAlias = Literal[
    "open", "write", "fsync", "fsync_dir", "truncate", "link", "mkdir", "syncfs"
]
FAULT_KINDS: Final[tuple[FaultKind, ...]] = (
    "open",
    "write",
    "fsync",
    "fsync_dir",
    "truncate",
    "link",
    "mkdir",
)
_FAULT_ERRNO: Final[Mapping[str, int]] = {
    "open": errno.EMFILE,
    "write": errno.ENOSPC,
    "fsync": errno.EIO,
    "fsync_dir": errno.EIO,
    "truncate": errno.EIO,
    "link": errno.ENOSPC,
    "mkdir": errno.ENOSPC,
    "syncfs": errno.EIO,
}

# A pending data operation: ("write", offset, data) or ("truncate", size, b"").
Op: TypeAlias = tuple[Literal["write", "truncate"], int, bytes]
# A pending directory change: (entry, node), node None for a removal.
EntryChange: TypeAlias = tuple[str, int | None]
CrashImage: TypeAlias = "dict[str, bytes | None]"
"""Relative path to file content, or ``None`` for a directory; ``""`` is the base."""


@dataclass(frozen=True, slots=True)
class FileState:
    cache: bytes = b""
    disk: bytes = b""
    pending: tuple[Op, ...] = ()


@dataclass(frozen=True, slots=True)
class SimState:
    """Everything a crash could keep, at one moment; immutable, so recording it is cheap."""

    clock: int
    files: Mapping[int, FileState]
    names: Mapping[str, int]
    disk_names: Mapping[str, int]
    dir_pending: Mapping[str, tuple[EntryChange, ...]]


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Fail the *nth* (1-based) operation of *kind*; with *persistent*, every later one too.

    With *name*, only operations on files of that name count (``"session.jsonl"`` picks the
    appends to a log, not the writes of a file being published).
    """

    kind: FaultKind
    nth: int
    persistent: bool = False
    name: str | None = None

    def __str__(self) -> str:
        on = f"@{self.name}" if self.name else ""
        return f"{self.kind}{on}#{self.nth}{'+' if self.persistent else ''}"


class _Faults:
    """Counts the operations each :class:`FaultPlan` applies to, and raises its faults."""

    def __init__(self, plans: Sequence[FaultPlan]) -> None:
        self.plans: Final = tuple(plans)
        self.seen = [0] * len(self.plans)
        self.injected = 0

    def check(self, kind: FaultKind, path: str) -> None:
        for index, plan in enumerate(self.plans):
            if plan.kind != kind or (plan.name and PurePosixPath(path).name != plan.name):
                continue
            count = self.seen[index] = self.seen[index] + 1
            if count == plan.nth or (plan.persistent and count > plan.nth):
                self.injected += 1
                code = _FAULT_ERRNO[kind]
                raise OSError(code, f"{os.strerror(code)} (injected: {plan} at {count})", path)


@dataclass(slots=True)
class _Handle:
    node: int
    path: str
    lock: bool = False


class Mirror:
    """The names (not the bytes) of a simulated tree, kept as empty files under a real *base*.

    Several layers may share one mirror in turn: each syncs it to its own names when created,
    so consecutive crash images cost only the names that differ.
    """

    def __init__(self, base: Path) -> None:
        self.base: Final = base
        self.names: dict[str, bool] = {"": True}  # relative path -> is a directory

    def add(self, path: str, directory: bool) -> None:
        real = self.base / path
        if directory:
            real.mkdir(exist_ok=True)
        else:
            real.touch()
        self.names[path] = directory

    def remove(self, path: str) -> None:
        real = self.base / path
        if self.names.pop(path, False):
            for child in [name for name in self.names if name.startswith(f"{path}/")]:
                self.remove(child)
            real.rmdir()
        else:
            real.unlink(missing_ok=True)

    def sync(self, names: Mapping[str, int]) -> None:
        """Make the real tree hold exactly *names*."""
        wanted = {path: node == DIR for path, node in names.items()}
        for path in sorted(self.names, key=lambda p: -p.count("/")):
            if path in self.names and path and wanted.get(path) != self.names[path]:
                self.remove(path)
        for path in sorted(wanted, key=lambda p: p.count("/")):
            if path not in self.names:
                self.add(path, wanted[path])


def _apply(content: bytes, op: Op) -> bytes:
    kind, where, data = op
    if kind == "truncate":
        return content[:where].ljust(where, b"\0")
    start = content[:where].ljust(where, b"\0")
    return start + data + content[where + len(data) :]


def _apply_all(content: bytes, ops: tuple[Op, ...]) -> bytes:
    for op in ops:
        content = _apply(content, op)
    return content


def _synced(state: FileState) -> FileState:
    """*state* once a sync wrote every pending operation, and the size, to the disk."""
    disk = _apply_all(state.disk, state.pending)
    return FileState(state.cache, disk[: len(state.cache)].ljust(len(state.cache), b"\0"))


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


class SimFiles(OsFiles):
    """An in-memory file layer under the real directory *base*; see the module docstring.

    :param base: An existing directory; every path the backend uses must lie under it.
    :param image: The durable contents to start from (default: nothing but *base*).
    :param mirror: The mirror of *base* to reuse (it must be the only writer under *base*).
    :param seed: Seeds the garbage and the partial persistence of a failed fsync.
    :param faults: The faults to inject.
    :param record: Keep a :class:`SimState` after every change, for :func:`crash_images`.
    """

    def __init__(
        self,
        base: Path,
        *,
        image: CrashImage | None = None,
        mirror: Mirror | None = None,
        seed: int = 0,
        faults: Sequence[FaultPlan] = (),
        record: bool = False,
    ) -> None:
        super().__init__()
        self.base: Final = base
        self.mirror: Final = Mirror(base) if mirror is None else mirror
        self._faults = _Faults(faults)
        self.seed = seed
        self.rng = random.Random(seed)
        self.clock = 0
        """The number of changes made so far; :attr:`states` ``[i]`` follows change ``i``."""
        self.trace: list[tuple[str, str]] = []
        """Every operation as ``(kind, relative path)``, to compare with the real layer."""
        self._lock = threading.Lock()
        self._files: dict[int, FileState] = {}
        self._names: dict[str, int] = {"": DIR}
        self._disk_names: dict[str, int] = {"": DIR}
        self._dir_pending: dict[str, tuple[EntryChange, ...]] = {}
        self._handles: dict[int, _Handle] = {}
        self._unreported: set[int] = set()  # files whose lost write-back no fsync reported yet
        self._next_fd = 1000
        self._tmp = 0
        for path, content in (image or {}).items():
            if content is None:
                self._names[path] = DIR
            else:
                self._names[path] = node = len(self._files)
                self._files[node] = FileState(content, content)
        self._disk_names = dict(self._names)
        self.mirror.sync(self._names)
        self.record = record
        self.states: list[SimState] = []
        if record:
            self.states.append(self.snapshot())

    def lose_unsynced(self) -> None:
        """Simulate a power loss that keeps only what is durable; open handles are dropped."""
        with self._lock:
            self._names = dict(self._disk_names)
            self._files = {node: FileState(f.disk, f.disk) for node, f in self._files.items()}
            self._dir_pending.clear()
            self._handles.clear()
            self._unreported.clear()
            self.mirror.sync(self._names)
            self._changed()

    # -- bookkeeping -----------------------------------------------------------------------------

    @property
    def injected(self) -> int:
        """How many faults were injected."""
        return self._faults.injected

    def open_handles(self) -> list[str]:
        """The files that are open (each once per handle), locks included."""
        with self._lock:
            return sorted(handle.path for handle in self._handles.values())

    def snapshot(self) -> SimState:
        return SimState(
            self.clock,
            dict(self._files),
            dict(self._names),
            dict(self._disk_names),
            dict(self._dir_pending),
        )

    def now(self) -> int:
        """The current clock, read under the lock (from the event loop thread)."""
        with self._lock:
            return self.clock

    def cache_image(self) -> CrashImage:
        """What a process crash right now would leave: everything written, synced or not."""
        with self._lock:
            return _image(self._names, {n: f.cache for n, f in self._files.items()})

    def durable_image(self) -> CrashImage:
        """What a power loss right now would leave if no pending change reached the disk."""
        with self._lock:
            return _image(self._disk_names, {n: f.disk for n, f in self._files.items()})

    def _changed(self) -> None:
        self.clock += 1
        if self.record:
            self.states.append(self.snapshot())

    def _rel(self, path: Path) -> str:
        rel = path.relative_to(self.base).as_posix()
        return "" if rel == "." else rel

    def _check(self, kind: FaultKind, path: str) -> None:
        self._faults.check(kind, path)

    def _survivors(self, pending: tuple[T, ...]) -> tuple[T, ...]:
        """What of *pending* a failed sync got to the disk; the rest is lost, and clean.

        With an even seed, nothing; with an odd seed, an arbitrary prefix.
        """
        if self.seed % 2 == 0:
            return ()
        return pending[: self.rng.randint(0, len(pending))]

    def _entry(self, path: str, node: int | None) -> None:
        parent = _parent(path)
        if node is None:
            del self._names[path]
            self.mirror.remove(path)
        else:
            self._names[path] = node
            self.mirror.add(path, node == DIR)
        self._dir_pending[parent] = (*self._dir_pending.get(parent, ()), (path, node))

    def _file(self, path: str) -> int:
        node = self._names.get(path)
        if node is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(self.base / path))
        if node == DIR:
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(self.base / path))
        return node

    def _open(self, node: int, path: str, *, lock: bool = False) -> int:
        fd = self._next_fd
        self._next_fd += 1
        self._handles[fd] = _Handle(node, path, lock)
        return fd

    def _new_file(self, path: str) -> int:
        node = len(self._files)
        self._files[node] = FileState()
        self._entry(path, node)
        return node

    # -- directories ---------------------------------------------------------------------------

    def makedirs(self, path: Path) -> None:
        with self._lock:
            rel = self._rel(path)
            missing: list[str] = []
            current = rel
            while current not in self._names:
                missing.append(current)
                current = _parent(current)
            for directory in reversed(missing):
                self.trace.append(("mkdir", directory))
                self._check("mkdir", directory)
                self._entry(directory, DIR)
                self._changed()
                try:
                    self._fsync_dir_locked(_parent(directory))
                except OSError:
                    self.trace.append(("rmdir", directory))
                    self._entry(directory, None)
                    self._changed()
                    raise
            if self._names.get(rel) != DIR:
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))

    def fsync_dir(self, path: Path) -> None:
        with self._lock:
            self._fsync_dir_locked(self._rel(path))

    def _fsync_dir_locked(self, rel: str) -> None:
        self.calls["fsync_dir"] += 1
        self.trace.append(("fsync_dir", rel))
        pending = self._dir_pending.pop(rel, ())
        try:
            self._check("fsync_dir", rel)
        except OSError:
            for path, node in self._survivors(pending):
                _change(self._disk_names, path, node)
            self._changed()
            raise
        for path, node in pending:
            _change(self._disk_names, path, node)
        self._changed()

    # -- whole files ---------------------------------------------------------------------------

    def publish(self, path: Path, data: bytes) -> None:
        with self._lock:
            rel = self._rel(path)
            temporary = f"{rel}.{self._tmp:012x}.tmp"
            while temporary in self._names:  # the real layer's 48 random bits never collide
                self._tmp += 1
                temporary = f"{rel}.{self._tmp:012x}.tmp"
            self.trace.append(("create", temporary))
            self._check("open", temporary)
            node = self._new_file(temporary)
            self._changed()
            fd = self._open(node, temporary)
        try:
            try:
                self.write(fd, data)
                self.fsync(fd)
            finally:
                self.close(fd)
            with self._lock:
                self.trace.append(("link", rel))
                self._check("link", rel)
                if rel in self._names:
                    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
                self._entry(rel, node)
                self._changed()
            try:
                self.fsync_dir(path.parent)
            except BaseException:
                with self._lock:
                    self.trace.append(("unlink", rel))
                    if rel in self._names:
                        self._entry(rel, None)
                        self._changed()
                raise
        finally:
            with self._lock:
                self.trace.append(("unlink", temporary))
                if temporary in self._names:
                    self._entry(temporary, None)
                    self._changed()

    def remove_temporaries(self, directory: Path) -> None:
        with self._lock:
            rel = self._rel(directory)
            for path, node in list(self._names.items()):
                name = PurePosixPath(path).name
                if _parent(path) == rel and node != DIR and TEMPORARY_NAME.fullmatch(name):
                    self.trace.append(("unlink", path))
                    self._entry(path, None)
                    self._changed()

    def read(self, path: Path) -> bytes:
        with self._lock:
            rel = self._rel(path)
            self.trace.append(("open-read", rel))
            self._check("open", rel)
            return self._files[self._file(rel)].cache

    @contextlib.contextmanager
    def reader(self, path: Path) -> Iterator[Callable[[int], bytes]]:
        data = self.read(path)
        position = 0

        def read(size: int) -> bytes:
            nonlocal position
            piece = data[position : position + size]
            position += len(piece)
            return piece

        yield read

    def revision(self, path: Path) -> str:
        with self._lock:
            node = self._file(self._rel(path))
            return f"{node}:{len(self._files[node].cache)}"

    def read_first_line(self, path: Path, limit: int = 1 << 16) -> bytes:
        data = self.read(path)[:limit]
        end = data.find(b"\n")
        return data if end < 0 else data[: end + 1]

    def writable(self, path: Path) -> bool:
        return True  # the simulated disk has no permissions

    def read_head(self, path: Path, limit: int = 1 << 16) -> bytes:
        return self.read(path)[:limit]

    def read_from(self, path: Path, offset: int) -> bytes:
        return self.read(path)[offset:]

    def rename(self, source: Path, target: Path) -> None:
        with self._lock:
            old, new = self._rel(source), self._rel(target)
            self.trace.append(("rename", new))
            if new in self._names:
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
            node = self._file(old)
            self._entry(new, node)
            self._entry(old, None)
            self._changed()
        self.fsync_dir(target.parent)

    # -- appending -----------------------------------------------------------------------------

    def open_append(self, path: Path) -> int:
        with self._lock:
            rel = self._rel(path)
            self.trace.append(("open-append", rel))
            self._check("open", rel)
            return self._open(self._file(rel), rel)

    def write(self, fd: int, data: bytes) -> None:
        if not data:
            return  # the real layer makes no call at all
        with self._lock:
            handle = self._handles[fd]
            self.calls["write"] += 1
            self.trace.append(("write", handle.path))
            try:
                self._check("write", handle.path)
            except OSError:
                self._write_locked(handle, data[: len(data) // 2])
                raise
            self._write_locked(handle, data)

    def _write_locked(self, handle: _Handle, data: bytes) -> None:
        if not data:
            return
        state = self._files[handle.node]
        op: Op = ("write", len(state.cache), bytes(data))
        self._files[handle.node] = FileState(
            _apply(state.cache, op), state.disk, (*state.pending, op)
        )
        self._changed()

    def fsync(self, fd: int) -> None:
        with self._lock:
            handle = self._handles[fd]
            self.calls["fsync"] += 1
            self.trace.append(("fsync", handle.path))
            state = self._files[handle.node]
            if handle.node in self._unreported:  # a failed syncfs lost some of its changes
                self._unreported.discard(handle.node)
                raise OSError(errno.EIO, "write-back failed before this fsync", handle.path)
            try:
                self._check("fsync", handle.path)
            except OSError:
                kept = self._survivors(state.pending)
                self._files[handle.node] = FileState(state.cache, _apply_all(state.disk, kept))
                self._changed()
                raise
            self._files[handle.node] = _synced(state)
            self._changed()

    # -- one sync for many files ----------------------------------------------------------------

    def filesystem(self, fd: int) -> int | None:
        with self._lock:
            self._handles[fd]
        return 0  # one filesystem, whose syncfs may stand in for fsyncs

    def open_filesystem(self, directory: Path) -> int:
        with self._lock:
            return self._open(DIR, self._rel(directory))

    def syncfs(self, fd: int) -> None:
        """Every file's pending data reaches the disk (its directory entries are left to
        directory fsyncs, which the backend makes anyway). A failed syncfs keeps what
        :meth:`_survivors` keeps of each file's changes and marks the rest clean, as a failed
        fsync does; the next fsync of each file that lost changes then fails, as Linux reports a
        failed write-back to every handle of the file."""
        with self._lock:
            handle = self._handles[fd]
            self.calls["syncfs"] += 1
            self.trace.append(("syncfs", handle.path))
            try:
                self._check("syncfs", handle.path)
            except OSError:
                for node, state in list(self._files.items()):
                    if state.pending:
                        kept = self._survivors(state.pending)
                        self._files[node] = FileState(state.cache, _apply_all(state.disk, kept))
                        if kept != state.pending:
                            self._unreported.add(node)
                self._changed()
                raise
            for node, state in list(self._files.items()):
                if state.pending:
                    self._files[node] = _synced(state)
            self._changed()

    def truncate(self, fd: int, size: int) -> None:
        with self._lock:
            handle = self._handles[fd]
            self.calls["truncate"] += 1
            self.trace.append(("truncate", handle.path))
            self._check("truncate", handle.path)
            state = self._files[handle.node]
            op: Op = ("truncate", size, b"")
            self._files[handle.node] = FileState(
                _apply(state.cache, op), state.disk, (*state.pending, op)
            )
            self._changed()

    def close(self, fd: int) -> None:
        with self._lock:
            del self._handles[fd]

    # -- locking -------------------------------------------------------------------------------

    def lock(self, path: Path) -> int:
        with self._lock:
            rel = self._rel(path)
            self.trace.append(("open-lock", rel))
            self._check("open", rel)
            if rel not in self._names:
                self._new_file(rel)
                self._changed()
            if any(handle.lock and handle.path == rel for handle in self._handles.values()):
                raise LockedError(errno.EWOULDBLOCK, "locked by another writer", str(path))
            return self._open(self._file(rel), rel, lock=True)

    def unlock(self, fd: int) -> None:
        self.close(fd)


def _change(names: dict[str, int], path: str, node: int | None) -> None:
    if node is None:
        names.pop(path, None)
    else:
        names[path] = node


def _image(names: Mapping[str, int], contents: Mapping[int, bytes]) -> CrashImage:
    """The files and directories reachable through *names*, with their *contents*."""
    image: CrashImage = {}
    for path in sorted(names, key=lambda p: (p.count("/"), p)):
        parent = _parent(path)
        if path and not (parent in image and image[parent] is None):
            continue  # its directory did not survive
        node = names[path]
        image[path] = None if node == DIR else contents[node]
    return image


def _cuts(data: bytes) -> list[int]:
    """Where to cut a write short: around its first and last lines, and in its middle."""
    newlines = [index for index, byte in enumerate(data) if byte == 0x0A]
    cuts = {1, len(data) // 2, len(data) - 1}
    cuts.update(index + 1 for index in newlines[:3] + newlines[-2:])
    cuts.update(newlines[:2] + newlines[-1:])
    return sorted(cut for cut in cuts if 0 < cut < len(data))


def _damaged(data: bytes, seed: int, *, sectors: bool) -> Iterator[tuple[str, bytes]]:
    """What a write of *data* may have left when the power went: everything but all of it.

    The garbage depends only on *seed* and *data*, so equal states give equal images.
    """
    rng = random.Random(seed ^ zlib.crc32(data))
    for cut in _cuts(data):
        yield f"prefix {cut}", data[:cut]
    for cut in sorted({0, len(data) // 2}):
        yield f"zeros after {cut}", data[:cut] + bytes(len(data) - cut)
        yield f"garbage after {cut}", data[:cut] + rng.randbytes(len(data) - cut)
    if sectors and len(data) > SECTOR:
        for attempt in range(2):
            mixed = bytearray()
            for start in range(0, len(data), SECTOR):
                piece = data[start : start + SECTOR]
                choice = rng.randrange(3)
                if choice == 0:
                    mixed += piece
                elif choice == 1:
                    mixed += bytes(len(piece))
                else:
                    mixed += rng.randbytes(len(piece))
            yield f"sectors {attempt}", bytes(mixed)


def crash_images(
    state: SimState, seed: int = 0, *, sectors: bool = False
) -> Iterator[tuple[str, CrashImage]]:
    """The states a power loss at *state* may leave on disk, each with a short description."""
    name_variants: list[tuple[str, Mapping[str, int]]] = [("entries lost", state.disk_names)]
    if any(state.dir_pending.values()):
        kept = dict(state.disk_names)
        for changes in state.dir_pending.values():
            for path, node in changes:
                _change(kept, path, node)
        name_variants.append(("entries kept", kept))
    lost = {node: file.disk for node, file in state.files.items()}
    synced = {
        node: _apply_all(file.disk, file.pending)[: len(file.cache)].ljust(len(file.cache), b"\0")
        for node, file in state.files.items()
    }
    content_variants: list[tuple[str, Mapping[int, bytes]]] = [("data lost", lost)]
    if synced != lost:
        content_variants.append(("data kept", synced))
    for node, file in state.files.items():
        for index, (kind, offset, data) in enumerate(file.pending):
            before = _apply_all(file.disk, file.pending[:index])
            if index:
                partial = dict(lost)
                partial[node] = before
                content_variants.append((f"file {node}: first {index} ops", partial))
            if kind != "write":
                continue
            for how, piece in _damaged(data, seed, sectors=sectors):
                damaged = dict(lost)
                damaged[node] = _apply(before, ("write", offset, piece))
                content_variants.append((f"file {node} op {index}: {how}", damaged))
    for names_how, names in name_variants:
        for content_how, contents in content_variants:
            yield f"{names_how}, {content_how}", _image(names, contents)


def materialize(image: CrashImage, directory: Path) -> None:
    """Write *image* under the existing, empty *directory*."""
    for path, content in image.items():
        if not path:
            continue
        target = directory / path
        if content is None:
            target.mkdir()
        else:
            target.write_bytes(content)


# -- the real layer, recorded ------------------------------------------------------------------


class RecordingOs:
    """Stands in for :mod:`os` inside the real file layer: notes each call, may fail one.

    Install it as the ``os`` of :mod:`kai_session_checkpoint_policy.persistence.jsonl.files` (with
    ``monkeypatch``); its :attr:`trace` then compares with :attr:`SimFiles.trace`, and *faults*
    fail the same operations the same way (a failing write writes half of its data first).
    """

    def __init__(self, base: Path, faults: Sequence[FaultPlan] = ()) -> None:
        self.base = base
        self.trace: list[tuple[str, str]] = []
        self._paths: dict[int, tuple[str, bool]] = {}
        self._faults = _Faults(faults)

    def _check(self, kind: FaultKind, path: str) -> None:
        self._faults.check(kind, path)

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def _rel(self, path: str | os.PathLike[str]) -> str:
        rel = Path(path).relative_to(self.base).as_posix()
        return "" if rel == "." else rel

    def open(self, path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
        rel, directory = self._rel(path), bool(flags & os.O_DIRECTORY)
        if not directory:
            if flags & os.O_EXCL:
                kind = "create"
            elif flags & os.O_CREAT:
                kind = "open-lock"
            elif flags & os.O_APPEND:
                kind = "open-append"
            else:
                kind = "open-read"
            self.trace.append((kind, rel))
            self._check("open", rel)
        fd = os.open(path, flags, mode)
        self._paths[fd] = (rel, directory)
        return fd

    def write(self, fd: int, data: bytes) -> int:
        rel = self._paths[fd][0]
        self.trace.append(("write", rel))
        try:
            self._check("write", rel)
        except OSError:
            os.write(fd, bytes(data[: len(data) // 2]))
            raise
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        rel, directory = self._paths[fd]
        self.trace.append(("fsync_dir" if directory else "fsync", rel))
        self._check("fsync_dir" if directory else "fsync", rel)
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        self.trace.append(("truncate", self._paths[fd][0]))
        self._check("truncate", self._paths[fd][0])
        os.ftruncate(fd, size)

    def mkdir(self, path: str | os.PathLike[str], mode: int = 0o777) -> None:
        self.trace.append(("mkdir", self._rel(path)))
        self._check("mkdir", self._rel(path))
        os.mkdir(path, mode)

    def rmdir(self, path: str | os.PathLike[str]) -> None:
        self.trace.append(("rmdir", self._rel(path)))
        os.rmdir(path)

    def link(self, source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        self.trace.append(("link", self._rel(target)))
        self._check("link", self._rel(target))
        os.link(source, target)


def normalized(trace: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Temporary names are random in the real layer; ``unlink`` goes through :mod:`pathlib`."""
    return [
        (kind, re.sub(r"\.[0-9a-f]{12}\.tmp$", ".TMP", path))
        for kind, path in trace
        if kind != "unlink"
    ]


# -- recovering crash images -------------------------------------------------------------------

STORE: Final = "store"
"""The backend's root, relative to the simulated base."""
CROSS_CHECK_EVERY: Final = 40


def durable_image_of(state: SimState) -> CrashImage:
    """The image a power loss at *state* leaves when no pending change reached the disk."""
    return _image(state.disk_names, {node: file.disk for node, file in state.files.items()})


class Explorer:
    """Recovers the crash images of one workload run and checks each; counts what it did.

    Each image is recovered under the same real directory (only the names that differ from the
    previous image are touched there) by a fresh backend on a :class:`SimFiles` holding the
    image; the same layer then loses everything recovery left unsynced, and a second fresh
    backend loads the sessions again: recovery must have been durable and must not change
    anything the second time.
    """

    def __init__(self, base: Path, recorder: MemoryRecorder, *, sectors: bool = False) -> None:
        self.base = base
        self.mirror = Mirror(base)
        self.recorder = recorder
        self.sectors = sectors
        self.seen: set[tuple[tuple[str, bytes | None], ...]] = set()
        self.images = 0
        self.checks = 0
        self.refusals = 0
        """Images refused as corrupt without losing or misreporting an acknowledged event."""
        self.violations: list[str] = []
        self.samples: list[tuple[CrashImage, dict[str, StoredLog | None]]] = []
        self.recoveries: list[
            tuple[CrashImage, dict[str, Expected], list[SimState], dict[str, StoredLog | None]]
        ] = []
        """Images whose recovery changed something: the image, what its crash must keep, the
        states of its recovery, and the recovered logs."""

    def expected(self, clock: int) -> dict[str, Expected]:
        """What a crash after change *clock* of the live run must preserve, by session."""
        recorder = self.recorder
        return {
            session_id: Expected(
                tuple(events),
                recorder.acknowledged_at(session_id, clock),
                recorder.started_at(session_id, clock),
            )
            for session_id, events in recorder.events.items()
        }

    async def load_all(self, sim: SimFiles) -> dict[str, StoredLog | CorruptLogError | None]:
        backend = JsonlSessionPersistence(self.base / STORE, files=sim)
        loaded: dict[str, StoredLog | CorruptLogError | None] = {}
        for session_id in self.recorder.events:
            try:
                loaded[session_id] = await backend.load(session_id)
            except SessionNotFoundError:
                loaded[session_id] = None
            except CorruptLogError as exc:
                loaded[session_id] = exc
        return loaded

    async def check(
        self,
        image: CrashImage,
        expected: dict[str, Expected],
        how: str,
        *,
        exact: dict[str, StoredLog | None] | None = None,
    ) -> None:
        """Recover every session from *image*, load it again, and check both loads.

        With *exact*, the recovered logs must also equal those (a recovery that was itself
        interrupted must end where an uninterrupted one did).
        """
        key = tuple(sorted(image.items()))
        if key in self.seen:
            return
        self.seen.add(key)
        self.images += 1
        sim = SimFiles(self.base, image=image, mirror=self.mirror, record=True)
        first = await self.load_all(sim)
        after = sim.cache_image()
        states = list(sim.states)
        sim.lose_unsynced()
        second = await self.load_all(sim)
        recovered_logs: dict[str, StoredLog | None] = {}
        for session_id, recovered in first.items():
            self.checks += 1
            where = f"{how}, session {session_id}"
            if isinstance(recovered, CorruptLogError):
                log = recovered.path.relative_to(self.base).as_posix()
                stored, left = image[log], after.get(log)
                assert stored is not None  # a refusal names a log it read
                found = refusal_problems(recovered, stored, left, expected[session_id])
                self.violations += [f"{where}: {problem}" for problem in found]
                self.refusals += not found
                continue
            reloaded = second[session_id]
            if isinstance(reloaded, CorruptLogError):
                self.violations.append(f"{where}: the second load failed: {reloaded}")
                continue
            wanted = None if exact is None else exact.get(session_id)
            # A recovery that was interrupted and run again cut what the first attempt did.
            tail_cut = None if wanted is None else wanted.torn_bytes > 0
            found = check_recovery(recovered, reloaded, expected[session_id], tail_cut=tail_cut)
            if wanted is not None and recovered is not None and recovered.events != wanted.events:
                found.append("an interrupted recovery ends elsewhere than an uninterrupted one")
            self.violations += [f"{where}: {problem}" for problem in found]
            recovered_logs[session_id] = recovered
        if exact is None and len(states) > 1:
            self.recoveries.append((image, expected, states, recovered_logs))
        if self.images % CROSS_CHECK_EVERY == 1:
            self.samples.append((image, recovered_logs))

    async def cross_check(self, scratch: Path) -> int:
        """Recover sampled images again on the real file system; the results must agree."""
        for index, (image, simulated) in enumerate(self.samples):
            directory = scratch / f"real-{index}"
            directory.mkdir()
            materialize(image, directory)
            backend = JsonlSessionPersistence(directory / STORE)
            for session_id, expected in simulated.items():
                try:
                    real: StoredLog | None = await backend.load(session_id)
                except SessionNotFoundError:
                    real = None
                if expected is None or real is None:
                    agree = expected is real
                else:
                    agree = (real.events, real.repair) == (expected.events, expected.repair)
                if not agree:
                    self.violations.append(f"real recovery of sample {index} differs: {real}")
        return len(self.samples)

    async def explore(self, states: list[SimState], seed: int) -> None:
        """Check every image of every state, the latest state first (it expects the most)."""
        for state in reversed(states):
            expected = self.expected(state.clock)
            for how, image in crash_images(state, seed, sectors=self.sectors):
                await self.check(image, expected, f"{how}, after change {state.clock}")

    @staticmethod
    def as_written(
        expected: dict[str, Expected], recovered: dict[str, StoredLog | None]
    ) -> dict[str, Expected]:
        """What a crash *during* a recovery must keep: recovery's own closers count as written,
        so a later recovery may keep any prefix of them."""
        result = {}
        for session_id, want in expected.items():
            log = recovered.get(session_id)
            events = want.written if log is None else log.events
            result[session_id] = Expected(events, want.acknowledged, want.started)
        return result

    async def explore_recovery(self, count: int, seed: int) -> None:
        """Crash the first *count* recoveries that changed something, after every change.

        A recovery that was interrupted and run again must end with the same log.
        """
        for _, expected, states, recovered in self.recoveries[:count]:
            as_written = self.as_written(expected, recovered)
            for state in reversed(states):
                for how, image in crash_images(state, seed):
                    how = f"recovery crashed after change {state.clock}: {how}"
                    await self.check(image, as_written, how, exact=recovered)


def explore(
    workload: Workload, seed: int, backend: str, *, sectors: bool = False, recoveries: int = 2
) -> Explorer:
    """Run *workload* on a recording layer, then recover and check every crash image.

    The first *recoveries* recoveries that changed something are also crashed at every change
    they made, and recovered again; sampled images are recovered on the real file system too.
    """
    with tempfile.TemporaryDirectory() as scratch:
        live, recover = Path(scratch) / "live", Path(scratch) / "recover"
        live.mkdir()
        recover.mkdir()
        sim = SimFiles(live, seed=seed, record=True)
        recorder = MemoryRecorder(clock=sim.now)
        run = partial(run_workload, workload, live / STORE, recorder, files=sim)
        assert anyio.run(run, backend=backend) is None
        explorer = Explorer(recover, recorder, sectors=sectors)
        anyio.run(explorer.explore, sim.states, seed, backend=backend)
        anyio.run(explorer.explore_recovery, recoveries, seed, backend=backend)
        anyio.run(explorer.cross_check, Path(scratch), backend=backend)
    return explorer
