"""The PostgreSQL session store, against a real server that the tests start themselves."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeAlias

import pytest

pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg")

import psycopg

from kai_session_checkpoint_policy.events import SessionEvent
from kai_session_checkpoint_policy.persistence import (
    InvalidSessionIdError,
    LeaseLostError,
    PersistenceError,
    SeqMismatchError,
    SessionHeader,
    SessionLockedError,
    SessionNotFoundError,
    UnsupportedFormatError,
)
from kai_session_checkpoint_policy.persistence.jsonl.format import encode_header
from kai_session_checkpoint_policy.persistence.postgres.store import (
    SCHEMA_VERSION,
    Batch,
    Lease,
    PostgresSessionStore,
    migration_lock_key,
)
from kai_session_checkpoint_policy.persistence.values import FORMAT_VERSION

from ..support.persistence_helpers import COMPLETE_TURN, T0, event, events, log_bytes

if TYPE_CHECKING:
    from ..support.postgres_server import PostgresServer

Admin: TypeAlias = "psycopg.Connection[tuple[Any, ...]]"
OpenStore: TypeAlias = Callable[..., PostgresSessionStore]

APP = "kai-test-store"
"""The application name of the stores under test, so a test can terminate their connections."""
WAIT = 10.0
"""Seconds a test waits for the database to reach a state before it fails."""

TURN = [*events(*COMPLETE_TURN), event("user/message", 6, {"text": 'é ☃ \u0000 "q" \\'})]
RECORDS = tuple(item.encode() for item in TURN)


@pytest.fixture
def open_store(postgres_dsn: str) -> Iterator[OpenStore]:
    """Open stores on the test's database (short timeouts by default), closed at the end."""
    stores: list[PostgresSessionStore] = []

    def open_store(**options: Any) -> PostgresSessionStore:
        options = {"application_name": APP, "pool_timeout": 2.0, **options}
        store = PostgresSessionStore(postgres_dsn, **options)
        stores.append(store)
        return store

    yield open_store
    for store in stores:
        store.close()


@pytest.fixture
def admin(postgres_dsn: str) -> Iterator[Admin]:
    """An autocommit connection to the test's database, to look at what the store wrote."""
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        yield connection


def fetch(connection: Admin, query: str, *params: object) -> list[Any]:
    """The rows of *query*, one-column rows as plain values."""
    rows = connection.execute(query, params).fetchall()
    return [row[0] if len(row) == 1 else row for row in rows]


def stored_seqs(admin: Admin, session_id: str) -> list[int]:
    return fetch(
        admin, "SELECT seq FROM kai_sessions.events WHERE session_id = %s ORDER BY seq", session_id
    )


def wait_for(admin: Admin, query: str, *params: object) -> list[Any]:
    """Poll *query* until it returns rows (at most :data:`WAIT` seconds); return them."""
    deadline = time.monotonic() + WAIT
    while not (rows := fetch(admin, query, *params)):
        assert time.monotonic() < deadline, f"the database never reached: {query} {params}"
        admin.execute("SELECT pg_sleep(0.005)")
    return rows


def wait_until_expired(admin: Admin, lease: Lease) -> None:
    """Wait until the database's clock is past the lease's expiry."""
    wait_for(admin, "SELECT 1 WHERE clock_timestamp() > %s", lease.expires_at)


def blocked_backends(admin: Admin, *known: int) -> list[int]:
    """Wait until a store connection not among *known* waits for a lock; return such pids."""
    return wait_for(
        admin,
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
        "AND wait_event_type = 'Lock' AND NOT pid = ANY(%s)",
        APP,
        list(known),
    )


# -- schema ---------------------------------------------------------------------------------------


def test_the_schema_is_created_once_and_versioned(open_store: OpenStore, admin: Admin) -> None:
    first = open_store()
    created = fetch(
        admin, "SELECT version, xmin::text FROM kai_sessions.schema_version ORDER BY version"
    )
    tables = fetch(
        admin,
        "SELECT tablename FROM pg_tables WHERE schemaname = 'kai_sessions' ORDER BY tablename",
    )

    second = open_store()

    assert first.schema_version == second.schema_version == SCHEMA_VERSION == 2
    assert tables == ["events", "leases", "schema_version", "sessions"]
    assert [version for version, _ in created] == [1, 2]  # one row per migration
    # Not applied again: the rows are the ones the first store's migrations wrote.
    assert (
        fetch(admin, "SELECT version, xmin::text FROM kai_sessions.schema_version ORDER BY version")
        == created
    )


