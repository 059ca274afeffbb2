"""The persistence contract, run against both backends with the same expectations.

Each test gets a :class:`Kit` for the JSONL backend (real files with fsync) or the PostgreSQL
backend (a real server the tests started): a factory of backends, and what a test needs to
look at or damage the store from outside. A fault is real for each: a write that fails half way for
JSONL, a database that refuses the insert for PostgreSQL; a write held in flight is a write
blocked in the file layer, or an insert waiting for a table lock.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from kai_session_checkpoint_policy import (
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    Host,
    SessionEvent,
    SessionExistsError,
    policy,
)
from kai_session_checkpoint_policy.events import JSON, JSONObject, SurfaceOp, SurfaceReplace
from kai_session_checkpoint_policy.persistence import (
    CorruptLogError,
    InvalidSessionIdError,
    JsonlSessionPersistence,
    LiveSessionError,
    PersistenceError,
    SeqMismatchError,
    SessionLocation,
    SessionNotFoundError,
    SessionSnapshot,
    StoredLog,
)

from ..support.paying import paying_host, result_text
from ..support.persistence_helpers import (
    COMPLETE_TURN,
    T0,
    FailingFiles,
    GatedFiles,
    assistant,
    event,
    events,
    log_bytes,
    log_path,
    tool_call,
    write_log,
)

if TYPE_CHECKING:
    from kai_session_checkpoint_policy.persistence import PostgresSessionPersistence

Backend: TypeAlias = "JsonlSessionPersistence | PostgresSessionPersistence"

pytestmark = pytest.mark.anyio

APP = "kai-test-contract"
"""The application name of the PostgreSQL backends under test."""
WAIT = 10.0


class Files(GatedFiles, FailingFiles):
    """Real files whose next write can be held (:class:`GatedFiles`) or fail (``fail``)."""


@dataclass
class Kit:
    """One backend under the contract, and a view of its store from outside."""

    name: str
    make: Callable[..., Backend]
    """A new backend on the store: ``make(batch_window=60)``."""
    seed: Callable[[str, Sequence[SessionEvent]], None]
    """Store a log as a writer that crashed (and whose lock or lease is gone) left it."""
    stored: Callable[[str], list[object]]
    """The events stored for a session, as JSON objects, read without the backend."""
    corrupt: Callable[[str, int], None]
    """Damage the stored event at a seq."""
    location: Callable[[str], str]
    """Where a session's log is, as the backend names it."""
    position: Callable[[int], str]
    """Where an event is in its log, as a corrupt-log error names it."""
    not_found: Callable[[str], str]
    """The message for a session the store does not hold."""
    failing: Callable[[], Any]
    """A context manager: while it is entered, every write fails."""
    fault: type[Exception]
    """What a failing write raises."""
    fault_text: str
    """What its message ends with."""
    hold: Callable[[], Any]
    """A context manager that holds the next write in flight; yields a :class:`Held`."""
    closers: list[Callable[[], None]] = field(default_factory=list)
    raw: Callable[[str], bytes] | None = None
    """A session's artifact as written, read without the backend; ``None`` for a backend
    without artifacts."""

    async def inspect(self, session_id: str) -> StoredLog:
        backend = self.make()
        try:
            return await backend.inspect(session_id)
        finally:
            await backend.aclose()

    async def load(self, session_id: str) -> StoredLog:
        backend = self.make()
        try:
            return await backend.load(session_id)
        finally:
            await backend.aclose()


@dataclass
class Held:
    """A write held in flight: wait until it is, then let it go."""

    entered: Callable[[], None]
    release: Callable[[], None]


