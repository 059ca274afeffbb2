"""Each condition a backend refuses has its own error class, and the command line its own status.

What a user got wrong (no such session, a damaged or misplaced log, a log in two places) is
status 2; what failed on the machine or in the store (a lock another process holds, a database
that cannot be reached, a log changed under its writer) is status 1.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest

from kai_session_checkpoint_policy import Host
from kai_session_checkpoint_policy.cli import EXIT_BAD_INPUT, EXIT_FAILURE
from kai_session_checkpoint_policy.persistence import (
    CorruptLogError,
    DatabaseError,
    DuplicateLogError,
    JsonlSessionPersistence,
    LogChangedError,
    MisplacedLogError,
    OsFiles,
    PersistenceError,
    RecoveryRequiredError,
    SessionLockedError,
    WriteBehind,
)
from kai_session_checkpoint_policy.persistence.ids import NO_CWD, encode_session_id
from kai_session_checkpoint_policy.persistence.postgres.store import PostgresSessionStore

from ..support.persistence_helpers import event, log_bytes, write_log

if TYPE_CHECKING:
    from kai_session_checkpoint_policy.events import JSONObject, SessionEvent

COMMAND: Final = [sys.executable, "-m", "kai_session_checkpoint_policy"]
CLOSED_TURN: Final[tuple[tuple[str, JSONObject], ...]] = (
    ("turn/start", {"turn": 1}),
    ("user/message", {"turn": 1, "message": {"role": "user", "content": "hi"}}),
    ("turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
)

pytestmark = pytest.mark.anyio


def stored(count: int = 3) -> list[SessionEvent]:
    return [event(kind, seq, dict(data)) for seq, (kind, data) in enumerate(CLOSED_TURN[:count])]


def cli(*args: str) -> tuple[int, str]:
    done = subprocess.run([*COMMAND, *args], capture_output=True, text=True, check=False)
    return done.returncode, done.stderr


def test_the_errors_of_each_condition_are_persistence_errors() -> None:
    for error in (
        DuplicateLogError,
        MisplacedLogError,
        RecoveryRequiredError,
        LogChangedError,
        DatabaseError,
    ):
        assert issubclass(error, PersistenceError)
        assert error is not PersistenceError


async def test_a_log_in_two_project_directories_is_a_duplicate(tmp_path: Path) -> None:
    path = write_log(tmp_path, "s", log_bytes("s", stored()))
    for project in ("--home-me-one--", "--home-me-two--"):
        other = tmp_path / project / encode_session_id("s")
        other.mkdir(parents=True)
        shutil.copy(path, other / path.name)
    shutil.rmtree(path.parent)

    with pytest.raises(DuplicateLogError, match="several project directories"):
        await JsonlSessionPersistence(tmp_path).inspect("s")
    status, err = cli("inspect", str(tmp_path), "s")
    assert status == EXIT_BAD_INPUT
    assert "several project directories" in err


async def test_a_plain_and_a_compressed_log_of_one_session_are_a_duplicate(
    tmp_path: Path,
) -> None:
    write_log(tmp_path, "s", log_bytes("s", stored()))
    write_log(tmp_path, "s", log_bytes("s", stored()), compression="zstd")

    with pytest.raises(DuplicateLogError, match="a session has one log"):
        await JsonlSessionPersistence(tmp_path).load("s")
    assert cli("recover", str(tmp_path), "s")[0] == EXIT_BAD_INPUT


async def test_a_log_copied_under_another_session_is_misplaced(tmp_path: Path) -> None:
    path = write_log(tmp_path, "a", log_bytes("a", stored()))
    elsewhere = tmp_path / NO_CWD / "b"
    elsewhere.mkdir()
    shutil.copy(path, elsewhere / path.name)

    with pytest.raises(MisplacedLogError, match="belongs to session 'a', not 'b'"):
        await JsonlSessionPersistence(tmp_path).inspect("b")
    status, err = cli("inspect", str(tmp_path), "b")
    assert status == EXIT_BAD_INPUT
    assert "belongs to session 'a'" in err


async def test_writing_to_a_torn_log_without_recovery_is_refused(tmp_path: Path) -> None:
    """Unless the writer goes on from exactly the log's committed events (a live session
    seeded with them), a torn tail is recovery's to cut."""
    path = write_log(tmp_path, "s", log_bytes("s", stored(2)) + b'{"type":"turn/e')
    before = path.read_bytes()

    with pytest.raises(RecoveryRequiredError, match="load the session with recovery"):
        await JsonlSessionPersistence(tmp_path).write_log("s", stored(1))
    assert path.read_bytes() == before