def test_two_stores_opening_at_once_migrate_once(open_store: OpenStore, admin: Admin) -> None:
    key = migration_lock_key("kai_sessions")
    admin.execute("SELECT pg_advisory_lock(%s)", (key,))
    with ThreadPoolExecutor(2) as pool:
        try:
            openings = [pool.submit(open_store, migration_timeout=WAIT) for _ in range(2)]
            # Both wait for the lock, each in the transaction that would apply the migration.
            wait_for(
                admin,
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "HAVING count(*) = 2",
            )
        finally:
            admin.execute("SELECT pg_advisory_unlock(%s)", (key,))
        stores = [opening.result(WAIT) for opening in openings]

    assert [store.schema_version for store in stores] == [2, 2]
    assert fetch(admin, "SELECT version FROM kai_sessions.schema_version ORDER BY version") == [
        1,
        2,
    ]


def test_a_newer_schema_is_refused(open_store: OpenStore, admin: Admin, postgres_dsn: str) -> None:
    open_store()
    admin.execute("INSERT INTO kai_sessions.schema_version (version) VALUES (7)")

    with pytest.raises(UnsupportedFormatError) as refused:
        open_store()

    database = postgres_dsn.partition("?")[0].rpartition("/")[2]
    assert str(refused.value).startswith(f"PostgreSQL session store, database {database} at /")
    assert str(refused.value).endswith(
        ": schema 'kai_sessions' is at version 7, newer than version 2 which this release "
        "knows; upgrade kai-session-checkpoint-policy"
    )


def test_a_schema_of_its_own_name_keeps_its_sessions_apart(
    open_store: OpenStore, admin: Admin
) -> None:
    tenant, default = open_store(schema="tenant_a"), open_store()
    lease = tenant.acquire("s", "host-a", 60)
    tenant.append(lease, 0, TURN)

    assert tenant.read("s").records == RECORDS
    assert default.list_sessions() == []
    assert fetch(admin, "SELECT count(*) FROM tenant_a.events") == [len(TURN)]
    assert fetch(admin, "SELECT count(*) FROM kai_sessions.events") == [0]


@pytest.mark.parametrize("schema", ["Kai", "1st", "a-b", "a b", 'x"; DROP', "", "x" * 64])
def test_a_schema_name_that_is_not_a_plain_identifier_is_refused(schema: str) -> None:
    with pytest.raises(ValueError, match=r"^schema must be a plain lowercase SQL identifier"):
        PostgresSessionStore("postgresql:///nowhere", schema=schema)


def test_a_store_opened_later_reads_without_creating_the_schema(
    open_store: OpenStore, admin: Admin
) -> None:
    reader = open_store(open=False)

    assert reader.schema_version == 0
    assert reader.list_sessions() == []
    assert (reader.exists("s"), reader.count("s")) == (False, 0)
    with pytest.raises(SessionNotFoundError, match=r"^no session 's' in the PostgreSQL"):
        reader.read("s")
    assert fetch(admin, "SELECT nspname FROM pg_namespace WHERE nspname = 'kai_sessions'") == []

    writer = open_store()  # another process creates the schema and writes a session
    writer.append(writer.acquire("s", "host-a", 60), 0, TURN[:2])

    assert reader.list_sessions() == [
        SessionHeader("s", T0, FORMAT_VERSION)
    ]  # the reader sees it now
    assert (reader.exists("s"), reader.count("s")) == (True, 2)
    assert reader.migrate() == reader.schema_version == SCHEMA_VERSION


# -- reading and writing ------------------------------------------------------------------------


def test_a_round_trip_is_byte_identical_to_the_jsonl_log(open_store: OpenStore) -> None:
    store = open_store()
    lease = store.acquire("s-1", "host-a", 60)

    assert store.append(lease, 0, TURN[:2]) == 2
    assert store.append(lease, 2, TURN[2:]) == len(TURN) - 2
    stored = store.read("s-1")

    assert stored.header == SessionHeader("s-1", T0, FORMAT_VERSION)
    assert stored.records == RECORDS
    as_jsonl = encode_header(stored.header) + "".join(f"{r}\n" for r in stored.records).encode()
    assert as_jsonl == log_bytes("s-1", TURN)


def test_sessions_are_listed_oldest_first(open_store: OpenStore) -> None:
    store = open_store()
    for session_id, time_ in (("b", T0 + 5), ("c", T0), ("a", T0 + 5)):
        store.append(
            store.acquire(session_id, "host-a", 60), 0, [event("turn/start", 0, {}, time_)]
        )

    assert store.list_sessions() == [
        SessionHeader("c", T0 + 0, FORMAT_VERSION),
        SessionHeader("a", T0 + 5, FORMAT_VERSION),
        SessionHeader("b", T0 + 5, FORMAT_VERSION),
    ]