def jsonl_kit(tmp_path: Path) -> Kit:
    root = tmp_path / "root"
    files = Files()

    def make(**options: Any) -> JsonlSessionPersistence:
        # Every write in a worker thread, so that a held write never blocks the event loop.
        # Plain lines, one event each, so that the kit reads the file as it is.
        return JsonlSessionPersistence(
            root,
            inline_write_limit=0,
            compression="none",
            pack_chunks=False,
            files=files,
            **options,
        )

    def path(session_id: str) -> Path:
        return log_path(root, session_id)

    def stored(session_id: str) -> list[object]:
        if not path(session_id).exists():
            return []
        return [json.loads(line) for line in path(session_id).read_bytes().splitlines()[1:]]

    def corrupt(session_id: str, seq: int) -> None:
        lines = path(session_id).read_bytes().splitlines(keepends=True)
        lines[seq + 1] = b"{not json\n"
        path(session_id).write_bytes(b"".join(lines))

    @contextmanager
    def failing() -> Iterator[None]:
        files.fail["write-after-partial"] = 1 << 30  # half the batch reaches the file first
        try:
            yield
        finally:
            files.fail["write-after-partial"] = 0

    @contextmanager
    def hold() -> Iterator[Held]:
        files.gate_next = True
        try:
            yield Held(lambda: _wait(files.entered), files.release.set)
        finally:
            files.release.set()

    return Kit(
        name="jsonl",
        make=make,
        seed=lambda session_id, logged: _ignore(
            write_log(root, session_id, log_bytes(session_id, logged))
        ),
        stored=stored,
        corrupt=corrupt,
        location=lambda session_id: str(path(session_id)),
        position=lambda seq: f"line {seq + 2}",
        not_found=lambda session_id: f"no session {session_id!r} under {root}",
        failing=failing,
        fault=OSError,
        fault_text="injected write-after-partial failure",
        hold=hold,
        raw=lambda session_id: path(session_id).read_bytes(),
    )


def postgres_kit(dsn: str) -> Kit:
    import psycopg

    from kai_session_checkpoint_policy.persistence import PostgresSessionPersistence
    from kai_session_checkpoint_policy.persistence.postgres.store import PostgresSessionStore

    admin = psycopg.connect(dsn, autocommit=True)
    backends: list[PostgresSessionPersistence] = []

    def make(**options: Any) -> PostgresSessionPersistence:
        backend = PostgresSessionPersistence(
            dsn, application_name=APP, lock_timeout=WAIT, **options
        )
        backends.append(backend)
        return backend

    def seed(session_id: str, logged: Sequence[SessionEvent]) -> None:
        with PostgresSessionStore(dsn) as store:
            # A writer that crashed, and whose lease has expired since.
            lease = store.acquire(session_id, "crashed-host", 60)
            store.append(lease, 0, logged)
            store.release(lease)

    def stored(session_id: str) -> list[object]:
        if not _has_schema(admin):
            return []
        rows = admin.execute(
            "SELECT record FROM kai_sessions.events WHERE session_id = %s ORDER BY seq",
            (session_id,),
        ).fetchall()
        return [json.loads(record) for (record,) in rows]

    def corrupt(session_id: str, seq: int) -> None:
        admin.execute(
            "UPDATE kai_sessions.events SET record = '{not json' "
            "WHERE session_id = %s AND seq = %s",
            (session_id, seq),
        )

    @contextmanager
    def failing() -> Iterator[None]:
        admin.execute(
            "CREATE FUNCTION kai_sessions.refuse() RETURNS trigger LANGUAGE plpgsql "
            "AS $$ BEGIN RAISE EXCEPTION 'injected write failure'; END $$"
        )
        admin.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON kai_sessions.events "
            "FOR EACH STATEMENT EXECUTE FUNCTION kai_sessions.refuse()"
        )
        try:
            yield
        finally:
            admin.execute("DROP FUNCTION kai_sessions.refuse() CASCADE")

    @contextmanager
    def hold() -> Iterator[Held]:
        # Inserts wait for this lock (reads do not): the next batch stops inside its
        # transaction until it is released.
        with psycopg.connect(dsn) as locker:
            locker.execute("LOCK TABLE kai_sessions.events IN EXCLUSIVE MODE")
            released = threading.Event()

            def entered() -> None:
                deadline = time.monotonic() + WAIT
                query = (
                    "SELECT 1 FROM pg_stat_activity "
                    "WHERE application_name = %s AND wait_event_type = 'Lock'"
                )
                while not admin.execute(query, (APP,)).fetchall():
                    assert time.monotonic() < deadline, "no write ever waited for the lock"
                    admin.execute("SELECT pg_sleep(0.005)")

            def release() -> None:
                if not released.is_set():
                    released.set()
                    locker.rollback()

            try:
                yield Held(entered, release)
            finally:
                release()

    def close() -> None:
        for backend in backends:
            backend.store.close()
        admin.close()

    probe = PostgresSessionPersistence(dsn)
    where, database = probe.where, probe.store.where
    probe.store.close()
    return Kit(
        name="postgres",
        make=make,
        seed=seed,
        stored=stored,
        corrupt=corrupt,
        location=lambda session_id: f"{where}, session {session_id!r}",
        position=lambda seq: f"seq {seq}",
        not_found=lambda session_id: (
            f"no session {session_id!r} in the PostgreSQL session store, {database}"
        ),
        failing=failing,
        fault=PersistenceError,
        fault_text="failed: injected write failure",
        hold=hold,
        closers=[close],
    )


