"""Session ids a database cannot store: refused before any statement, naming why.

A lone surrogate cannot be encoded as UTF-8 and a NUL character cannot be held in PostgreSQL
text; an id too long for an index key would fail inside its first transaction. Each is
refused by the store and the backend with :class:`InvalidSessionIdError` before anything is
sent: a store whose database cannot be reached at all shows it (a statement would fail with
a :class:`DatabaseError` instead). ``copy`` from a directory that holds such a session skips it
with one line and copies the others; ``agent`` refuses it with one line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeAlias

import anyio
import pytest

pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg")

import psycopg

from kai_session_checkpoint_policy import Host, cli
from kai_session_checkpoint_policy.persistence import (
    InvalidSessionIdError,
    JsonlSessionPersistence,
    PostgresSessionPersistence,
)
from kai_session_checkpoint_policy.persistence.postgres.store import (
    MAX_SESSION_ID_BYTES,
    PostgresSessionStore,
    check_storable_id,
)

from ..support.persistence_helpers import events, find_log, log_bytes, text_of, write_log

pytestmark = pytest.mark.anyio

Admin: TypeAlias = "psycopg.Connection[tuple[Any, ...]]"

NOWHERE = "postgresql:///nowhere?host=/nonexistent-socket-directory&connect_timeout=2"
"""A database that cannot be reached: any statement would fail with a DatabaseError."""

UNSTORABLE = {
    "a\ud800b": (
        "session id 'a\\ud800b' cannot be stored in PostgreSQL: it holds a lone surrogate "
        "(U+D800) at index 1, which UTF-8 cannot encode"
    ),
    "pair\ud83d\ude00": (
        "session id 'pair\\ud83d\\ude00' cannot be stored in PostgreSQL: it holds a lone "
        "surrogate (U+D83D) at index 4, which UTF-8 cannot encode"
    ),
    "nul\x00": (
        "session id 'nul\\x00' cannot be stored in PostgreSQL: it holds a NUL character at "
        "index 3, which PostgreSQL text cannot hold"
    ),
    "é" * (MAX_SESSION_ID_BYTES // 2 + 1): (
        "session id starting 'éééééééééééééééééééééééééééééééééééééééé' cannot be stored in "
        f"PostgreSQL: it is {MAX_SESSION_ID_BYTES + 2} bytes long in UTF-8, more than "
        f"{MAX_SESSION_ID_BYTES}"
    ),
}
IDS = sorted(UNSTORABLE)
SURROGATE, NUL = "a\ud800b", "nul\x00"


def refused(session_id: str) -> Any:
    return pytest.raises(InvalidSessionIdError, match=f"^{re.escape(UNSTORABLE[session_id])}$")


@pytest.fixture
def admin(postgres_dsn: str) -> Any:
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        yield connection


def no_schema(admin: Admin) -> bool:
    return (
        admin.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'kai_sessions'").fetchone()
        is None
    )


@pytest.mark.parametrize("session_id", IDS)
def test_the_check_names_why(session_id: str) -> None:
    with refused(session_id):
        check_storable_id(session_id)


@pytest.mark.parametrize("session_id", IDS)
def test_the_store_refuses_before_any_statement(session_id: str) -> None:
    with PostgresSessionStore(NOWHERE, open=False, pool_timeout=1) as store:
        for call in (store.exists, store.count, store.read, lambda s: store.acquire(s, "o", 5)):
            with refused(session_id):
                call(session_id)


@pytest.mark.parametrize("session_id", IDS)
async def test_the_backend_refuses_before_any_statement(session_id: str) -> None:
    backend = PostgresSessionPersistence(NOWHERE, pool_timeout=1)
    try:
        with refused(session_id):
            backend.session_exists(session_id)
        with refused(session_id):
            await backend.inspect(session_id)
        with refused(session_id):
            await backend.load(session_id)
        with refused(session_id):
            await backend.write_log(session_id, events(("turn/start", {"turn": 1})))
    finally:
        await backend.aclose()


async def test_a_host_refuses_such_a_session_and_the_database_is_untouched(
    postgres_dsn: str, admin: Admin
) -> None:
    backend = PostgresSessionPersistence(postgres_dsn)
    async with Host([backend]) as host:
        with refused("a\ud800b"):
            host.sessions.create("a\ud800b")
        # A whole log written through the backend's own write path (its first flush).
        with refused("nul\x00"):
            await backend.write_log("nul\x00", events(("turn/start", {"turn": 1})))
        assert no_schema(admin)
        # The same host goes on with an id it can store.
        session = host.sessions.create("fine")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
    assert admin.execute("SELECT session_id FROM kai_sessions.sessions").fetchall() == [("fine",)]


async def test_the_longest_id_is_stored_and_read_back(postgres_dsn: str) -> None:
    longest = "é" * (MAX_SESSION_ID_BYTES // 2)
    assert check_storable_id(longest) == longest
    backend = PostgresSessionPersistence(postgres_dsn)
    try:
        logged = events(("turn/start", {"turn": 1}))
        await backend.write_log(longest, logged)
        assert backend.session_exists(longest)
        assert (await backend.inspect(longest)).events == tuple(logged)
    finally:
        await backend.aclose()


def run_cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    status = cli.main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_copy_skips_the_sessions_a_database_cannot_store_with_one_line_each(
    tmp_path: Path, postgres_dsn: str, admin: Admin, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "source"
    open_turn = events(("turn/start", {"turn": 1}), ("step/start", {"turn": 1, "step": 1}))
    ids = ["a", "a\ud800b", "nul\x00", "z"]
    for session_id in ids:
        write_log(source, session_id, log_bytes(session_id, open_turn))
    listed = anyio.run(JsonlSessionPersistence(source).list_sessions)
    assert sorted(header.id for header in listed) == sorted(ids)
    before = {session_id: text_of(find_log(source, session_id)) for session_id in ids}

    status, out, err = run_cli(capsys, "copy", source, postgres_dsn)

    assert status == cli.EXIT_BAD_INPUT
    assert sorted(out.splitlines()) == ["copied session a: 4 events", "copied session z: 4 events"]
    assert sorted(err.splitlines()) == [
        f"kai-checkpoint: not copying session a\\ud800b: {UNSTORABLE[SURROGATE]}",
        f"kai-checkpoint: not copying session nul\\x00: {UNSTORABLE[NUL]}",
    ]
    # The refused sessions were not recovered in the source either: nothing written anywhere.
    for session_id in (SURROGATE, NUL):
        assert text_of(find_log(source, session_id)) == before[session_id]
    stored = admin.execute("SELECT session_id FROM kai_sessions.sessions ORDER BY 1").fetchall()
    assert stored == [("a",), ("z",)]

    status, out, err = run_cli(capsys, "copy", source, postgres_dsn, "--session", NUL)
    assert (status, out) == (cli.EXIT_BAD_INPUT, "")
    assert err == f"kai-checkpoint: {UNSTORABLE[NUL]}\n"


@pytest.mark.parametrize("command", ["agent", "inspect", "recover"])
def test_the_command_line_refuses_such_an_id_with_one_line(
    command: str, postgres_dsn: str, admin: Admin, capsys: pytest.CaptureFixture[str]
) -> None:
    args = (
        ["agent", "--root", postgres_dsn, "--session", "a\ud800b"]
        if command == "agent"
        else [command, postgres_dsn, "a\ud800b"]
    )

    status, out, err = run_cli(capsys, *args)

    assert (status, out) == (cli.EXIT_BAD_INPUT, "")
    assert err == f"kai-checkpoint: {UNSTORABLE[SURROGATE]}\n"
    assert no_schema(admin)