def test_a_session_that_does_not_exist_is_not_found(open_store: OpenStore) -> None:
    store = open_store()
    store.acquire("leased-only", "host-a", 60)  # a lease alone makes no session

    for session_id in ("missing", "leased-only"):
        with pytest.raises(SessionNotFoundError, match=rf"^no session '{session_id}' in the "):
            store.read(session_id)
    assert store.list_sessions() == []


def test_exists_and_count_answer_from_the_stored_events(open_store: OpenStore) -> None:
    store = open_store()
    lease = store.acquire("s", "host-a", 60)
    assert (store.exists("s"), store.count("s")) == (False, 0)  # a lease alone is no session

    store.append(lease, 0, TURN[:3])

    assert (store.exists("s"), store.count("s")) == (True, 3)
    assert (store.exists("other"), store.count("other")) == (False, 0)


def test_a_long_log_is_read_a_chunk_at_a_time_in_one_snapshot(
    open_store: OpenStore, admin: Admin
) -> None:
    store = open_store()
    lease = store.acquire("s", "host-a", 60)
    store.append(lease, 0, TURN)
    later = event("turn/start", len(TURN), {"turn": 2})
    seen: list[str] = []

    def consume(header: SessionHeader, records: Iterator[str]) -> SessionHeader:
        for record in records:
            seen.append(record)
            if len(seen) == 2:  # between two chunks, another writer appends
                store.append(lease, len(TURN), [later])
        return header

    assert store.read_with("s", consume, chunk=2) == SessionHeader("s", T0, FORMAT_VERSION)
    assert tuple(seen) == RECORDS  # the snapshot the read started with
    assert store.read("s").records == (*RECORDS, later.encode())


def test_a_gap_or_a_repeat_is_refused_and_nothing_is_written(
    open_store: OpenStore, admin: Admin
) -> None:
    store = open_store()
    lease = store.acquire("s", "host-a", 60)
    store.append(lease, 0, TURN[:3])
    before = fetch(admin, "SELECT seq, record, xmin::text FROM kai_sessions.events")
    changed = event("step/start", 2, {"turn": 1, "step": 99})

    refusals = [
        (
            5,
            TURN[5:7],
            "refusing to write seq 5 at position 0 of a batch; the database holds "
            "3 events, so seq 3 was expected",
        ),
        (
            2,
            [changed, TURN[3]],
            "refusing to write seq 2: the database holds 3 events, and a "
            "different event at that seq",
        ),
        (
            3,
            [TURN[3], TURN[5]],
            "refusing to write seq 5 at position 1 of a batch that starts "
            "after 3 events, so seq 4 was expected",
        ),
    ]
    for expected_count, batch, message in refusals:
        with pytest.raises(SeqMismatchError) as refused:
            store.append(lease, expected_count, batch)
        assert str(refused.value) == f"session 's': {message}"

    assert fetch(admin, "SELECT seq, record, xmin::text FROM kai_sessions.events") == before


@pytest.mark.parametrize(
    ("expected_count", "batch", "outcome"),
    [
        (2, [event("step/start", 2, {"turn": 1, "step": 99})], "a different event at that seq"),
        (4, TURN[4:5], "the database holds 3 events, so seq 3 was expected"),
        (2, TURN[2:3], 0),  # the event stored there: a retry, acknowledged without a write
        (3, TURN[3:4], 1),
    ],
    ids=["behind", "ahead", "behind, as stored", "right"],
)
def test_a_one_event_batch_is_written_only_right_after_the_stored_log(
    open_store: OpenStore,
    admin: Admin,
    expected_count: int,
    batch: list[SessionEvent],
    outcome: str | int,
) -> None:
    store = open_store()
    lease = store.acquire("s", "host-a", 60)
    store.append(lease, 0, TURN[:3])

    if isinstance(outcome, str):
        with pytest.raises(SeqMismatchError, match=outcome):
            store.append(lease, expected_count, batch)
    else:
        assert store.append(lease, expected_count, batch) == outcome

    assert stored_seqs(admin, "s") == ([0, 1, 2, 3] if outcome == 1 else [0, 1, 2])


def test_bad_input_is_refused_before_the_database_is_asked(open_store: OpenStore) -> None:
    store = open_store()
    lease = store.acquire("s", "host-a", 60)

    with pytest.raises(ValueError, match=r"^session 's': a batch needs at least one event$"):
        store.append(lease, 0, [])
    with pytest.raises(ValueError, match=r"^one transaction can take one batch per session"):
        store.append_many([Batch(lease, 0, TURN[:1]), Batch(lease, 1, TURN[1:2])])
    with pytest.raises(ValueError, match=r"^ttl must be a positive number of seconds, not 0$"):
        store.acquire("t", "host-a", 0)
    with pytest.raises(InvalidSessionIdError):
        store.acquire("", "host-a", 60)
    assert store.list_sessions() == []