def _has_schema(admin: Any) -> bool:
    query = "SELECT 1 FROM pg_namespace WHERE nspname = 'kai_sessions'"
    return bool(admin.execute(query).fetchall())


def _ignore(_: object) -> None:
    return None


def _wait(entered: threading.Event) -> None:
    assert entered.wait(WAIT), "the write never started"


@pytest.fixture(params=["jsonl", "postgres"])
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kit]:
    if request.param == "jsonl":
        made = jsonl_kit(tmp_path)
    else:
        made = postgres_kit(request.getfixturevalue("postgres_dsn"))
    yield made
    for close in made.closers:
        close()


def as_json(logged: Sequence[SessionEvent]) -> list[object]:
    return [item.to_json() for item in logged]


def crashed_in_a_tool() -> list[SessionEvent]:
    """A complete turn, then a turn whose model asked for call c1, which started (tool/call)."""
    return events(
        *COMPLETE_TURN,
        ("turn/start", {"turn": 2}),
        ("step/start", {"turn": 2, "step": 1}),
        assistant(2, 1, "c1"),
        tool_call(2, 1, "c1"),
    )


def repair_of(log: StoredLog) -> list[tuple[str, int, object]]:
    """Each repair event's type and seq, and for a tool result its error code."""
    return [
        (
            item.type,
            item.seq,
            item.data["error"]["code"] if item.type == "tool/result" else None,  # type: ignore[index,call-overload]
        )
        for item in log.repair
    ]


# -- writing --------------------------------------------------------------------------------


async def test_events_are_durable_once_flushed_and_not_before(kit: Kit) -> None:
    backend = kit.make(batch_window=60)
    async with Host([backend]) as host:
        assert host.session_persistence is backend
        session = host.sessions.create("s/1")
        first = session.append("turn/start", {"turn": 1})
        second = session.append("user/message", {"text": "héllo ☃", "n": [1, 2.5, None, True]})
        assert kit.stored("s/1") == []

        assert await host.sessions.flush(session) is True

        assert kit.stored("s/1") == as_json([first, second])
        assert backend.durable_count("s/1") == 2
    stored = await kit.inspect("s/1")
    assert stored.events == (first, second)
    assert [(item.type, item.seq) for item in stored.repair] == [("turn/end", 2)]
    assert stored.location == kit.location("s/1")


async def test_a_flush_with_nothing_admitted_succeeds_and_writes_nothing(kit: Kit) -> None:
    backend = kit.make()
    async with Host([backend]) as host:
        session = host.sessions.create("quiet")
        assert await host.sessions.flush(session) is True  # the backend took part
        assert backend.statistics().batches == 0
    assert kit.stored("quiet") == []


async def test_the_window_writes_in_the_background_while_events_keep_coming(kit: Kit) -> None:
    backend = kit.make(batch_window=0.05)
    async with Host([backend]) as host:
        session = host.sessions.create("window")
        with anyio.fail_after(WAIT):
            # A debounce would never fire while events keep arriving; the window does.
            while backend.durable_count("window") == 0:
                session.append("assistant/chunk", {"n": session.seq})
                await anyio.sleep(0.001)
        # Written with no flush while events kept arriving; the last ones may have arrived
        # during the write, or not, as the machine's speed decides. The next window's write
        # may be landing in a worker thread right now: the count read here is what the store
        # holds at least.
        durable = backend.durable_count("window")
        assert session.seq >= durable > 0
        assert len(kit.stored("window")) >= durable
    assert kit.stored("window") == as_json(session.events)  # closing the host drained the rest


