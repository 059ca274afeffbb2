"""The PostgreSQL backend in a host: leases, group commit, and a server that fails.

What both backends share is in test_persistence_contract.py; hosts in separate processes are
in test_postgres_hosts.py. Everything here runs against a real server the tests started.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncGenerator, Iterator
from datetime import timedelta
from typing import Any, TypeAlias

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg")

import psycopg

from kai_session_checkpoint_policy import (
    Agent,
    Finish,
    Host,
    LlmRequest,
    Session,
    StreamChunk,
    Tool,
    ToolExecution,
    policy,
    tool_call_block,
)
from kai_session_checkpoint_policy.persistence import (
    CorruptRecordError,
    LeaseLostError,
    PersistenceError,
    PostgresSessionPersistence,
    SeqMismatchError,
    SessionLockedError,
)
from kai_session_checkpoint_policy.persistence.postgres.store import Batch, PostgresSessionStore

from ..support.gathering import Marks, gathering_marks
from ..support.paying import paying_host, result_text
from ..support.persistence_helpers import event
from ..support.postgres_server import PostgresServer

pytestmark = pytest.mark.anyio

Admin: TypeAlias = "psycopg.Connection[tuple[Any, ...]]"

APP = "kai-test-backend"
WAIT = 10.0


@pytest.fixture
def admin(postgres_dsn: str) -> Iterator[Admin]:
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        yield connection


@pytest.fixture
def make(postgres_dsn: str) -> Iterator[Any]:
    """A factory of backends on the test's database; their connections closed at the end."""
    made: list[PostgresSessionPersistence] = []

    def make(**options: Any) -> PostgresSessionPersistence:
        backend = PostgresSessionPersistence(
            postgres_dsn, **{"application_name": APP, "pool_timeout": 2.0, **options}
        )
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.store.close()


def fetch(admin: Admin, query: str, *params: object) -> list[Any]:
    rows = admin.execute(query, params).fetchall()
    return [row[0] if len(row) == 1 else row for row in rows]


def lease_row(admin: Admin, session_id: str) -> tuple[str, int]:
    (row,) = fetch(
        admin, "SELECT owner, epoch FROM kai_sessions.leases WHERE session_id = %s", session_id
    )
    return row[0], row[1]


def stored_seqs(admin: Admin, session_id: str) -> list[int]:
    query = "SELECT seq FROM kai_sessions.events WHERE session_id = %s ORDER BY seq"
    return fetch(admin, query, session_id)


def wait_for_clock(admin: Admin, moment: object) -> None:
    """Poll the database's clock until it is past *moment* (at most :data:`WAIT` seconds)."""
    deadline = time.monotonic() + WAIT
    while not fetch(admin, "SELECT 1 WHERE clock_timestamp() > %s", moment):
        assert time.monotonic() < deadline, f"the database's clock never passed {moment}"
        admin.execute("SELECT pg_sleep(0.01)")


def wait_for_a_lock_wait(admin: Admin) -> None:
    """Poll until a statement of a backend under test waits for a lock (bounded)."""
    deadline = time.monotonic() + WAIT
    query = (
        "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'"
    )
    while not fetch(admin, query, APP):
        assert time.monotonic() < deadline, "no statement ever waited for the lock"
        admin.execute("SELECT pg_sleep(0.005)")


def queue_marks(backend: PostgresSessionPersistence) -> Marks:
    """Marks of the batches queued from now on behind the backend's group commit in flight
    (whose job took the batches queued before)."""
    return gathering_marks(backend._gathering)


class _LeaseMarks(Marks):
    """Marks of each lease renewal's outcome, as the backend's observer (it has none other)."""

    def batch_written(self, *_: object) -> None:
        pass

    def recovered(self, *_: object) -> None:
        pass

    leases_renewed = lease_lost = Marks.mark


def lease_marks(backend: PostgresSessionPersistence) -> Marks:
    assert backend.observer is None
    marks = _LeaseMarks()
    backend.observer = marks
    return marks


async def written_session(host: Host, session_id: str) -> Session:
    session = host.sessions.create(session_id)
    session.append("turn/start", {"turn": 1})
    await host.sessions.flush(session)
    return session