def test_a_retried_batch_whose_acknowledgement_was_lost_is_not_written_twice(
    open_store: OpenStore, admin: Admin
) -> None:
    store = open_store()
    lease = store.acquire("s", "host-a", 60)
    assert store.append(lease, 0, TURN[:3]) == 3  # its acknowledgement, say, never arrived

    assert store.append(lease, 0, TURN[:3]) == 0  # the retry finds it durable
    # A retry may carry events admitted since: only those are written.
    assert store.append(lease, 0, TURN[:5]) == 2
    assert store.read("s").records == RECORDS[:5]
    assert stored_seqs(admin, "s") == [0, 1, 2, 3, 4]


# -- leases -------------------------------------------------------------------------------------


def test_a_held_lease_refuses_another_owner(open_store: OpenStore) -> None:
    first, second = open_store(), open_store()
    held = first.acquire("s", "host-a", 60)

    with pytest.raises(SessionLockedError) as refused:
        second.acquire("s", "host-b", 60)

    assert str(refused.value) == (
        f"session 's' is held by 'host-a' (lease epoch 1), whose lease expires at "
        f"{held.expires_at.isoformat()} by the database's clock unless renewed"
    )
    assert (held.owner, held.epoch, held.ttl) == ("host-a", 1, 60.0)
    # Its holder asking again (a retry whose acknowledgement was lost) gets it as it stands.
    assert first.acquire("s", "host-a", 60) == held


def test_an_expired_lease_is_taken_over_and_fences_its_old_holder(
    open_store: OpenStore, admin: Admin
) -> None:
    old_store, new_store = open_store(), open_store()
    old = old_store.acquire("s", "host-a", 0.5)
    old_store.append(old, 0, TURN[:2])
    wait_until_expired(admin, old)

    new = new_store.acquire("s", "host-b", 60)
    with pytest.raises(LeaseLostError) as lost:
        old_store.append(old, 2, TURN[2:4])
    with pytest.raises(LeaseLostError) as not_renewed:
        old_store.renew(old)

    assert (new.owner, new.epoch) == ("host-b", 2)
    taken = "the lease of 'host-a' (epoch 1) on session 's' was taken over by 'host-b' (epoch 2)"
    assert str(lost.value) == f"{taken}; refusing to write"
    assert str(not_renewed.value) == f"{taken}; cannot renew it"
    assert old_store.release(old) is False
    assert stored_seqs(admin, "s") == [0, 1]
    assert new_store.append(new, 2, TURN[2:4]) == 2
    assert new_store.read("s").records == RECORDS[:4]


def test_an_expired_lease_refuses_writes_while_its_holder_stays_connected(
    open_store: OpenStore, admin: Admin
) -> None:
    store = open_store()
    lease = store.acquire("s", "host-a", 0.5)
    store.append(lease, 0, TURN[:1])  # the store's connection stays open in its pool
    wait_until_expired(admin, lease)

    with pytest.raises(LeaseLostError) as lost:
        store.append(lease, 1, TURN[1:2])

    assert str(lost.value) == (
        f"the lease of 'host-a' (epoch 1) on session 's' expired at "
        f"{lease.expires_at.isoformat()} by the database's clock; refusing to write"
    )
    assert stored_seqs(admin, "s") == [0]


def test_renew_and_release(open_store: OpenStore, admin: Admin) -> None:
    store = open_store()
    lease = store.acquire("s", "host-a", 30)

    renewed = store.renew(lease)
    released = store.release(renewed)
    taken = store.acquire("s", "host-b", 30)

    assert (renewed.epoch, renewed.owner) == (1, "host-a")
    assert renewed.expires_at > lease.expires_at
    assert released is True
    assert (taken.owner, taken.epoch) == ("host-b", 2)  # at once: released means expired
    with pytest.raises(LeaseLostError, match=r"was taken over by 'host-b' \(epoch 2\)"):
        store.renew(renewed)
    with pytest.raises(LeaseLostError) as never:
        store.append(Lease("n", "x", 1, lease.expires_at, 30), 0, TURN[:1])
    assert str(never.value) == (
        "the lease of 'x' (epoch 1) on session 'n' was never granted; refusing to write"
    )