async def test_concurrent_flushes_share_one_barrier_that_drains_late_events(kit: Kit) -> None:
    backend = kit.make(batch_window=60)
    async with Host([backend]) as host:
        session = host.sessions.create("barrier")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
        session.append("step/start", {"turn": 1, "step": 1})
        finished: list[str] = []

        async def flush(name: str) -> None:
            await host.sessions.flush(session)
            finished.append(name)

        with kit.hold() as held:
            async with anyio.create_task_group() as group:
                group.start_soon(flush, "first")
                await anyio.to_thread.run_sync(held.entered)
                group.start_soon(flush, "second")
                late = session.append("user/message", {"late": True})  # while the write runs
                await anyio.wait_all_tasks_blocked()
                assert finished == []
                held.release()
        assert sorted(finished) == ["first", "second"]
        assert backend.durable_count("barrier") == 3
        assert (backend.statistics().batches, backend.statistics().pending_events) == (3, 0)
        assert kit.stored("barrier")[-1] == late.to_json()


async def test_a_burst_of_32_tool_checkpoints_is_one_batch(kit: Kit) -> None:
    backend = kit.make(batch_window=60)
    async with Host([backend]) as host:
        session = host.sessions.create("burst")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
        for index in range(32):
            session.append("tool/call", {"callId": f"c{index}"})
        async with anyio.create_task_group() as group:
            for _ in range(32):
                group.start_soon(host.sessions.flush, session)
        assert backend.statistics().batches == 2
        assert backend.durable_count("burst") == 33
    assert [record["seq"] for record in kit.stored("burst")] == list(range(33))  # type: ignore[index]


async def test_a_gap_is_refused_and_nothing_is_written(kit: Kit) -> None:
    backend = kit.make(batch_window=60)
    expected = (
        "session 'gap': refusing to write seq 5 at position 0 of a batch; "
        "the stored log holds 1 events, so seq 1 was expected"
    )
    # The close tries the refused batch again, and raises; what the block saw is checked
    # after it, so that no failed assertion is hidden behind that error.
    with pytest.raises(SeqMismatchError) as at_close:  # noqa: PT012
        async with Host([backend]) as host:
            session = host.sessions.create("gap")
            first = session.append("turn/start", {"turn": 1})
            await host.sessions.flush(session)
            backend.session_event(session, event("step/start", 5, {}))
            try:
                await host.sessions.flush(session)
            except SeqMismatchError as exc:
                refused = str(exc)
            stored = kit.stored("gap")
    assert refused == expected
    assert stored == as_json([first])
    assert str(at_close.value) == expected
    assert kit.stored("gap") == as_json([first])


# -- failing closed -------------------------------------------------------------------------


async def test_a_failed_write_keeps_its_batch_for_the_next_flush(kit: Kit) -> None:
    backend = kit.make(batch_window=60)
    async with Host([backend]) as host:
        session = host.sessions.create("retry")
        first = session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
        session.append("step/start", {"turn": 1, "step": 1})
        session.append("user/message", {"n": 1})
        with kit.failing():
            for _ in range(2):
                with pytest.raises(kit.fault) as failed:
                    await host.sessions.flush(session)
                assert str(failed.value).endswith(kit.fault_text)
                assert kit.stored("retry") == as_json([first])
                assert backend.durable_count("retry") == 1
                assert backend.statistics().pending_events == 2

        await host.sessions.flush(session)

        assert kit.stored("retry") == as_json(session.events)  # every event once
        assert backend.statistics().pending_events == 0


async def test_a_failed_checkpoint_keeps_the_tool_body_from_running(kit: Kit) -> None:
    backend = kit.make(batch_window=60)
    faults = kit.failing()
    # The store fails from the model's first request on: the tool's checkpoint fails.
    async with paying_host([backend, policy], faults.__enter__) as paying:
        session = paying.host.sessions.create("fail-closed")
        try:
            outcome = await paying.turn(session)
        finally:
            faults.__exit__(None, None, None)
        assert paying.bodies == []
        text = result_text(session)
        assert text.startswith("Error: ")
        assert text.endswith(kit.fault_text)
        assert outcome.reason["kind"] == "error"  # the next step's checkpoint failed too
        await paying.host.sessions.flush(session)
    assert kit.stored("fail-closed") == as_json(session.events)


# -- one writer -------------------------------------------------------------------------------


async def test_a_new_session_cannot_overwrite_a_stored_one(kit: Kit) -> None:
    logged = events(*COMPLETE_TURN)
    kit.seed("taken", logged)
    backend = kit.make()
    async with Host([backend]) as host:
        with pytest.raises(SessionExistsError) as refused:
            host.sessions.create("taken")
        assert str(refused.value) == (
            f"session 'taken' already has a log in {backend.name}: continue it with "
            "'await host.sessions.resume('taken')', which recovers it first"
        )
        assert host.sessions.get("taken") is None
    assert kit.stored("taken") == as_json(logged)