# -- configuration ------------------------------------------------------------------------------


@pytest.mark.usefixtures("entry_point_autoload")
async def test_the_entry_point_configures_a_backend_from_host_options(postgres_dsn: str) -> None:
    options = {"postgres.dsn": postgres_dsn, "postgres.lease_ttl": 2}
    async with Host(options=options) as host:
        backend = host.session_persistence
        assert isinstance(backend, PostgresSessionPersistence)
        assert (backend.dsn, backend.lease_ttl) == (postgres_dsn, 2.0)
        session = await written_session(host, "configured")
        assert backend.durable_count(session.id) == 1
        registered = host.pm.get_plugin(f"session-persistence-postgres:{backend.where}")
        assert registered is backend
        assert host.pm.get_plugin("session-checkpoint-policy") is policy


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"postgres.dsn": 5432},
            "host option 'postgres.dsn' must be a connection string, not 5432",
        ),
        (
            {"postgres.dsn": "postgresql:///x", "postgres.lease_ttl": "10s"},
            "host option 'postgres.lease_ttl' must be seconds, not '10s'",
        ),
    ],
)
@pytest.mark.usefixtures("entry_point_autoload")
async def test_a_bad_host_option_is_named(options: dict[str, object], message: str) -> None:
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        async with Host(options=options):
            pass


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lease_ttl": 0}, "lease_ttl must be a positive number of seconds, not 0"),
        ({"batch_window": float("nan")}, "batch_window must be a positive number of seconds"),
        ({"owner": ""}, "owner must be a non-empty string, not ''"),
        ({"schema": "Kai"}, "schema must be a plain lowercase SQL identifier"),
    ],
)
def test_bad_arguments_are_refused_before_connecting(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        PostgresSessionPersistence("postgresql:///nowhere", **options)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^dsn is not a PostgreSQL connection string: "):
        PostgresSessionPersistence("host=x port")


async def test_reading_creates_nothing_in_the_database(make: Any, admin: Admin) -> None:
    backend = make()
    assert backend.session_exists("s") is False
    assert await backend.list_sessions() == []
    with pytest.raises(PersistenceError, match=r"^no session 's' in the PostgreSQL"):
        await backend.inspect("s")
    await backend.aclose()
    assert fetch(admin, "SELECT 1 FROM pg_namespace WHERE nspname = 'kai_sessions'") == []


async def test_a_long_log_is_read_whole_and_a_damaged_event_in_it_is_named(
    make: Any, admin: Admin, postgres_dsn: str
) -> None:
    logged = [event("assistant/chunk", seq, {"n": seq, "text": "é\n\\"}) for seq in range(9000)]
    with PostgresSessionStore(postgres_dsn) as store:
        store.append(store.acquire("long", "writer", 60), 0, logged)
    backend = make()
    try:
        assert (await backend.inspect("long")).events == tuple(logged)
        admin.execute(
            "UPDATE kai_sessions.events SET record = '{not json' "
            "WHERE session_id = 'long' AND seq = 8191"
        )
        with pytest.raises(CorruptRecordError) as damaged:
            await backend.inspect("long")
    finally:
        await backend.aclose()
    assert str(damaged.value).startswith(
        f"corrupt session log {backend.where}, session 'long', seq 8191: not valid JSON ("
    )
    assert damaged.value.seq == 8191


# -- leases ---------------------------------------------------------------------------------------


async def test_a_session_live_on_one_host_is_locked_for_another(make: Any, admin: Admin) -> None:
    first, second = make(owner="host-a"), make(owner="host-b")
    async with Host([first]) as host:
        session = await written_session(host, "shared")
        session.append("step/start", {"turn": 1, "step": 1})
        with pytest.raises(SessionLockedError) as locked:
            await second.load("shared")
        assert re.fullmatch(
            r"session 'shared' is held by 'host-a' \(lease epoch 1\), whose lease expires at "
            r"\S+ by the database's clock unless renewed",
            str(locked.value),
        )
        assert first.statistics().leases == 1
    # Closing the host gave the lease up: the other host takes it over at once.
    loaded = await second.load("shared")
    assert [item.type for item in loaded.repair] == ["step/end", "turn/end"]
    assert lease_row(admin, "shared") == ("host-b", 2)
    await second.aclose()


async def test_the_lease_is_renewed_in_the_background_past_its_ttl(make: Any, admin: Admin) -> None:
    backend, other = make(owner="host-a", lease_ttl=0.6), make(owner="host-b")
    async with Host([backend]) as host:
        await written_session(host, "kept")
        (first_expiry,) = fetch(admin, "SELECT expires_at FROM kai_sessions.leases")
        # Two ttls later, by the database's clock; the event loop runs the renewals meanwhile.
        await anyio.to_thread.run_sync(wait_for_clock, admin, first_expiry + timedelta(seconds=0.6))
        with pytest.raises(SessionLockedError, match=r"^session 'kept' is held by 'host-a'"):
            await other.load("kept")
        assert lease_row(admin, "kept") == ("host-a", 1)
    await other.aclose()


async def test_a_lease_that_expired_while_nobody_took_it_over_goes_on(
    make: Any, admin: Admin
) -> None:
    backend = make(owner="host-a", batch_window=60)
    async with Host([backend]) as host:
        session = await written_session(host, "paused")
        # As if the database had been down (or this host paused) for longer than the ttl.
        admin.execute("UPDATE kai_sessions.leases SET expires_at = clock_timestamp()")
        session.append("step/start", {"turn": 1, "step": 1})

        await host.sessions.flush(session)

        assert stored_seqs(admin, "paused") == [0, 1]
        assert lease_row(admin, "paused") == ("host-a", 1)  # its own epoch: renewed, not retaken
        assert fetch(admin, "SELECT expires_at > clock_timestamp() FROM kai_sessions.leases")[0]


async def test_a_host_whose_lease_was_taken_over_is_fenced_and_runs_no_tool_body(
    make: Any, admin: Admin
) -> None:
    backend, taker = make(owner="host-a", batch_window=60), make(owner="host-b")
    bodies: list[str] = []

    async def model(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        # While the request is out, host-a looks dead: its lease expires, host-b takes the
        # session over and repairs it.
        admin.execute("UPDATE kai_sessions.leases SET expires_at = clock_timestamp()")
        repaired = await taker.load("fenced")
        assert [item.type for item in repaired.repair] == ["step/end", "turn/end"]
        for chunk in tool_call_block(0, "pay-1", "pay"):
            yield chunk
        yield Finish("tool-calls")

    async def pay(execution: ToolExecution) -> str:
        bodies.append(execution.call_id)
        return "paid"

    taken = (
        "the lease of 'host-a' (epoch 1) on session 'fenced' was taken over by 'host-b' "
        "(epoch 2); refusing to write"
    )
    later: list[str] = []
    with pytest.raises(LeaseLostError) as at_close:  # noqa: PT012 (checked after the close)
        async with Host([backend, policy]) as host:
            host.llm.register_adapter("scripted", model)
            host.tools.register(Tool("pay", pay))
            session = host.sessions.create("fenced")
            outcome = await Agent(host, session, provider="scripted", model="m").run_turn("pay")
            for _ in range(2):  # every later flush is refused too
                try:
                    await host.sessions.flush(session)
                except LeaseLostError as exc:
                    later.append(str(exc))
    (result,) = [item for item in session.events if item.type == "tool/result"]
    data: Any = result.data
    assert data["message"]["content"][0]["content"][0]["text"] == f"Error: {taken}"
    assert outcome.reason["kind"] == "error"
    assert bodies == []
    assert later == [taken, taken]
    assert str(at_close.value) == taken
    stored = await taker.inspect("fenced")
    assert [item.type for item in stored.events] == [
        "turn/start",
        "step/start",
        "user/message",
        "request/header",
        "request/context",
        "step/end",  # host-b's repair, and nothing of host-a after it
        "turn/end",
    ]
    await taker.aclose()


async def test_a_zombie_host_whose_lease_was_taken_is_refused_on_its_very_next_flush(
    make: Any, admin: Admin
) -> None:
    # A long ttl: host-a's renewer does not run during the test, so host-a still believes
    # its lease fresh (its quick path commits without a thread) when host-b takes it.
    backend, taker = make(owner="host-a", lease_ttl=60, batch_window=60), make(owner="host-b")
    taken = (
        "the lease of 'host-a' (epoch 1) on session 'zombie' was taken over by 'host-b' "
        "(epoch 2); refusing to write"
    )
    refusals: list[str] = []
    with pytest.raises(LeaseLostError) as at_close:  # noqa: PT012 (checked after the close)
        async with Host([backend]) as host:
            session = await written_session(host, "zombie")
            for step in (1, 2):  # quick commits: the session's recent writes were fast
                session.append("step/start", {"turn": 1, "step": step})
                await host.sessions.flush(session)
            admin.execute("UPDATE kai_sessions.leases SET expires_at = clock_timestamp()")
            repaired = await taker.load("zombie")
            assert [item.type for item in repaired.repair] == ["step/end", "turn/end"]
            session.append("step/end", {"turn": 1, "step": 2})
            for _ in range(2):  # the very next flush, and every one after it
                try:
                    await host.sessions.flush(session)
                except LeaseLostError as exc:
                    refusals.append(str(exc))
    assert refusals == [taken, taken]
    assert str(at_close.value) == taken
    assert stored_seqs(admin, "zombie") == [0, 1, 2, 3, 4]  # three of host-a's, two repairs
    assert lease_row(admin, "zombie") == ("host-b", 2)
    await taker.aclose()


async def test_a_flush_with_nothing_to_write_is_refused_once_the_lease_is_lost(
    make: Any, admin: Admin
) -> None:
    backend = make(owner="host-a", lease_ttl=0.6, batch_window=60)
    until = lease_marks(backend).until
    async with Host([backend]) as host:
        session = await written_session(host, "lost")
        # Another host takes the lease over (forced here) while host-a holds it.
        admin.execute(
            "UPDATE kai_sessions.leases SET owner = 'host-b', epoch = 2, "
            "expires_at = clock_timestamp() + interval '1 minute'"
        )
        await until(lambda: backend.statistics().leases == 0, "the renewal noticed the loss")

        with pytest.raises(LeaseLostError) as lost:
            await host.sessions.flush(session)  # nothing pending: the checkpoint still fails

        assert str(lost.value) == (
            "the lease of 'host-a' (epoch 1) on session 'lost' was taken over by 'host-b' "
            "(epoch 2); cannot renew it"
        )
        host.sessions.detach(session)
    assert lease_row(admin, "lost") == ("host-b", 2)  # not given up by host-a: not its own


# -- group commit ---------------------------------------------------------------------------------


async def test_batches_due_while_a_commit_is_in_flight_share_one_transaction(
    make: Any, admin: Admin, postgres_dsn: str
) -> None:
    backend = make(batch_window=60, lock_timeout=WAIT)
    async with Host([backend]) as host:
        sessions = [await written_session(host, f"s{index:02}") for index in range(20)]
        for session in sessions:
            session.append("step/start", {"turn": 1, "step": 1})
        before = backend.statistics().transactions
        with psycopg.connect(postgres_dsn) as locker:
            locker.execute("LOCK TABLE kai_sessions.events IN EXCLUSIVE MODE")
            async with anyio.create_task_group() as group:
                group.start_soon(host.sessions.flush, sessions[0])
                await anyio.to_thread.run_sync(wait_for_a_lock_wait, admin)
                until = queue_marks(backend).until
                for session in sessions[1:]:
                    group.start_soon(host.sessions.flush, session)
                await until(lambda: len(backend._gathering._waiting) == 19, "all queued behind it")
                locker.rollback()
        # The first batch alone, then the 19 that queued up behind it, together.
        assert backend.statistics().transactions - before == 2
        assert (
            len(fetch(admin, "SELECT DISTINCT xmin::text FROM kai_sessions.events WHERE seq = 1"))
            == 2
        )
        assert [backend.durable_count(session.id) for session in sessions] == [2] * 20


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_natively_cancelled_flush_queued_for_a_group_commit_is_written_then_raises(
    make: Any, admin: Admin, postgres_dsn: str
) -> None:
    backend = make(batch_window=60, lock_timeout=WAIT)
    async with Host([backend]) as host:
        sessions = [await written_session(host, f"s{index}") for index in range(3)]
        for session in sessions:
            session.append("step/start", {"turn": 1, "step": 1})
        with psycopg.connect(postgres_dsn) as locker:
            locker.execute("LOCK TABLE kai_sessions.events IN EXCLUSIVE MODE")
            first = asyncio.ensure_future(host.sessions.flush(sessions[0]))
            await anyio.to_thread.run_sync(wait_for_a_lock_wait, admin)
            until = queue_marks(backend).until
            queued = [asyncio.ensure_future(host.sessions.flush(s)) for s in sessions[1:]]
            await until(lambda: len(backend._gathering._waiting) == 2, "both queued behind it")
            queued[0].cancel()  # Task.cancel(): passes through anyio's shield
            for _ in range(3):  # scheduler rounds: the cancellation reaches the task
                await anyio.lowlevel.checkpoint()
            assert not queued[0].done()  # waits for the commit that takes its batch
            locker.rollback()
        with anyio.fail_after(WAIT):  # not a hang if a waiting task left the group
            await first
            with pytest.raises(asyncio.CancelledError):
                await queued[0]
            await queued[1]
        assert [backend.durable_count(session.id) for session in sessions] == [2] * 3
        assert fetch(admin, "SELECT type FROM kai_sessions.events WHERE session_id = 's1'") == [
            "turn/start",
            "step/start",
        ]


REFUSALS = {
    # Another host took the lease over (forced here).
    "lease": (
        "UPDATE kai_sessions.leases SET owner = 'host-b', epoch = 2 WHERE session_id = 'bad'",
        LeaseLostError,
    ),
    # Something wrote an event without the lease: the stored log no longer ends where the
    # batch begins.
    "seq": (
        "INSERT INTO kai_sessions.events VALUES ('bad', 1, 'turn/end', 0, '{}')",
        SeqMismatchError,
    ),
}


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
async def test_a_refused_batch_in_a_shared_transaction_fails_only_its_session(
    make: Any, admin: Admin, postgres_dsn: str, refusal: str
) -> None:
    tamper, refused = REFUSALS[refusal]
    backend = make(owner="host-a", batch_window=60, lock_timeout=WAIT)
    failures: dict[str, BaseException] = {}

    async def flush(session: Session) -> None:
        try:
            await host.sessions.flush(session)
        except PersistenceError as exc:
            failures[session.id] = exc

    names = ("first", "a", "bad", "b")
    with pytest.raises(refused):  # noqa: PT012 (checked after the close, which tries again)
        async with Host([backend]) as host:
            sessions = [await written_session(host, name) for name in names]
            for session in sessions:
                session.append("step/start", {"turn": 1, "step": 1})
            admin.execute(tamper)
            before = backend.statistics().transactions
            with psycopg.connect(postgres_dsn) as locker:
                locker.execute("LOCK TABLE kai_sessions.events IN EXCLUSIVE MODE")
                async with anyio.create_task_group() as group:
                    group.start_soon(flush, sessions[0])
                    await anyio.to_thread.run_sync(wait_for_a_lock_wait, admin)
                    until = queue_marks(backend).until
                    for session in sessions[1:]:
                        group.start_soon(flush, session)
                    await until(
                        lambda: len(backend._gathering._waiting) == 3, "all queued behind it"
                    )
                    locker.rollback()
            transactions = backend.statistics().transactions - before
            stored = {name: stored_seqs(admin, name) for name in names}
    assert list(failures) == ["bad"]
    assert type(failures["bad"]) is refused
    assert "session 'bad'" in str(failures["bad"])
    assert stored == {
        "first": [0, 1],
        "a": [0, 1],
        "bad": [0] if refusal == "lease" else [0, 1],
        "b": [0, 1],
    }
    # The first alone, the shared one refused (nothing written), then a and b alone.
    assert transactions == 3


# -- a server that fails --------------------------------------------------------------------------


async def test_a_lost_acknowledgement_neither_duplicates_nor_loses_the_batch(
    make: Any, admin: Admin
) -> None:
    backend = make(batch_window=60)
    commit = backend.store.append_many

    def committed_but_unacknowledged(batches: list[Batch]) -> list[int]:
        commit(batches)  # durable on the server...
        raise PersistenceError("the connection dropped before the COMMIT was acknowledged")

    async with Host([backend]) as host:
        session = await written_session(host, "ack")
        session.append("step/start", {"turn": 1, "step": 1})
        session.append("user/message", {"n": 1})
        backend.store.append_many = committed_but_unacknowledged
        with pytest.raises(PersistenceError, match=r"before the COMMIT was acknowledged$"):
            await host.sessions.flush(session)
        del backend.store.append_many
        assert backend.durable_count("ack") == 1  # not known durable here
        session.append("step/end", {"turn": 1, "step": 1})

        await host.sessions.flush(session)  # the same batch again, and one more event

        assert backend.durable_count("ack") == 4
    assert stored_seqs(admin, "ack") == [0, 1, 2, 3]


async def test_a_server_that_is_down_fails_checkpoints_within_a_bound_and_the_host_goes_on(
    make: Any, postgres_server: PostgresServer, postgres_dsn: str
) -> None:
    backend = make(batch_window=60, pool_timeout=0.5, max_connections=1)
    failed_after: list[float] = []

    async def stop() -> None:
        await anyio.to_thread.run_sync(postgres_server.stop)

    async with paying_host([backend, policy], stop) as paying:
        host = paying.host
        session = host.sessions.create("down")
        try:
            started = time.monotonic()
            outcome = await paying.turn(session)
            failed_after.append(time.monotonic() - started)
        finally:
            await anyio.to_thread.run_sync(postgres_server.start)
        assert paying.bodies == []
        assert result_text(session).endswith("failed: couldn't get a connection after 0.50 sec")
        assert outcome.reason["kind"] == "error"
        assert failed_after[0] < 2 * 2 * 0.5 + 3.0  # two checkpoints, each bounded

        # Back up: the same host writes everything it holds, and goes on with a new turn.
        await host.sessions.flush(session)
        outcome = await paying.turn(session, "again")
        await host.sessions.flush(session)
    assert outcome.reason == {"kind": "completed"}
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        assert stored_seqs(admin, "down") == list(range(len(session.events)))


async def test_an_immediate_restart_in_the_middle_of_a_run_loses_no_acknowledged_event(
    make: Any, postgres_server: PostgresServer, postgres_dsn: str
) -> None:
    backend = make(batch_window=60, pool_timeout=1.0)
    acknowledged: list[int] = []
    failures: list[str] = []
    restarted = anyio.Event()

    async def restart() -> None:
        await anyio.to_thread.run_sync(postgres_server.restart, "immediate")
        restarted.set()

    async with Host([backend]) as host, anyio.create_task_group() as group:
        session = host.sessions.create("restarted")
        after_restart = 0
        while after_restart < 20:
            session.append("assistant/chunk", {"n": session.seq})
            try:
                await host.sessions.flush(session)
            except PersistenceError as exc:
                failures.append(str(exc))
                continue
            acknowledged.append(session.seq)
            if len(acknowledged) == 20:
                group.start_soon(restart)
            after_restart += restarted.is_set()
    # Every event acknowledged before, during and after the restart is there, once.
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        assert stored_seqs(admin, "restarted") == list(range(acknowledged[-1]))
    assert all(count <= acknowledged[-1] for count in acknowledged)
    assert all("appending to session 'restarted'" in failure for failure in failures)


async def test_connections_terminated_by_the_server_are_replaced_in_the_middle_of_a_turn(
    make: Any, admin: Admin, postgres_server: PostgresServer
) -> None:
    backend = make(batch_window=60)
    terminated: list[int] = []

    def terminate() -> None:
        terminated.append(postgres_server.terminate_backends(APP))

    async with paying_host([backend, policy], terminate) as paying:
        session = paying.host.sessions.create("terminated")
        outcome = await paying.turn(session)
        await paying.host.sessions.flush(session)
    assert terminated[0] >= 1
    assert outcome.reason == {"kind": "completed"}
    assert paying.bodies == ["pay-1"]  # its checkpoint went through, on a new connection
    assert stored_seqs(admin, "terminated") == list(range(len(session.events)))