def test_a_lease_that_expired_without_a_takeover_is_renewed_at_its_epoch(
    open_store: OpenStore, admin: Admin
) -> None:
    store = open_store()
    lease = store.acquire("s", "host-a", 0.5)
    store.append(lease, 0, TURN[:1])
    wait_until_expired(admin, lease)

    renewed = store.renew(lease)  # nobody took it over: nobody else wrote under it

    assert (renewed.owner, renewed.epoch) == ("host-a", 1)
    assert renewed.expires_at > lease.expires_at
    assert store.append(renewed, 1, TURN[1:2]) == 1
    with pytest.raises(SessionLockedError, match=r"^session 's' is held by 'host-a'"):
        open_store().acquire("s", "host-b", 60)


def test_renew_many_renews_each_lease_still_held_and_names_each_lost_one(
    open_store: OpenStore, admin: Admin
) -> None:
    store, other = open_store(), open_store()
    kept, lost = store.acquire("a", "host-a", 30), store.acquire("b", "host-a", 0.5)
    wait_until_expired(admin, lost)
    other.acquire("b", "host-b", 60)

    renewed, refused = store.renew_many([kept, lost])

    assert isinstance(renewed, Lease)
    assert (renewed.session_id, renewed.epoch) == ("a", 1)
    assert renewed.expires_at > kept.expires_at
    assert isinstance(refused, LeaseLostError)
    assert str(refused) == (
        "the lease of 'host-a' (epoch 1) on session 'b' was taken over by 'host-b' (epoch 2); "
        "cannot renew it"
    )
    assert store.renew_many([]) == []


def test_release_many_gives_up_every_lease_still_held(open_store: OpenStore) -> None:
    store, other = open_store(), open_store()
    leases = [store.acquire(session_id, "host-a", 60) for session_id in ("a", "b", "c")]
    assert store.release(leases[2]) is True

    assert store.release_many(leases) == 2  # c was released already
    assert store.release_many([]) == 0
    assert [other.acquire(lease.session_id, "host-b", 60).epoch for lease in leases] == [2, 2, 2]


@pytest.mark.parametrize("several", ["renew_many", "release_many"])
def test_several_leases_are_locked_in_the_order_of_their_sessions(
    open_store: OpenStore, admin: Admin, postgres_dsn: str, several: str
) -> None:
    """A statement that takes several lease rows takes them in the order of their session ids,
    as a group commit's batch does, whatever order it is given them in: two such statements
    never wait for each other in a cycle, which the server breaks by failing one of them."""
    store = open_store(lock_timeout=WAIT)
    leases = [store.acquire(session_id, "host-a", 60) for session_id in ("a", "b")]
    lock = "SELECT 1 FROM kai_sessions.leases WHERE session_id = %s FOR UPDATE"
    with (
        psycopg.connect(postgres_dsn) as blocker,
        psycopg.connect(postgres_dsn) as probe,
        ThreadPoolExecutor(1) as pool,
    ):
        blocker.execute(lock, ("a",))
        call = pool.submit(getattr(store, several), leases[::-1])  # b first
        blocked_backends(admin)
        # It waits for a's row, and has not taken b's meanwhile.
        probe.execute(lock + " NOWAIT", ("b",))
        probe.rollback()
        blocker.rollback()
        done = call.result(WAIT)
    if several == "renew_many":
        assert [lease.session_id for lease in done] == ["b", "a"]
        assert all(isinstance(lease, Lease) for lease in done)
    else:
        assert done == 2


def test_a_writer_paused_inside_a_batch_delays_a_takeover_only_for_a_bound(
    open_store: OpenStore, admin: Admin
) -> None:
    paused_store = open_store(idle_in_transaction_timeout=1.0)
    taker = open_store(lock_timeout=0.2)
    paused = paused_store.acquire("s", "host-a", 0.5)
    # One of the store's own connections, stopped inside a batch's transaction that holds the
    # lease row, as a holder paused mid-batch would leave it.
    with paused_store._pool.connection() as connection:
        connection.execute("BEGIN")  # the store's connections commit each statement otherwise
        connection.execute("SELECT 1 FROM kai_sessions.leases FOR UPDATE")
        wait_until_expired(admin, paused)

        start = time.monotonic()
        with pytest.raises(SessionLockedError) as refused:
            taker.acquire("s", "host-b", 60)
        assert time.monotonic() - start < 2.0
        assert str(refused.value) == (
            "session 's': a batch in flight keeps its lease locked (waited 0.2 s for it); try again"
        )

        # The server ends the paused transaction's session, and the takeover goes through.
        deadline = time.monotonic() + WAIT
        while True:
            try:
                taken = taker.acquire("s", "host-b", 60)
                break
            except SessionLockedError:
                assert time.monotonic() < deadline, "the paused transaction was never ended"
        with pytest.raises(psycopg.Error, match="idle-in-transaction timeout"):
            connection.execute("SELECT 1")
        assert connection.broken
    assert (taken.owner, taken.epoch) == ("host-b", 2)