async def test_a_log_another_writer_created_meanwhile_is_not_written_over(kit: Kit) -> None:
    logged = events(*COMPLETE_TURN)
    exists = (
        f"session 'raced' already has a log of 6 events at {kit.location('raced')}; "
        "a new session cannot write over it"
    )
    with pytest.raises(SessionExistsError) as at_close:  # noqa: PT012 (checked after the close)
        async with Host([kit.make()]) as host:
            session = host.sessions.create("raced")
            kit.seed("raced", logged)
            session.append("turn/start", {"turn": 1})
            try:
                await host.sessions.flush(session)
            except SessionExistsError as exc:
                refused = str(exc)
    assert refused.startswith(exists)
    assert str(at_close.value).startswith(exists)
    assert kit.stored("raced") == as_json(logged)


# -- loading and repair -----------------------------------------------------------------------


async def test_inspect_shows_the_repair_and_changes_nothing(kit: Kit) -> None:
    logged = crashed_in_a_tool()
    kit.seed("crashed", logged)

    stored = await kit.inspect("crashed")

    assert stored.events == tuple(logged)
    assert repair_of(stored) == [
        ("tool/result", 10, TOOL_OUTCOME_UNKNOWN),
        ("step/end", 11, None),
        ("turn/end", 12, None),
    ]
    assert stored.repair[-1].data == {"turn": 2, "reason": {"kind": "interrupted"}}
    assert stored.torn_bytes == 0
    assert kit.stored("crashed") == as_json(logged)


async def test_load_makes_the_repair_durable_once_and_the_session_goes_on(kit: Kit) -> None:
    logged = crashed_in_a_tool()
    kit.seed("crashed", logged)

    loaded = await kit.load("crashed")

    assert loaded.events == (*logged, *loaded.repair)
    assert [item.seq for item in loaded.repair] == [10, 11, 12]
    assert kit.stored("crashed") == as_json(loaded.events)
    again = await kit.load("crashed")
    assert (again.events, again.repair) == (loaded.events, ())
    async with Host([kit.make()]) as host:
        resumed = await host.sessions.resume("crashed")
        assert resumed.append("turn/start", {"turn": 3}).seq == 13
    assert [record["seq"] for record in kit.stored("crashed")] == list(range(14))  # type: ignore[index]


async def test_a_call_that_never_reached_a_durable_tool_call_is_not_started(kit: Kit) -> None:
    logged = events(*COMPLETE_TURN[:3], assistant(1, 1, "c1"))
    kit.seed("asked", logged)

    loaded = await kit.load("asked")

    assert repair_of(loaded) == [
        ("tool/result", 4, TOOL_NOT_STARTED),
        ("step/end", 5, None),
        ("turn/end", 6, None),
    ]


async def test_loading_a_live_open_turn_is_refused(kit: Kit) -> None:
    backend = kit.make()
    async with Host([backend]) as host:
        session = host.sessions.create("open")
        session.append("turn/start", {"turn": 1})
        with pytest.raises(LiveSessionError, match=r"^cannot load session 'open' while its live"):
            await backend.load("open")
        session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        loaded = await backend.load("open")
        assert loaded.events == tuple(session.events)
        assert backend.durable_count("open") == 2


async def test_closing_the_host_drains_every_session(kit: Kit) -> None:
    async with Host([kit.make(batch_window=60)]) as host:
        for name in ("a", "b"):
            session = host.sessions.create(name)
            for turn in (1, 2, 3):
                session.append("turn/start", {"turn": turn})
    assert [len(kit.stored(name)) for name in ("a", "b")] == [3, 3]


async def test_cancelling_a_flush_never_tears_its_write(kit: Kit) -> None:
    backend = kit.make(batch_window=60)
    async with Host([backend]) as host:
        session = host.sessions.create("shielded")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
        session.append("step/start", {"turn": 1, "step": 1})
        session.append("user/message", {"text": "x" * 10_000})
        with kit.hold() as held, anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(host.sessions.flush, session)
                await anyio.to_thread.run_sync(held.entered)
                scope.cancel()  # the flush is waiting for its write: cancel it now
                held.release()
            await anyio.lowlevel.checkpoint()  # the cancellation is still delivered
        assert scope.cancelled_caught
        assert backend.durable_count("shielded") == 3
    assert kit.stored("shielded") == as_json(session.events)


