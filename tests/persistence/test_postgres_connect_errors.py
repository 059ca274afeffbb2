"""Connecting fails in one line: at once when it cannot succeed, within a bound when it may.

A refusal by the server for a reason of its own (no such database, no such role, a bad
option) will not pass by retrying: the store's first connection attempt, made outside the
pool, fails at once. A server that is not there yet (connection refused) is tried again until
``pool_timeout``. The command line prints one line on standard error either way, none of the
pool's own log lines, and never the password of the URL.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import pytest

pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg")

from kai_session_checkpoint_policy import cli
from kai_session_checkpoint_policy.persistence import DatabaseError, PostgresSessionPersistence
from kai_session_checkpoint_policy.persistence.postgres.store import PostgresSessionStore

from ..support.postgres_server import PORT, PostgresServer

pytestmark = pytest.mark.anyio

PASSWORD = "hunter2-s3cret"
AT_ONCE = 1.0
"""Seconds within which a permanent refusal fails: far less than the pool's timeout."""
POOL_TIMEOUT = 5.0
"""The default ``pool_timeout``: the bound on retrying a transient failure."""
STARTUP = 5.0
"""A margin for starting a Python process on a loaded machine."""


def closed_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (it was bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def url(server: PostgresServer, database: str, **query: str) -> str:
    """A URI of *database* on *server*, as the postgres user with a password (which the
    server's trust authentication ignores), with *query* parameters."""
    parameters = {"host": str(server.socket_dir), "port": str(PORT), **query}
    encoded = "&".join(f"{key}={quote(value, safe='/')}" for key, value in parameters.items())
    return f"postgresql://postgres:{PASSWORD}@/{database}?{encoded}"


def run(*args: str) -> tuple[int, str, str, float]:
    """Run ``kai-checkpoint`` in a process of its own (its logging as configured there)."""
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-m", "kai_session_checkpoint_policy", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started
    return completed.returncode, completed.stdout, completed.stderr, took


PERMANENT = {
    "database": ({}, 'FATAL: database "no_such_database" does not exist'),
    "role": ({"user": "no_such_role"}, 'FATAL: role "no_such_role" does not exist'),
    "option": (
        {"options": "-c no_such.setting_x=1 -c no_such_setting=1"},
        'FATAL: unrecognized configuration parameter "no_such_setting"',
    ),
}


@pytest.mark.parametrize("refusal", sorted(PERMANENT))
def test_a_refusal_by_the_server_fails_at_once_in_one_line(
    postgres_server: PostgresServer, refusal: str
) -> None:
    query, reason = PERMANENT[refusal]
    database = "no_such_database" if refusal == "database" else "kai_test"

    status, out, err, took = run("list", url(postgres_server, database, **query))

    assert (status, out) == (cli.EXIT_FAILURE, "")
    (line,) = err.splitlines()
    assert line.startswith(
        f"kai-checkpoint: PostgreSQL session store, database {database} at "
        f"{postgres_server.socket_dir}:{PORT}: connecting failed: "
    )
    assert line.endswith(reason)
    assert PASSWORD not in err
    assert took < POOL_TIMEOUT + STARTUP


@pytest.mark.parametrize("refusal", sorted(PERMANENT))
async def test_the_store_and_the_backend_do_not_retry_a_refusal(
    postgres_server: PostgresServer, refusal: str
) -> None:
    query, reason = PERMANENT[refusal]
    database = "no_such_database" if refusal == "database" else "kai_test"
    dsn = url(postgres_server, database, **query)

    started = time.monotonic()
    with pytest.raises(DatabaseError, match=f"connecting failed: .*{reason}$"):
        PostgresSessionStore(dsn, pool_timeout=POOL_TIMEOUT)
    backend = PostgresSessionPersistence(dsn, pool_timeout=POOL_TIMEOUT)
    try:
        with pytest.raises(DatabaseError, match=f"connecting failed: .*{reason}$"):
            await backend.list_sessions()
    finally:
        await backend.aclose()
    assert time.monotonic() - started < 2 * AT_ONCE


def test_a_server_that_is_not_there_is_retried_within_the_pool_timeout_then_one_line() -> None:
    port = closed_port()
    where = f"postgresql://kai:{PASSWORD}@127.0.0.1:{port}/kai"

    status, out, err, took = run("list", where)

    assert (status, out) == (cli.EXIT_FAILURE, "")
    (line,) = err.splitlines()
    assert line.startswith(
        f"kai-checkpoint: PostgreSQL session store, database kai at 127.0.0.1:{port}: "
        f"connecting failed (tried for {POOL_TIMEOUT:g} s): connection to server at "
        f'"127.0.0.1", port {port} failed: Connection refused'
    )
    assert PASSWORD not in err
    assert POOL_TIMEOUT <= took < POOL_TIMEOUT + STARTUP


def test_a_server_that_comes_up_within_the_bound_is_reached(
    postgres_server: PostgresServer, postgres_dsn: str
) -> None:
    postgres_server.stop()
    store = PostgresSessionStore(postgres_dsn, pool_timeout=60, open=False)
    with store, ThreadPoolExecutor(1) as pool:
        try:
            # Its first connection attempts are refused: it goes on trying meanwhile.
            listing = pool.submit(store.list_sessions)
        finally:
            postgres_server.start()
        assert listing.result(timeout=60) == []