def test_a_takeover_waits_for_the_batch_in_flight(
    open_store: OpenStore, admin: Admin, postgres_dsn: str
) -> None:
    holder, taker = open_store(lock_timeout=WAIT), open_store(lock_timeout=0.2)
    lease = holder.acquire("s", "host-a", 0.5)
    holder.append(lease, 0, TURN[:2])
    with psycopg.connect(postgres_dsn) as blocker, ThreadPoolExecutor(1) as pool:
        # The batch checks its lease, then waits on seq 3, which another transaction holds.
        blocker.execute(
            "INSERT INTO kai_sessions.events VALUES ('s', 3, 'turn/start', 0, 'blocker')"
        )
        batch = pool.submit(holder.append, lease, 2, TURN[2:4])
        blocked_backends(admin)
        wait_until_expired(admin, lease)

        # Expired, but a batch checked under it is in flight: no takeover until it ends.
        with pytest.raises(SessionLockedError, match=r"^session 's': a batch in flight keeps"):
            taker.acquire("s", "host-b", 60)
        blocker.rollback()
        assert batch.result(WAIT) == 2

    taken = taker.acquire("s", "host-b", 60)
    assert (taken.owner, taken.epoch) == ("host-b", 2)
    assert taker.read("s").records == RECORDS[:4]  # the new holder sees every acknowledged event


@pytest.mark.parametrize("size", [1, 2], ids=["one event", "two events"])
def test_a_batch_that_waited_for_its_lease_row_during_a_takeover_is_refused(
    open_store: OpenStore, admin: Admin, postgres_dsn: str, size: int
) -> None:
    store = open_store(lock_timeout=WAIT)
    lease = store.acquire("s", "host-a", 60)
    store.append(lease, 0, TURN[:2])
    with psycopg.connect(postgres_dsn) as taker, ThreadPoolExecutor(1) as pool:
        # A takeover in flight: it holds the lease row, and has not committed yet.
        taker.execute(
            "UPDATE kai_sessions.leases SET owner = 'host-b', epoch = epoch + 1 "
            "WHERE session_id = 's'"
        )
        batch = pool.submit(store.append, lease, 2, TURN[2 : 2 + size])
        blocked_backends(admin)
        taker.commit()  # the batch's statement goes on, and reads the lease row as it is now
        with pytest.raises(LeaseLostError) as lost:
            batch.result(WAIT)

    assert str(lost.value) == (
        "the lease of 'host-a' (epoch 1) on session 's' was taken over by 'host-b' (epoch 2); "
        "refusing to write"
    )
    assert stored_seqs(admin, "s") == [0, 1]


@pytest.mark.parametrize(
    ("expected_count", "batch", "written"),
    [
        (3, TURN[3:4], 1),  # follows the event committed meanwhile
        (2, TURN[2:4], 1),  # starts with it: only the rest is written
        (2, [event("step/start", 2, {"turn": 1, "step": 99})], None),  # differs from it
    ],
    ids=["follows it", "repeats it", "differs from it"],
)
def test_a_batch_that_waited_for_its_lease_row_counts_what_was_committed_meanwhile(
    open_store: OpenStore,
    admin: Admin,
    postgres_dsn: str,
    expected_count: int,
    batch: list[SessionEvent],
    written: int | None,
) -> None:
    store = open_store(lock_timeout=WAIT)
    lease = store.acquire("s", "host-a", 60)
    store.append(lease, 0, TURN[:2])
    with psycopg.connect(postgres_dsn) as other, ThreadPoolExecutor(1) as pool:
        # Another transaction holds the lease row and stores seq 2 under the same lease, as a
        # batch that the store gave up on (but the server ran anyway) would.
        other.execute("SELECT FROM kai_sessions.leases WHERE session_id = 's' FOR UPDATE")
        other.execute(
            "INSERT INTO kai_sessions.events VALUES ('s', 2, %s, %s, %s)",
            (TURN[2].type, TURN[2].time, RECORDS[2]),
        )
        appended = pool.submit(store.append, lease, expected_count, batch)
        blocked_backends(admin)
        other.commit()
        if written is None:
            with pytest.raises(SeqMismatchError, match="a different event at that seq"):
                appended.result(WAIT)
        else:
            assert appended.result(WAIT) == written

    assert store.read("s").records == (RECORDS[:3] if written is None else RECORDS[:4])


