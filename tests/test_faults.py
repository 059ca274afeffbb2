"""I/O fault injection: every failing file operation leaves the writer fail-closed and live."""

from __future__ import annotations

import contextlib
import errno
from pathlib import Path

import pytest

from kai_session_checkpoint_policy import Host
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence, OsFiles


class FirstOpenFails(OsFiles):
    """The real file layer, except that the first ``open_append`` fails (``EMFILE``)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def open_append(self, path: Path) -> int:
        if not self.failed:
            self.failed = True
            raise OSError(errno.EMFILE, "Too many open files (injected)", str(path))
        return super().open_append(path)


@pytest.mark.anyio
async def test_a_failed_open_after_the_log_is_created_does_not_wedge_it(tmp_path: Path) -> None:
    """Creating the log made its first batch durable; failing to reopen it must not undo that.

    An ``open`` that fails once (too many open files) right after the log was published used to
    leave the writer believing the log did not exist: every later flush tried to create it
    again and failed with ``FileExistsError``, for as long as the process lived.
    """
    backend = JsonlSessionPersistence(tmp_path, files=FirstOpenFails())
    async with Host([backend], autoload=False) as host:
        session = host.sessions.create("s")
        for flush in range(3):
            session.append("note", {"flush": flush})
            with contextlib.suppress(OSError):  # the failing open may hit any one of them
                await host.sessions.flush(session)
        session.append("note", {"flush": 3})
        await host.sessions.flush(session)
    loaded = await JsonlSessionPersistence(tmp_path).load("s")
    assert loaded.events == session.events


class FirstDirectorySyncFails(OsFiles):
    """The real file layer, except that the first directory fsync fails (``EIO``)."""

    def __init__(self) -> None:
        super().__init__()
        self.synced: list[Path] = []

    def fsync_dir(self, path: Path) -> None:
        if not self.synced:
            self.synced.append(path)
            raise OSError(errno.EIO, "Input/output error (injected)", str(path))
        super().fsync_dir(path)
        self.synced.append(path)


@pytest.mark.anyio
async def test_a_directory_whose_creation_was_not_made_durable_is_made_durable_later(
    tmp_path: Path,
) -> None:
    """A failed directory fsync may have dropped the new entry for good (as a failed file
    fsync may drop its pages): the next attempt must create and sync it again, or a power loss
    takes the whole session, acknowledged events included, with it.

    The first attempt used to leave the directory behind; the next saw it, skipped it, and
    never synced its parent again.
    """
    root = tmp_path / "root"
    files = FirstDirectorySyncFails()
    backend = JsonlSessionPersistence(root, files=files)
    async with Host([backend], autoload=False) as host:
        session = host.sessions.create("s")
        session.append("note", {})
        with pytest.raises(OSError, match="injected"):
            await host.sessions.flush(session)
        await host.sessions.flush(session)
    assert files.synced[0] == tmp_path  # the failed sync of the root's new entry
    assert files.synced[1:].count(tmp_path) == 1  # synced again, successfully
    loaded = await JsonlSessionPersistence(root).load("s")
    assert loaded.events == session.events
