"""A server that stops answering while its connections stay open: every call has a deadline.

The server of the tests is stopped with SIGSTOP (all its processes: a stopped process's
kernel still accepts connections on its socket and would answer TCP keepalives, and a Unix
socket has none), so a statement sent to it is never answered. The store's client-side
deadline cancels it, closes its connection and fails the call; once the server is continued,
the same backend goes on, and nothing it acknowledged before is lost.

Should the deadline not work, a timer continues the server after the bound and a margin, so
that the test fails instead of hanging.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg")

from kai_session_checkpoint_policy import Host
from kai_session_checkpoint_policy.persistence import DatabaseError, PostgresSessionPersistence
from kai_session_checkpoint_policy.persistence.postgres.store import PostgresSessionStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ..support.postgres_server import PostgresServer

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals and /proc"),
]

DEADLINE = 0.5
LOCK_TIMEOUT = 0.5
ROUND_TRIP = DEADLINE + LOCK_TIMEOUT
BOUND = ROUND_TRIP + min(1.0, DEADLINE)  # the cancel request has a deadline of its own
MARGIN = 3.0
MISSED = (
    f"failed: no reply from the server within the {ROUND_TRIP:g} s deadline; the statement "
    "was cancelled and its connection closed"
)


def postmaster_pid(server: PostgresServer) -> int:
    return int((server.data / "postmaster.pid").read_text().splitlines()[0])


def children(parent: int) -> list[int]:
    """The processes whose parent is *parent* (each of a server's leads a session of its own,
    so they are found by their parent, not by a process group)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat[stat.rindex(")") + 2 :].split()[1]) == parent:
                    found.append(int(entry.name))
    return found


def signal_all(pids: list[int], signum: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


@contextlib.contextmanager
def stopped(server: PostgresServer) -> Iterator[None]:
    """Every process of *server* stopped with SIGSTOP; continued on exit, or after the bound
    and the margin at the latest (so that a call that does not keep its deadline returns)."""
    postmaster = postmaster_pid(server)
    os.kill(postmaster, signal.SIGSTOP)  # first: a stopped postmaster starts no process
    pids = [postmaster, *children(postmaster)]
    signal_all(pids[1:], signal.SIGSTOP)
    rescue = threading.Timer(BOUND + MARGIN, signal_all, (pids, signal.SIGCONT))
    rescue.start()
    try:
        yield
    finally:
        rescue.cancel()
        signal_all(pids, signal.SIGCONT)


async def test_a_stopped_server_fails_a_due_flush_within_the_deadline_and_loses_nothing(
    postgres_server: PostgresServer, postgres_dsn: str
) -> None:
    backend = PostgresSessionPersistence(
        postgres_dsn,
        batch_window=60,
        lease_ttl=600,  # no renewal while the server is stopped: the flush alone is measured
        statement_deadline=DEADLINE,
        lock_timeout=LOCK_TIMEOUT,
    )
    async with Host([backend]) as host:
        session = host.sessions.create("stopped")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
        session.append("step/start", {"turn": 1, "step": 1})
        await host.sessions.flush(session)
        acknowledged = [item.encode() for item in session.events]
        session.append("user/message", {"id": "u-1", "role": "user", "content": []})

        with stopped(postgres_server):
            started = time.monotonic()
            with anyio.fail_after(BOUND + MARGIN), pytest.raises(DatabaseError) as failed:
                await host.sessions.flush(session)
            took = time.monotonic() - started

        assert ROUND_TRIP <= took < BOUND + MARGIN
        assert re.fullmatch(
            r"PostgreSQL session store, database kai_test_\d+ at \S+: appending to session "
            rf"'stopped' {re.escape(MISSED)}",
            str(failed.value),
        )
        assert backend.durable_count("stopped") == 2  # the batch is kept queued

        # Continued: the next flush writes the batch, on another connection.
        await host.sessions.flush(session)
        assert backend.durable_count("stopped") == 3
        session.append("step/end", {"turn": 1, "step": 1})
        await host.sessions.flush(session)

    with PostgresSessionStore(postgres_dsn, open=False) as store:
        records = store.read("stopped").records
    assert records[:2] == tuple(acknowledged)
    assert records == tuple(item.encode() for item in session.events)


def test_each_store_call_on_a_stopped_server_fails_within_the_deadline(
    postgres_server: PostgresServer, postgres_dsn: str
) -> None:
    with PostgresSessionStore(
        postgres_dsn, statement_deadline=DEADLINE, lock_timeout=LOCK_TIMEOUT, max_connections=1
    ) as store:
        lease = store.acquire("s", "writer", 600)
        assert store.count("s") == 0
        calls: dict[str, Callable[[], object]] = {
            "looking up session 's'": lambda: store.exists("s"),
            "reading session 's'": lambda: store.read("s"),  # a transaction of several
            "renewing the lease on session 's'": lambda: store.renew(lease),
        }
        for what, call in calls.items():
            with stopped(postgres_server):
                started = time.monotonic()
                with pytest.raises(DatabaseError) as failed:
                    call()
                took = time.monotonic() - started
            assert ROUND_TRIP <= took < BOUND + MARGIN, what
            assert str(failed.value).endswith(f": {what} {MISSED}")
            assert store.exists("s") is False  # the server is back: a new connection works


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"statement_deadline": 0}, "statement_deadline must be a positive number of seconds"),
        ({"statement_deadline": float("inf")}, "statement_deadline must be a positive number"),
    ],
)
def test_a_bad_deadline_is_refused(options: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        PostgresSessionPersistence("postgresql:///nowhere", **options)  # type: ignore[arg-type]