def test_a_batch_whose_event_type_holds_a_newline_is_stored_as_given(
    open_store: OpenStore, admin: Admin
) -> None:
    store = open_store()
    lease = store.acquire("s", "host-a", 60)
    store.append(lease, 0, TURN[:1])
    odd = [
        SessionEvent("x/two\nlines", 1, T0 + 1, {"n": 1}, ignorable=True),
        SessionEvent("x/one,line", 2, T0 + 2, {"n": 2}, ignorable=True),
        TURN[3],
    ]

    assert store.append(lease, 1, odd) == 3

    assert store.read("s").records == (RECORDS[0], *(item.encode() for item in odd))
    assert fetch(admin, "SELECT seq, type FROM kai_sessions.events ORDER BY seq") == [
        (0, TURN[0].type),
        (1, "x/two\nlines"),
        (2, "x/one,line"),
        (3, TURN[3].type),
    ]


def test_the_batches_of_a_session_run_one_prepared_statement(
    open_store: OpenStore,
) -> None:
    store = open_store(max_connections=1)
    lease = store.acquire("s", "host-a", 60)
    for seq, item in enumerate(TURN):  # the first creates the session; six more, one each
        store.append(lease, seq, [item])

    with store._pool.connection() as connection:
        prepared = fetch(
            connection,
            "SELECT name, generic_plans + custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE %s",
            "%INSERT INTO%events%FOR UPDATE OF lease%",
        )
    # Prepared by the store on its first use: one statement for every one-event batch.
    assert prepared == [("kai_append_event", len(TURN) - 1)]
    assert store.read("s").records == RECORDS


def test_a_prepared_statement_the_connection_lost_is_prepared_again(
    open_store: OpenStore,
) -> None:
    # psycopg runs DEALLOCATE ALL on a connection after a rollback or a schema change, which
    # drops the store's own prepared statements too.
    store = open_store(max_connections=1)
    lease = store.acquire("s", "host-a", 60)
    store.append(lease, 0, TURN[:1])
    store.append(lease, 1, TURN[1:2])  # prepared
    with store._pool.connection() as connection:
        connection.execute("DEALLOCATE ALL")
    assert store.append(lease, 2, TURN[2:3]) == 1
    assert store.append(lease, 3, TURN[3:5]) == 2

    # A batch refused inside a transaction (a gap) rolls it back; the next batch still goes.
    with pytest.raises(SeqMismatchError):
        store.append(lease, 9, TURN[5:6])
    assert store.append(lease, 5, TURN[5:6]) == 1
    assert store.append(lease, 6, TURN[6:]) == 1
    assert store.read("s").records == RECORDS


def test_an_error_of_the_prepared_statement_is_the_servers(
    open_store: OpenStore, admin: Admin
) -> None:
    store = open_store(max_connections=1)
    lease = store.acquire("s", "host-a", 60)
    store.append(lease, 0, TURN[:1])
    admin.execute("ALTER TABLE kai_sessions.events ADD CHECK (length(record) < 20) NOT VALID")
    with pytest.raises(PersistenceError) as refused:
        store.append(lease, 1, TURN[1:2])
    assert isinstance(refused.value.__cause__, psycopg.errors.CheckViolation)
    assert "violates check constraint" in str(refused.value)
    assert stored_seqs(admin, "s") == [0]


# -- batches of several sessions ----------------------------------------------------------------


def test_append_many_writes_several_sessions_in_one_transaction(
    open_store: OpenStore, admin: Admin
) -> None:
    store = open_store()
    a, b = store.acquire("a", "host", 60), store.acquire("b", "host", 60)
    store.append(b, 0, TURN[:1])

    assert store.append_many([Batch(a, 0, TURN[:3]), Batch(b, 1, TURN[1:4])]) == [3, 3]

    assert store.read("a").records == RECORDS[:3]
    assert store.read("b").records == RECORDS[:4]
    transactions = fetch(
        admin,
        "SELECT DISTINCT xmin::text FROM kai_sessions.events WHERE session_id = 'a' OR seq > 0",
    )
    assert len(transactions) == 1  # one transaction id for all six rows


def test_append_many_writes_nothing_if_one_batch_is_refused(
    open_store: OpenStore, admin: Admin
) -> None:
    store, other = open_store(), open_store()
    a = store.acquire("a", "host", 60)
    b = store.acquire("b", "host", 0.5)
    wait_until_expired(admin, b)
    other.acquire("b", "other-host", 60)

    with pytest.raises(LeaseLostError, match=r"on session 'b' was taken over by 'other-host'"):
        store.append_many([Batch(a, 0, TURN[:2]), Batch(b, 0, TURN[:2])])
    with pytest.raises(SeqMismatchError, match=r"^session 'a': refusing to write seq 1 at "):
        store.append_many([Batch(a, 1, TURN[1:2])])

    assert fetch(admin, "SELECT count(*) FROM kai_sessions.events") == [0]
    assert fetch(admin, "SELECT count(*) FROM kai_sessions.sessions") == [0]