# -- bad input ----------------------------------------------------------------------------------


async def test_a_missing_session_and_a_bad_id_are_named(kit: Kit) -> None:
    backend = kit.make()
    try:
        for read in (backend.inspect, backend.load):
            with pytest.raises(SessionNotFoundError) as missing:
                await read("ghost")
            assert str(missing.value) == kit.not_found("ghost")
            with pytest.raises(InvalidSessionIdError, match=r"^a session id must be a non-empty"):
                await read("")
        with pytest.raises(InvalidSessionIdError, match=r"^a session id must be a non-empty"):
            backend.session_exists("")
        assert backend.session_exists("ghost") is False
    finally:
        await backend.aclose()


async def test_a_corrupt_event_is_refused_naming_it_and_nothing_changes(kit: Kit) -> None:
    logged = crashed_in_a_tool()
    kit.seed("damaged", logged)
    kit.seed("intact", logged)
    kit.corrupt("damaged", 3)
    before = kit.stored("intact")

    for read in (kit.inspect, kit.load):
        with pytest.raises(CorruptLogError) as refused:
            await read("damaged")
        assert str(refused.value).startswith(
            f"corrupt session log {kit.location('damaged')}, {kit.position(3)}: not valid JSON"
        )

    assert len((await kit.load("intact")).repair) == 3  # one bad session hides no other
    assert kit.stored("intact")[: len(before)] == before


# -- reads that need not load everything --------------------------------------------------------


async def test_read_from_gives_exactly_the_stored_suffix(kit: Kit) -> None:
    logged = crashed_in_a_tool()
    kit.seed("crashed", logged)
    backend = kit.make()
    try:
        suffix = await backend.read_from("crashed", 7)
        assert suffix.from_seq == 7
        assert as_json(suffix.events) == as_json(logged[7:])  # no closers: it ends open
        assert suffix.header.id == "crashed"
        assert suffix.revision == await backend.revision("crashed")
        assert as_json((await backend.read_from("crashed", 0)).events) == as_json(logged)
        for past in (len(logged), len(logged) + 5):
            assert (await backend.read_from("crashed", past)).events == ()
        for bad in (-1, 1.5, True, "3", None):
            with pytest.raises(ValueError, match=r"^from_seq must be a non-negative integer, not "):
                await backend.read_from("crashed", bad)  # type: ignore[arg-type]
        with pytest.raises(SessionNotFoundError) as missing:
            await backend.read_from("ghost", 0)
        assert str(missing.value) == kit.not_found("ghost")
    finally:
        await backend.aclose()
    assert kit.stored("crashed") == as_json(logged)  # nothing repaired


async def test_locate_names_where_a_session_is_without_touching_the_store(kit: Kit) -> None:
    backend = kit.make()
    try:
        assert backend.locate("s/1") == SessionLocation(kit.name, kit.location("s/1"))
        assert backend.session_exists("s/1") is False
        with pytest.raises(InvalidSessionIdError):
            backend.locate("")
        async with Host([kit.make()]) as host:
            session = host.sessions.create("s/1")
            session.append("turn/start", {"turn": 1})
            await host.sessions.flush(session)
        assert (await backend.inspect("s/1")).location == backend.locate("s/1").path
    finally:
        await backend.aclose()


async def test_a_revision_is_stable_until_an_append_or_a_repair(kit: Kit) -> None:
    kit.seed("crashed", crashed_in_a_tool())
    kit.seed("other", events(*COMPLETE_TURN))
    backend = kit.make()
    try:
        first = await backend.revision("crashed")
        assert isinstance(first, str)
        assert await backend.revision("crashed") == first
        await backend.inspect("crashed")
        await backend.read_from("crashed", 3)
        assert await backend.revision("crashed") == first  # reads change nothing
        repaired = await kit.load("crashed")  # the repair appends closers
        after_repair = await backend.revision("crashed")
        assert after_repair not in (None, first)
        await kit.load("crashed")  # nothing left to repair
        assert await backend.revision("crashed") == after_repair
        async with Host([kit.make()]) as host:
            resumed = await host.sessions.resume("crashed")
            resumed.append("turn/start", {"turn": 3})
            await host.sessions.flush(resumed)
        appended = await backend.revision("crashed")
        assert appended not in (None, first, after_repair)
        assert len(repaired.events) == 13
        assert await backend.revision("ghost") is None
    finally:
        await backend.aclose()


