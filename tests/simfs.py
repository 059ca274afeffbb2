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

Faults (:class:`FaultPlan`)
    The *nth* call of one kind of operation fails, once or from then on. A failed write first
    writes half of its data (a short write, then the error). A failed fsync leaves an arbitrary
    prefix of the pending operations on disk and marks the rest clean, as Linux does: a later
    fsync does not write them again (PostgreSQL's "fsyncgate").

The backend also asks the real file system whether paths exist; the layer therefore mirrors its
namespace (not its bytes) as empty files and directories under the real *base* directory.
"""

from __future__ import annotations

import errno
import os
import random
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, TypeAlias

from kai_session_checkpoint_policy.persistence import LockedError, OsFiles

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

__all__ = [
    "DIR",
    "FAULT_KINDS",
    "CrashImage",
    "FaultPlan",
    "Mirror",
    "SimFiles",
    "SimState",
    "crash_images",
    "materialize",
]

DIR: Final = -1
"""The node of a directory entry; files are numbered from 0."""
SECTOR: Final = 512

FaultKind: TypeAlias = Literal["open", "write", "fsync", "fsync_dir", "truncate", "link", "mkdir"]
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
    """Fail the *nth* (1-based) operation of *kind*; with *persistent*, every later one too."""

    kind: FaultKind
    nth: int
    persistent: bool = False

    def __str__(self) -> str:
        return f"{self.kind}#{self.nth}{'+' if self.persistent else ''}"


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


@dataclass(slots=True)
class _Counts:
    ops: dict[str, int] = field(default_factory=dict)
    injected: int = 0


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


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


class SimFiles(OsFiles):
    """An in-memory file layer under the real directory *base*; see the module docstring.

    :param base: An existing directory; every path the backend uses must lie under it.
    :param image: The durable contents to start from (default: nothing but *base*).
    :param mirror: The mirror of *base* to reuse (it must be the only writer under *base*).
    :param seed: Seeds the garbage and the partial persistence of a failed fsync.
    :param fault: The fault to inject, if any.
    :param record: Keep a :class:`SimState` after every change, for :func:`crash_images`.
    """

    def __init__(
        self,
        base: Path,
        *,
        image: CrashImage | None = None,
        mirror: Mirror | None = None,
        seed: int = 0,
        fault: FaultPlan | None = None,
        record: bool = False,
    ) -> None:
        super().__init__()
        self.base: Final = base
        self.mirror: Final = Mirror(base) if mirror is None else mirror
        self.fault = fault
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
        self._next_fd = 1000
        self._tmp = 0
        self._counts = _Counts()
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
            self.mirror.sync(self._names)
            self._changed()

    # -- bookkeeping -----------------------------------------------------------------------------

    @property
    def injected(self) -> int:
        """How many faults were injected."""
        return self._counts.injected

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
        count = self._counts.ops[kind] = self._counts.ops.get(kind, 0) + 1
        fault = self.fault
        if fault is None or fault.kind != kind:
            return
        if count == fault.nth or (fault.persistent and count > fault.nth):
            self._counts.injected += 1
            code = _FAULT_ERRNO[kind]
            raise OSError(code, f"{os.strerror(code)} (injected: {kind} #{count})", path)

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
                self._fsync_dir_locked(_parent(directory))
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
            # Some arbitrary prefix of the changes reached the disk; the rest is lost for good.
            for path, node in pending[: self.rng.randint(0, len(pending))]:
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

    def read(self, path: Path) -> bytes:
        with self._lock:
            rel = self._rel(path)
            self.trace.append(("open-read", rel))
            self._check("open", rel)
            return self._files[self._file(rel)].cache

    def read_first_line(self, path: Path, limit: int = 1 << 16) -> bytes:
        data = self.read(path)[:limit]
        end = data.find(b"\n")
        return data if end < 0 else data[: end + 1]

    # -- appending -----------------------------------------------------------------------------

    def open_append(self, path: Path) -> int:
        with self._lock:
            rel = self._rel(path)
            self.trace.append(("open-append", rel))
            self._check("open", rel)
            return self._open(self._file(rel), rel)

    def size(self, fd: int) -> int:
        with self._lock:
            return len(self._files[self._handles[fd].node].cache)

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
            try:
                self._check("fsync", handle.path)
            except OSError:
                kept = state.pending[: self.rng.randint(0, len(state.pending))]
                self._files[handle.node] = FileState(state.cache, _apply_all(state.disk, kept))
                self._changed()
                raise
            disk = _apply_all(state.disk, state.pending)
            disk = disk[: len(state.cache)].ljust(len(state.cache), b"\0")
            self._files[handle.node] = FileState(state.cache, disk)
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