# -- the server restarting, dropping connections, or down ---------------------------------------


def test_acknowledged_events_survive_an_immediate_restart(
    open_store: OpenStore, postgres_server: PostgresServer
) -> None:
    store = open_store()
    lease = store.acquire("s", "host-a", 60)
    for seq in range(len(TURN)):
        assert store.append(lease, seq, TURN[seq : seq + 1]) == 1

    postgres_server.restart(mode="immediate")

    assert store.read("s").records == RECORDS  # the same store, on new connections
    more = event("turn/start", len(TURN), {"turn": 2})
    assert store.append(lease, len(TURN), [more]) == 1
    assert store.read("s").records == (*RECORDS, more.encode())


def test_a_terminated_connection_is_replaced_for_the_next_append(
    open_store: OpenStore, postgres_server: PostgresServer
) -> None:
    store = open_store()
    lease = store.acquire("s", "host-a", 60)
    store.append(lease, 0, TURN[:2])

    assert postgres_server.terminate_backends(APP) >= 1

    assert store.append(lease, 2, TURN[2:4]) == 2
    assert store.read("s").records == RECORDS[:4]


def terminate(admin: Admin, pids: list[int]) -> None:
    """Terminate exactly these backends, and wait until they are gone.

    Not every connection of the store: the retry of an attempt may run on one of its idle
    connections, which a statement terminating them all one after another could end next.
    """
    assert fetch(admin, "SELECT pg_terminate_backend(pid, 10000) FROM unnest(%s) AS pid", pids)


@pytest.mark.parametrize("outcome", ["retried", "failed"])
def test_a_batch_whose_connection_is_terminated_is_all_or_nothing(
    open_store: OpenStore,
    admin: Admin,
    postgres_dsn: str,
    outcome: str,
) -> None:
    store = open_store(lock_timeout=WAIT)
    lease = store.acquire("s", "host-a", 60)
    store.append(lease, 0, TURN[:2])
    # Another transaction inserts seq 4 without committing: the batch 2..5 inserts 2 and 3,
    # then waits on seq 4 until that transaction ends, in the middle of its own.
    with psycopg.connect(postgres_dsn) as blocker, ThreadPoolExecutor(1) as pool:
        blocker.execute(
            "INSERT INTO kai_sessions.events VALUES ('s', 4, 'turn/start', 0, 'blocker')"
        )
        batch: Future[int] = pool.submit(store.append, lease, 2, TURN[2:6])
        first = blocked_backends(admin)

        terminate(admin, first)
        second = blocked_backends(admin, *first)  # the store tried again, on a new connection
        assert stored_seqs(admin, "s") == [0, 1]  # nothing of the terminated attempt
        if outcome == "retried":
            blocker.rollback()
            assert batch.result(WAIT) == 4  # everything, once
        else:
            terminate(admin, second)  # it tries only once more
            with pytest.raises(PersistenceError) as failed:
                batch.result(WAIT)
            assert str(failed.value).endswith(
                ": appending to session 's' failed: terminating connection due to "
                "administrator command"
            )
            assert stored_seqs(admin, "s") == [0, 1]  # nothing
            blocker.rollback()
            assert store.append(lease, 2, TURN[2:6]) == 4  # a later append works

    assert store.read("s").records == RECORDS[:6]


def test_a_server_that_is_down_fails_within_a_bound_and_the_store_recovers(
    open_store: OpenStore, postgres_server: PostgresServer
) -> None:
    # One connection: once the server is back, a request must not wait for a reconnection
    # attempt that the pool's backoff put off (1, 2, 4... seconds after the server went away).
    store = open_store(pool_timeout=1.0, max_connections=1)
    lease = store.acquire("s", "host-a", 60)
    store.append(lease, 0, TURN[:2])

    postgres_server.stop()
    try:
        for call, what in (
            (lambda: store.append(lease, 2, TURN[2:4]), "appending to session 's'"),
            (lambda: store.read("s"), "reading session 's'"),
            (lambda: store.renew(lease), "renewing the lease on session 's'"),
            (lambda: store.list_sessions(), "listing sessions"),
        ):
            start = time.monotonic()
            with pytest.raises(PersistenceError) as failed:
                call()
            took = time.monotonic() - start
            assert 0.9 < took < 3.0, f"{what} failed after {took:.2f} s"
            assert str(failed.value).endswith(
                f": {what} failed: couldn't get a connection after 1.00 sec"
            )
            assert isinstance(failed.value.__cause__, psycopg.OperationalError)
    finally:
        postgres_server.start()

    assert store.append(lease, 2, TURN[2:4]) == 2  # the same store, without being recreated
    assert store.read("s").records == RECORDS[:4]
