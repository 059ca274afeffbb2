"""The file layer: every system call the JSONL backend makes, in one replaceable class.

Each method is one small step (one write, one fsync, one truncate), so a test can replace this
class to fail the Nth write or fsync, or to keep unsynced bytes in memory and lose them at a
simulated crash. Methods block; the backend calls them from worker threads, and from the event
loop's thread for a write it makes there.

Only regular files are read or written: every file is opened by :func:`_open_file`, which
never follows a symbolic link and never blocks (a FIFO would block an open until its other end
is opened), and refuses anything that is not a regular file with
:class:`~.errors.NotARegularFileError`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import secrets
import stat
import sys
import threading
from collections import Counter
from typing import TYPE_CHECKING, Final

from ..errors import NotARegularFileError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

__all__ = ["TEMPORARY_NAME", "LockedError", "OsFiles"]

_DIR_MODE = 0o700
_FILE_MODE = 0o600

TEMPORARY_NAME: Final = re.compile(r".+\.[0-9a-f]{12}\.tmp")
"""The names of the temporary files :meth:`OsFiles.publish` writes: ``<name>.<12 hex>.tmp``."""

_KINDS: Final = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a symbolic link",
}


def _refuse_unless_regular(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "a special file")
        raise NotARegularFileError(path, kind)


def _open_file(path: Path, flags: int, mode: int = _FILE_MODE) -> int:
    """Open the regular file *path* with *flags*; refuse anything else, without blocking.

    The open never follows a symbolic link and does not wait for the other end of a FIFO
    (``O_NONBLOCK``, cleared again once the file is known to be regular).

    :raises NotARegularFileError: if *path* is a FIFO, a device, a directory, a socket or a
        symbolic link.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as error:  # ELOOP for a link, ENXIO for a FIFO without a reader, EISDIR...
        try:
            found = os.lstat(path).st_mode
        except OSError:
            raise error from None
        _refuse_unless_regular(path, found)
        raise
    try:
        _refuse_unless_regular(path, os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


_MOST_READ: Final = 1 << 30
"""The most bytes asked of one read call (Linux reads at most about 2 GiB at once)."""


_SHARED_SYNC_FILESYSTEMS: Final = {0xEF53: "ext4", 0x58465342: "xfs", 0x9123683E: "btrfs"}
"""The filesystems (``statfs`` magic numbers) whose ``syncfs`` writes every file's data and
commits the journal, which is what a shared sync relies on."""


def syncfs_reports_errors(release: str) -> bool:
    """Whether a Linux kernel of *release* (``uname -r``) reports to ``syncfs`` a write-back
    that failed since its handle was opened: 5.8 and newer."""
    match = re.match(r"(\d+)\.(\d+)", release)
    return match is not None and (int(match[1]), int(match[2])) >= (5, 8)


def _libc_calls() -> tuple[Callable[[int], int], Callable[[int, object], int]] | None:
    """The C library's ``syncfs`` and ``fstatfs``, if this kernel reports write errors through
    ``syncfs``.

    Linux reports a failed write-back of any file to ``syncfs`` callers since 5.8 (through the
    filesystem's error sequence, sampled when each handle is opened); before that, ``syncfs``
    could succeed after losing data, so it is not used.
    """
    if sys.platform != "linux" or not syncfs_reports_errors(os.uname().release):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syncfs, fstatfs = libc.syncfs, libc.fstatfs
    except (OSError, AttributeError):
        return None
    syncfs.argtypes, syncfs.restype = [ctypes.c_int], ctypes.c_int
    fstatfs.argtypes, fstatfs.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_int
    return syncfs, fstatfs


_LIBC: Final = _libc_calls()


def _filesystem_type(fd: int) -> int | None:
    """The ``statfs`` magic number of the filesystem that holds the open file *fd*."""
    if _LIBC is None:
        return None
    buffer = (ctypes.c_long * 32)()  # struct statfs starts with its type, a C long
    if _LIBC[1](fd, buffer) != 0:
        return None
    return int(buffer[0]) & 0xFFFFFFFF


class LockedError(OSError):
    """Another open writer holds the session's lock."""


class OsFiles:
    """The real file layer, counting each system call it makes in :attr:`calls`."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._counting = threading.Lock()  # sessions write from several threads at once
        self._shared_sync: dict[int, bool] = {}  # device -> whether syncfs may serve it

    def _count(self, call: str) -> None:
        with self._counting:
            self.calls[call] += 1

    # -- directories --------------------------------------------------------------------------

    def makedirs(self, path: Path) -> None:
        """Create *path* and any missing parents (mode 0700), each made durable in its parent."""
        missing: list[Path] = []
        current = path
        while not current.exists():
            missing.append(current)
            current = current.parent
        for directory in reversed(missing):
            try:
                os.mkdir(directory, _DIR_MODE)
            except FileExistsError:
                continue
            try:
                self.fsync_dir(directory.parent)
            except BaseException:
                # The entry may never reach the disk; leave nothing that would make the next
                # attempt skip the directory, and so its sync.
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
                raise
        if path.is_symlink() or not path.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))

    def fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self._count("fsync_dir")
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- whole files --------------------------------------------------------------------------

    def publish(self, path: Path, data: bytes) -> None:
        """Create *path* holding *data*, durably and atomically.

        The bytes go to a temporary file that is fsynced, then hard-linked to *path* (which
        fails if *path* exists, so two writers cannot both create it), then the directory is
        fsynced.

        :raises FileExistsError: if *path* already exists.
        """
        temporary = path.with_name(f"{path.name}.{secrets.token_hex(6)}.tmp")
        fd = _open_file(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            try:
                self.write(fd, data)
                self.fsync(fd)
            finally:
                os.close(fd)
            os.link(temporary, path)
            try:
                self.fsync_dir(path.parent)
            except BaseException:
                path.unlink(missing_ok=True)
                raise
        finally:
            temporary.unlink(missing_ok=True)

    def remove_temporaries(self, directory: Path) -> None:
        """Remove the temporary files that interrupted :meth:`publish` calls left in *directory*.

        Call it only while holding the lock of *directory*, the only one that publishes there.
        Best effort: a temporary that cannot be removed stays, and is never read.
        """
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                if TEMPORARY_NAME.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)

    def read(self, path: Path) -> bytes:
        """Read the whole regular file *path*.

        A file of the size it has when opened is read in one call, into one buffer (a long
        log is not held twice while its pieces are joined).
        """
        fd = _open_file(path, os.O_RDONLY)
        try:
            wanted = min(os.fstat(fd).st_size + 1, _MOST_READ)
            data = os.read(fd, wanted)
            if len(data) < wanted:  # the end of the file, as a regular file reads
                return data
            chunks = [data]
            while chunk := os.read(fd, 1 << 20):  # it grew since, or it is huge
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def reader(self, path: Path) -> Iterator[Callable[[int], bytes]]:
        """Open the regular file *path* for reading from its start: yield a function that reads
        up to the number of bytes it is given (``b""`` at the end); closed on leaving."""
        fd = _open_file(path, os.O_RDONLY)
        try:
            yield lambda size: os.read(fd, min(size, _MOST_READ))
        finally:
            os.close(fd)

    def revision(self, path: Path) -> str:
        """The revision of the file *path*: ``dev:ino:size:mtime:ctime`` (the times in
        nanoseconds), as the original harness names a log's revision. A symbolic link is not
        followed.

        :raises FileNotFoundError: if there is no such file.
        """
        found = os.lstat(path)
        return (
            f"{found.st_dev}:{found.st_ino}:{found.st_size}:{found.st_mtime_ns}:{found.st_ctime_ns}"
        )

    def read_first_line(self, path: Path, limit: int = 1 << 16) -> bytes:
        """Read up to the first newline (included), at most *limit* bytes, of a regular file."""
        fd = _open_file(path, os.O_RDONLY)
        try:
            data = b""
            while b"\n" not in data and len(data) < limit and (chunk := os.read(fd, 8192)):
                data += chunk
            end = data.find(b"\n")
            return data if end < 0 else data[: end + 1]
        finally:
            os.close(fd)

    def read_head(self, path: Path, limit: int = 1 << 16) -> bytes:
        """Read the first *limit* bytes (fewer if the file is shorter) of a regular file."""
        fd = _open_file(path, os.O_RDONLY)
        try:
            data = b""
            while len(data) < limit and (chunk := os.read(fd, limit - len(data))):
                data += chunk
            return data
        finally:
            os.close(fd)

    def read_from(self, path: Path, offset: int) -> bytes:
        """Read a regular file from byte *offset* to its end."""
        fd = _open_file(path, os.O_RDONLY)
        try:
            chunks = []
            while chunk := os.pread(fd, 1 << 20, offset):
                chunks.append(chunk)
                offset += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def rename(self, source: Path, target: Path) -> None:
        """Rename *source* to *target* in the same directory, durably (the directory fsynced).

        :raises FileExistsError: if *target* exists.
        """
        if target.exists() or target.is_symlink():
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
        os.rename(source, target)
        self.fsync_dir(target.parent)

    # -- appending ----------------------------------------------------------------------------

    def open_append(self, path: Path) -> int:
        """Open an existing regular file for appending."""
        return _open_file(path, os.O_WRONLY | os.O_APPEND)

    def write(self, fd: int, data: bytes) -> None:
        """Write all of *data*."""
        view = memoryview(data)
        while view:
            self._count("write")
            written = os.write(fd, view)
            view = view[written:]

    def fsync(self, fd: int) -> None:
        self._count("fsync")
        os.fsync(fd)

    # -- one sync for many files ----------------------------------------------------------------

    def filesystem(self, fd: int) -> int | None:
        """The filesystem of the open file *fd*, if one :meth:`syncfs` there may stand in for
        the fsyncs of its files; ``None`` if each must be fsynced.

        That takes Linux 5.8 or newer (whose ``syncfs`` reports a failed write-back of any file
        since the handle it is called on was opened) and ext4, XFS or btrfs (whose ``syncfs``
        writes every file's data and commits the journal).
        """
        if _LIBC is None:
            return None
        device = os.fstat(fd).st_dev
        usable = self._shared_sync.get(device)
        if usable is None:
            usable = self._shared_sync[device] = _filesystem_type(fd) in _SHARED_SYNC_FILESYSTEMS
        return device if usable else None

    def open_filesystem(self, directory: Path) -> int:
        """A handle to sync the filesystem that holds *directory* with (:meth:`syncfs`).

        ``syncfs`` reports the write-back errors met since its handle was opened: open it
        before writing what it is to make durable.
        """
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def syncfs(self, fd: int) -> None:
        """Make durable everything written to the filesystem of *fd* (every file, every
        process's); raise if a write-back there failed since *fd* was opened or last synced."""
        self._count("syncfs")
        assert _LIBC is not None  # only a filesystem() handle is synced
        if _LIBC[0](fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"syncfs: {os.strerror(code)}")

    def size(self, fd: int) -> int:
        """The size of the open file *fd*."""
        return os.fstat(fd).st_size

    def truncate(self, fd: int, size: int) -> None:
        self._count("truncate")
        os.ftruncate(fd, size)

    def close(self, fd: int) -> None:
        os.close(fd)

    def writable(self, path: Path) -> bool:
        """Whether this process may change the file *path* and the directory that holds it."""
        return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)

    # -- locking ------------------------------------------------------------------------------

    def lock(self, path: Path) -> int:
        """Take the exclusive lock file *path* (created 0600 if missing); return its handle.

        :raises LockedError: if another open file description holds it.
        """
        fd = _open_file(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LockedError(errno.EWOULDBLOCK, "locked by another writer", str(path)) from None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def unlock(self, fd: int) -> None:
        os.close(fd)