async def test_list_snapshots_gives_each_stored_session_and_its_revision(kit: Kit) -> None:
    kit.seed("b", events(*COMPLETE_TURN))
    kit.seed("a", crashed_in_a_tool())
    backend = kit.make()
    try:
        async with Host([kit.make()]) as host:
            host.sessions.create("never-written")  # no events: not stored, not listed
            snapshots = await backend.list_snapshots()
        listed = {snapshot.header.id: snapshot for snapshot in snapshots}
        assert sorted(listed) == ["a", "b"]
        for session_id, snapshot in listed.items():
            assert isinstance(snapshot, SessionSnapshot)
            assert snapshot.revision == await backend.revision(session_id)
        assert [snapshot.header for snapshot in snapshots] == await backend.list_sessions()
        await kit.load("a")
        again = {
            snapshot.header.id: snapshot.revision for snapshot in await backend.list_snapshots()
        }
        assert again["b"] == listed["b"].revision
        assert again["a"] != listed["a"].revision
    finally:
        await backend.aclose()


async def test_read_raw_gives_the_artifact_as_written_or_is_refused(kit: Kit) -> None:
    kit.seed("s", crashed_in_a_tool())
    backend = kit.make()
    try:
        if kit.raw is None:
            assert backend.supports_raw_artifacts is False
            with pytest.raises(PersistenceError, match=r"does not expose raw artifacts"):
                await backend.read_raw("s")
            return
        assert backend.supports_raw_artifacts is True
        artifact = await backend.read_raw("s")
        assert artifact is not None
        assert artifact.content == kit.raw("s")
        assert artifact.filename == "session.jsonl"
        assert artifact.header.id == "s"
        assert await backend.read_raw("ghost") is None
    finally:
        await backend.aclose()


async def test_a_cancelled_listing_returns_nothing(kit: Kit) -> None:
    kit.seed("s", events(*COMPLETE_TURN))
    backend = kit.make()
    try:
        for listing in (backend.list_sessions, backend.list_snapshots, backend.scan_sessions):
            returned: list[object] = []
            with anyio.CancelScope() as scope:
                scope.cancel()
                returned.append(await listing())
            assert scope.cancelled_caught
            assert returned == []
    finally:
        await backend.aclose()


# -- older records of format version 0 ----------------------------------------------------------


def older(*records: tuple[str, JSONObject, SurfaceOp | None]) -> list[SessionEvent]:
    """Events as an older release of the original harness wrote them: shapes of their own."""
    return [
        SessionEvent(event_type, seq, T0 + seq, data, None, surface)
        for seq, (event_type, data, surface) in enumerate(records)
    ]


TEXT: JSONObject = {"type": "text", "text": "hi"}


def before_identities() -> list[SessionEvent]:
    return older(
        ("turn/start", {"turn": 1}, None),
        ("step/start", {"turn": 1, "step": 1}, None),
        ("user/message", {"content": [TEXT], "source": {"kind": "prompt"}}, "append"),
        (
            "assistant/message",
            {
                "turn": 1,
                "step": 1,
                "content": [TEXT],
                "provenance": {"provider": "p", "model": "m"},
            },
            "append",
        ),
        (
            "tool/result",
            {"turn": 1, "step": 1, "callId": "c1", "content": [TEXT], "isError": False},
            "append",
        ),
        (
            "tool/result",
            {"turn": 1, "step": 1, "callId": "c1", "content": [], "isError": True},
            SurfaceReplace(4, 4),
        ),
        ("step/end", {"turn": 1, "step": 1}, None),
        ("turn/end", {"turn": 1, "reason": {"kind": "completed"}}, None),
    )


def tool_message(message_id: str, content: list[JSON], is_error: bool) -> JSONObject:
    block: JSONObject = {
        "type": "tool-result",
        "toolCallId": "c1",
        "content": content,
        "isError": is_error,
    }
    return {
        "id": message_id,
        "role": "user",
        "content": [block],
        "source": {"kind": "tool", "callId": "c1"},
    }


