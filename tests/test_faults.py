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