async def test_a_log_changed_while_its_files_were_closed_is_refused(tmp_path: Path) -> None:
    backend = JsonlSessionPersistence(tmp_path, max_open_sessions=1, compression="none")
    with pytest.raises(LogChangedError):  # noqa: PT012  # closing the host tries again, and says
        async with Host([backend]) as host:
            first = host.sessions.create("first")
            first.append("turn/start", {"turn": 1})
            await host.sessions.flush(first)
            second = host.sessions.create("second")
            second.append("turn/start", {"turn": 1})
            await host.sessions.flush(second)  # closes the files of the idle first session
            log = tmp_path / NO_CWD / "first" / "session.jsonl"
            with log.open("ab") as file:  # another process appends behind its back
                file.write(b'{"type":"turn/end","seq":1,"time":1,"data":{}}\n')
            first.append("user/message", {"turn": 1, "message": {"role": "user", "content": "x"}})
            with pytest.raises(LogChangedError, match="changed while its files were closed"):
                await host.sessions.flush(first)


def test_a_database_that_cannot_be_reached_is_a_database_error() -> None:
    store = PostgresSessionStore(
        "postgresql://kai@127.0.0.1:9/kai", open=False, pool_timeout=0.5, connect_timeout=1
    )
    try:
        with pytest.raises(DatabaseError, match=r"database kai at 127.0.0.1:9: connecting failed"):
            store.exists("s")
    finally:
        store.close()


def test_the_command_line_fails_with_status_1_when_the_database_is_unreachable() -> None:
    status, err = cli("list", "postgresql://kai@127.0.0.1:9/kai?connect_timeout=1")
    assert status == EXIT_FAILURE
    assert err.splitlines()[-1].startswith("kai-checkpoint: PostgreSQL session store")


async def test_a_session_another_process_holds_fails_with_status_1(tmp_path: Path) -> None:
    write_log(tmp_path, "s", log_bytes("s", stored(2)))
    backend = JsonlSessionPersistence(tmp_path)
    async with Host([backend]):
        await backend.load("s")  # in an open host, the recovery keeps the session's lock
        with pytest.raises(SessionLockedError):
            await JsonlSessionPersistence(tmp_path).load("s")
        status, err = cli("recover", str(tmp_path), "s")
    assert status == EXIT_FAILURE
    assert "is being written by another process" in err


async def test_a_corrupt_log_is_bad_input(tmp_path: Path) -> None:
    data = log_bytes("s", stored())
    lines = data.split(b"\n")
    lines[2] = lines[2].replace(b'"seq":1', b'"seq":7')
    write_log(tmp_path, "s", b"\n".join(lines))

    with pytest.raises(CorruptLogError, match="seq 7 where 1 was expected"):
        await JsonlSessionPersistence(tmp_path).inspect("s")
    assert cli("inspect", str(tmp_path), "s")[0] == EXIT_BAD_INPUT


def test_a_backend_must_provide_every_abstract_method() -> None:
    class Incomplete(WriteBehind[object]):  # type: ignore[type-var]
        name = "incomplete"

        def session_exists(self, session_id: str) -> bool:
            return False

    with pytest.raises(TypeError, match=r"abstract methods? .*_append"):
        Incomplete()  # type: ignore[abstract]


class ReadOnlyFiles(OsFiles):
    """A file layer for which nothing may be changed, as for another user's log."""

    def writable(self, path: Path) -> bool:
        return False


async def test_a_recovery_that_may_not_change_the_log_leaves_no_lock_file(tmp_path: Path) -> None:
    path = write_log(tmp_path, "s", log_bytes("s", stored(2)) + b'{"type":"turn/e')
    before = sorted(item.name for item in path.parent.iterdir())
    with pytest.raises(PermissionError, match="needs a repair, and this process may not"):
        await JsonlSessionPersistence(tmp_path, files=ReadOnlyFiles()).load("s")
    assert sorted(item.name for item in path.parent.iterdir()) == before  # no session.lock
    assert (await JsonlSessionPersistence(tmp_path).inspect("s")).torn_bytes == 15