async def test_messages_from_before_message_identities_are_read_with_ids(kit: Kit) -> None:
    logged = before_identities()
    kit.seed("old", logged)
    stored = kit.stored("old")

    for read in (kit.inspect, kit.load):
        log = await read("old")
        assert log.repair == ()
        assert [item.data for item in log.events[2:6]] == [
            {
                "content": [TEXT],
                "source": {"kind": "prompt"},
                "id": "legacy-message:old:2",
                "role": "user",
            },
            {
                "turn": 1,
                "step": 1,
                "message": {
                    "id": "legacy-message:old:3",
                    "role": "assistant",
                    "content": [TEXT],
                    "source": {"provider": "p", "model": "m", "kind": "model"},
                },
            },
            {"turn": 1, "step": 1, "message": tool_message("legacy-message:old:4", [TEXT], False)},
            {"turn": 1, "step": 1, "message": tool_message("legacy-message:old:4", [], True)},
        ]
        assert log.events[5].surface_op == SurfaceReplace(4, 4)
    backend = kit.make()
    try:
        suffix = await backend.read_from("old", 5)  # the replacement takes an earlier id
        assert suffix.events[0].data["message"] == tool_message("legacy-message:old:4", [], True)
        assert [item.type for item in suffix.events] == ["tool/result", "step/end", "turn/end"]
    finally:
        await backend.aclose()
    assert kit.stored("old") == stored  # read as current events; never rewritten


async def test_a_log_from_before_the_react_loop_is_read(kit: Kit) -> None:
    steering: JSONObject = {"turn": 1, "content": [TEXT], "source": {"kind": "steering"}}
    wrapped: JSONObject = {"id": "m-9", "role": "user", "content": [], "source": {"kind": "x"}}
    logged = older(
        ("turn/start", {"turn": 1, "trigger": {"kind": "user"}}, None),
        ("steering/message", steering, "append"),
        ("steering/message", {"turn": 1, "message": wrapped}, "append"),
        ("turn/end", {"turn": 1, "reason": {"kind": "disposed"}}, None),
        ("turn/start", {"turn": 2, "trigger": {"kind": "user"}}, None),
        ("turn/end", {"turn": 2, "reason": {"kind": "aborted"}}, None),
        ("turn/start", {"turn": 3}, None),
        ("turn/end", {"turn": 3, "reason": {"kind": "error", "step": 1, "message": "x"}}, None),
    )
    kit.seed("react", logged)

    log = await kit.load("react")

    assert [(item.type, item.data) for item in log.events] == [
        ("turn/start", {"turn": 1}),
        (
            "user/message",
            {
                "content": [TEXT],
                "source": {"kind": "steering"},
                "id": "legacy-message:react:1",
                "role": "user",
            },
        ),
        ("user/message", wrapped),
        ("turn/end", {"turn": 1, "reason": {"kind": "aborted", "reason": {"kind": "disposed"}}}),
        ("turn/start", {"turn": 2}),
        ("turn/end", {"turn": 2, "reason": {"kind": "aborted", "reason": {"kind": "legacy"}}}),
        ("turn/start", {"turn": 3}),
        (
            "turn/end",
            {"turn": 3, "reason": {"kind": "error", "error": {"message": "x", "code": "UNKNOWN"}}},
        ),
    ]
    assert log.repair == ()
    assert log.events[1].surface_op == "append"


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        (
            ("request/header", {"header": {"config": {}}, "reason": "fallback"}, None),
            'the retired request/header reason "fallback"',
        ),
        (
            ("steering/message", {"turn": 1, "text": "hi"}, "append"),
            "a malformed steering/message from before the react loop",
        ),
        (
            ("turn/start", {"turn": 1, "trigger": "user"}, None),
            "a malformed turn/start from before the react loop",
        ),
        (
            ("turn/end", {"turn": 1, "reason": {"kind": "disposed", "by": "x"}}, None),
            "a malformed turn/end from before the react loop",
        ),
    ],
    ids=["fallback", "steering", "turn-start", "turn-end"],
)
async def test_a_retired_or_malformed_older_record_is_refused_naming_it(
    kit: Kit, record: tuple[str, JSONObject, SurfaceOp | None], problem: str
) -> None:
    logged = older(("turn/start", {"turn": 1}, None), record)
    if record[0] == "turn/start":
        logged = older(record)
    kit.seed("bad", logged)
    seq = len(logged) - 1
    for read in (kit.inspect, kit.load):
        with pytest.raises(CorruptLogError) as refused:
            await read("bad")
        assert (
            str(refused.value) == f"corrupt session log {kit.location('bad')}, seq {seq}: {problem}"
        )
    assert kit.stored("bad") == as_json(logged)
