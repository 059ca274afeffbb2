"""The PostgreSQL persistence backend: sessions that any of many hosts can pick up.

The queue, the windows, the flush barrier and the seq check are the backend-neutral core's
(:mod:`..core`), as for JSONL; this module makes a batch durable in a database transaction and
reads logs back, through the blocking store of :mod:`.store`, called from worker threads
(:func:`~..workers.run_in_worker`, on asyncio and on trio alike). An awaited flush commits on
the event loop's own thread instead when no other task is ready to run (on trio, after one
scheduler round: :func:`~..workers.loop_is_idle`), the lease
has more than a renewal period left and the session's recent commits were quick
(:data:`INLINE_WRITE_LIMIT`): handing one round trip to a thread and back costs more CPU than
the commit's own client side, and a loop with nothing else to run loses nothing by waiting.

**Leases.** A host writes a session only while it holds the session's lease: it takes the lease
with the session's first write (learning the durable count), renews all of its leases in one
statement every third of the lease's ttl (a task in the host's task group), and gives a
session's lease up when the session is detached or the host closes. Every batch is checked
against the lease's epoch in its own transaction, so a host whose lease was taken over is
refused by its next flush, and its adapter or tool body never runs; a flush with nothing to
write is refused too once the lease is known lost. A lease that expired while nobody took it
over (the database was down, the host was paused) is renewed at the next write, and the
session goes on. Loading a session takes its lease for the recovery, and gives it up after.

**Group commit.** A batch is one transaction; batches of different sessions due at the same
moment share one (:mod:`.group_commit`).

**Failure.** Every call is bounded (see :class:`PostgresSessionPersistence`): a database that is
down, restarting or stopped makes a flush fail, keeping its batch queued; once it is back, the next
flush writes the batch, and one whose acknowledgement was lost is recognised, never written
twice (:meth:`~.store.PostgresSessionStore.append_many`).

Each event is stored as the exact text of :meth:`SessionEvent.encode()
<kai_session_checkpoint_policy.SessionEvent.encode>`, and read back with the decoders of
:mod:`..records` that the JSONL backend reads its lines with, so a log copied between the two
backends reads the same in both.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Final, final

import anyio
import psycopg
from psycopg.conninfo import conninfo_to_dict

from ...cancellation import checkpoint_if_cancelled
from ...events import StoredEvents
from ..core import DEFAULT_BATCH_WINDOW, GroupWrite, WriteBehind
from ..errors import (
    CorruptRecordError,
    LeaseLostError,
    PersistenceError,
    SeqMismatchError,
    UnsupportedFormatError,
)
from ..legacy import LegacyRecordError, upgrade_events, upgrade_suffix
from ..options import check_seconds
from ..records import RecordError, collector_paused, decode_event, decode_run
from ..repair import repair_of
from ..values import (
    FORMAT_VERSION,
    PersistenceStatistics,
    RawArtifact,
    SessionListing,
    SessionLocation,
    SessionSnapshot,
    StoredLog,
    StoredSuffix,
    check_from_seq,
)
from ..workers import Gathering, run_in_worker
from .group_commit import GroupCommit
from .schema import DEFAULT_SCHEMA
from .store import (
    DEFAULT_STATEMENT_DEADLINE,
    Batch,
    PostgresSessionStore,
    check_storable_id,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    from ...events import SessionEvent
    from ..core import Outcome, Writer
    from ..values import SessionHeader
    from .store import Lease

__all__ = [
    "DEFAULT_LEASE_TTL",
    "INLINE_WRITE_LIMIT",
    "RENEWALS_PER_TTL",
    "PostgresSessionPersistence",
    "PostgresStatistics",
]

logger = logging.getLogger(__name__)

DEFAULT_LEASE_TTL: Final = 10.0
"""Seconds a lease lasts from its last renewal: how long a dead host's sessions stay locked."""
RENEWALS_PER_TTL: Final = 3
"""How often a lease is renewed within its ttl: a host may miss two renewals in a row."""
INLINE_WRITE_LIMIT: Final = 0.01
"""An awaited flush commits on the event loop's thread while the session's recent commits
took less than this many seconds (and nothing else is ready to run)."""


@final
@dataclass(frozen=True, slots=True)
class PostgresStatistics(PersistenceStatistics):
    """Counters of a PostgreSQL backend since it was created."""

    transactions: int
    """Transactions that made batches durable (batches of several sessions may share one)."""
    leases: int
    """Leases held now, on the live sessions that wrote."""


class _Lease:
    """The state of one session written here: its lease, and the durable count."""

    __slots__ = ("count", "header", "lease", "lost", "valid_until")

    def __init__(
        self, lease: Lease, count: int, valid_until: float, header: SessionHeader | None = None
    ) -> None:
        self.lease = lease
        self.header = header  # of the session, if its first batch is written with this lease
        self.count = count  # durable events: the seq the next event must have
        self.lost: LeaseLostError | None = None  # set once the lease is known taken over
        self.valid_until = valid_until  # monotonic time before which the lease surely holds


class _GroupWrite(GroupWrite[_Lease]):
    """One session's batch handed off the event loop's thread, to be committed with others."""

    __slots__ = ()

    def batch_of(self, log: _Lease) -> Batch:
        return Batch(log.lease, log.count, self.batch, log.header)


_DECODED_AT_ONCE: Final = 4096
"""How many stored lines are decoded in one call of the format's decoder of runs of lines."""


def _decode_records(records: Iterable[str], location: str) -> StoredEvents:
    """Decode stored log lines as the JSONL backend decodes its lines, seqs from 0.

    Runs of lines are decoded at once, as a log file's are; a run that is not all intact
    events is decoded a line at a time, which names the first that is not the event expected
    next.

    :raises CorruptRecordError: naming that line's seq.
    """
    events = StoredEvents()
    lines = iter(records)
    with collector_paused():  # as when reading a log file: a million events, few collections
        while run := list(islice(lines, _DECODED_AT_ONCE)):
            data = ("\n".join(run) + "\n").encode("utf-8", "surrogatepass")
            if not decode_run(events, data, 0, len(data)):
                events.extend(_decode_each(run, len(events), location))
    return events


def _decode_each(run: list[str], first: int, location: str) -> list[SessionEvent]:
    """Decode a run of stored lines one by one, their seqs from *first*."""
    events = []
    for seq, record in enumerate(run, start=first):
        try:
            events.append(decode_event(record, seq))
        except RecordError as error:
            if error.unsupported:
                raise UnsupportedFormatError(f"{location}, seq {seq}: {error.problem}") from None
            raise CorruptRecordError(location, seq, error.problem) from None
    return events


def _revision(count: int) -> str:
    """A stored session's revision: the format version, and how many events it holds."""
    return f"{FORMAT_VERSION}:{count}"


def _default_owner() -> str:
    """This backend's name in the leases it takes: host, process, and a token of its own."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"


class PostgresSessionPersistence(WriteBehind[_Lease]):
    """Persist every live session of a host in a PostgreSQL database, under single-writer leases.

    Register it on a :class:`~kai_session_checkpoint_policy.host.Host`: opening the host makes
    it the host's ``session_persistence``; closing the host drains every queue and gives every
    lease up. Reading (:meth:`list_sessions`, :meth:`inspect`, :meth:`load`) also works without
    a host; call :meth:`aclose` afterwards to close the connections.

    The database is reached on first use, in a worker thread, never while constructing; the
    schema is created or migrated by the first write (reading creates nothing).
    ``session_exists`` asks the database from the caller's thread, since it answers at once.

    :param dsn: A libpq connection string or ``postgresql://`` URI.
    :param lease_ttl: Seconds a lease lasts from its last renewal; renewed every third of it.
        A host that dies (or stops) keeps its sessions locked this long.
    :param batch_window: Seconds an event may wait before a background batch writes it.
    :param schema: The schema of the backend's tables, created by the first write.
    :param owner: The name this backend takes leases under; by default the machine's name,
        the process id and a random token. Two backends must never share one.
    :param pool_timeout: Seconds a call waits for a database connection: with the database
        down, a flush fails after about this long (twice, at most, if a connection broke).
    :param lock_timeout: Seconds a statement waits for a lock: a takeover waits this long for
        a batch in flight.
    :param statement_deadline: Seconds the server has to answer each statement, beyond the
        ``lock_timeout`` it may wait for a lock; then the statement is cancelled, its
        connection closed, and the flush fails. This bounds a server that stops answering
        while its connections stay open (a stopped server process, a network that drops
        everything): such a flush fails within ``statement_deadline + lock_timeout`` seconds,
        plus at most 1 s for the cancel request.
    :param max_connections: The most connections the backend opens at once.
    :param application_name: Shown in ``pg_stat_activity`` for the backend's connections.
    """

    name: Final = "session-persistence-postgres"
    durable_unit = "transactions"  # a batch is one (maybe shared) transaction

    def __init__(
        self,
        dsn: str,
        *,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        batch_window: float = DEFAULT_BATCH_WINDOW,
        schema: str = DEFAULT_SCHEMA,
        owner: str | None = None,
        pool_timeout: float = 5.0,
        lock_timeout: float = 2.0,
        statement_deadline: float = DEFAULT_STATEMENT_DEADLINE,
        max_connections: int = 4,
        application_name: str = "kai-session-checkpoint-policy",
    ) -> None:
        checked: object = dsn
        if not isinstance(checked, str):
            raise TypeError(f"dsn must be a connection string, not {checked!r}")
        try:
            conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            raise ValueError(f"dsn is not a PostgreSQL connection string: {exc}") from None
        chosen: object = owner if owner is not None else _default_owner()
        if not isinstance(chosen, str) or not chosen:
            raise ValueError(f"owner must be a non-empty string, not {chosen!r}")
        super().__init__(batch_window=check_seconds("batch_window", batch_window))
        self.dsn: Final = dsn
        self.lease_ttl: Final = check_seconds("lease_ttl", lease_ttl)
        self.owner: Final = chosen
        self.store: Final = PostgresSessionStore(
            dsn,
            schema=schema,
            pool_timeout=pool_timeout,
            lock_timeout=lock_timeout,
            statement_deadline=statement_deadline,
            max_connections=max_connections,
            application_name=application_name,
            open=False,  # connected on first use, from a worker thread
        )
        """The blocking store the backend calls from worker threads."""
        self.where: Final = f"PostgreSQL {self.store.where}, schema {schema!r}"
        """Where the sessions are, for messages: database, host, port, schema (no password)."""
        self._group = GroupCommit()
        self._gathering: Final[Gathering[_GroupWrite]] = Gathering(self._write_group)
        self._held: dict[_Lease, None] = {}  # the leases the renewer keeps, in order
        self._unreleased: list[Lease] = []  # leases to give up
        self._lease_statements = threading.Lock()  # a renewal and a release never cross
        self._renewer: tuple[anyio.CancelScope, anyio.Event] | None = None

    def __repr__(self) -> str:
        return f"<PostgresSessionPersistence {self.where}>"

    def session_exists(self, session_id: str) -> bool:
        """Whether the database holds a log for *session_id* (one query, from this thread)."""
        check_storable_id(session_id)
        return self.store.exists(session_id)

    def statistics(self) -> PostgresStatistics:
        core = super().statistics()
        return PostgresStatistics(
            sessions=core.sessions,
            pending_events=core.pending_events,
            batches=core.batches,
            transactions=self._group.transactions,
            leases=len(self._held),
        )

    async def aclose(self) -> None:
        """Drain every queue, give every lease up, stop renewing, close the connections.

        The first drain failure is raised (after the rest is done).
        """
        try:
            await super().aclose()
        finally:
            if self._renewer is not None:
                scope, stopped = self._renewer
                scope.cancel()
                await stopped.wait()  # a renewal in flight is waited out
                self._renewer = None
            await self._release_leases()
            await run_in_worker(self.store.close)

    def _writable(self) -> PostgresSessionStore:
        """The store, its schema created or migrated if it is not yet (blocking)."""
        self.store.migrate()
        return self.store

    # -- writing --------------------------------------------------------------------------------

    def _ready(
        self, session_id: str, log: _Lease | None, expected: int, header: SessionHeader | None
    ) -> _Lease:
        if log is None:
            check_storable_id(session_id)  # before the migration: no statement for such an id
            store = self._writable()
            asked = time.monotonic()
            lease = store.acquire(session_id, self.owner, self.lease_ttl)
            return _Lease(lease, store.count(session_id), asked + lease.ttl, header)
        if log.lost is not None:
            raise LeaseLostError(str(log.lost))
        return log

    def _append(self, log: _Lease, session_id: str, batch: Sequence[SessionEvent]) -> None:
        store = self._writable()
        try:
            self._group.append(store, Batch(log.lease, log.count, batch, log.header))
        except LeaseLostError as refused:
            # Expired with nobody taking it over (the database was down, or this process
            # paused), the lease is renewed at its epoch and the batch goes on; taken over,
            # this session is written here no more.
            if not self._renew(log):
                log.lost = refused
                raise
            self._group.append(store, Batch(log.lease, log.count, batch, log.header))

    async def _write_off_loop(
        self, writer: Writer[_Lease], batch: list[SessionEvent], outcome: Outcome
    ) -> None:
        """Write *batch* in a worker thread, in one job with the batches of every other session
        of this backend that are handed off while the job before runs (``Gathering``):
        one hand-off to a thread and back per group commit, not one per session."""
        await _GroupWrite(writer, batch, outcome).submit(self._gathering)

    def _write_group(self, group: list[_GroupWrite]) -> None:
        """Make the batches of *group* durable, in one transaction where they can be (in a
        worker thread; each write keeps its outcome).

        Each session is made ready first (its lease taken on its first write) and its batch
        checked against its durable cursor. If the shared transaction refuses a batch (a lease
        lost, a seq that does not follow), nothing of it was written, and each batch is written
        again on its own, as :meth:`_append` writes one, so that the refusal reaches only its
        session.
        """
        start = time.perf_counter()
        ready: list[_GroupWrite] = []
        for write in group:
            try:
                self._ready_for(write.writer, write.batch)
            except Exception as exc:
                write.error = exc
            else:
                ready.append(write)
        alone = len(ready) == 1
        if not alone and ready:
            try:
                self._writable().append_many(
                    [write.batch_of(self._lease_of(write)) for write in ready]
                )
            except (LeaseLostError, SeqMismatchError):
                alone = True  # nothing was written; the error names one session
            except Exception as exc:
                for write in ready:
                    write.error = exc
            else:
                self._group.committed()
                for write in ready:
                    write.written(self._lease_of(write))
        if alone:
            for write in ready:
                log = self._lease_of(write)
                try:
                    self._append(log, write.writer.session_id, write.batch)
                except Exception as exc:
                    write.error = exc
                else:
                    write.written(log)
        took = time.perf_counter() - start
        for write in group:
            write.writer.wrote_in(took)

    @staticmethod
    def _lease_of(write: _GroupWrite) -> _Lease:
        log = write.writer.log
        assert log is not None  # made ready
        return log

    def _may_write_inline(self, writer: Writer[_Lease]) -> bool:
        """Whether an awaited flush may commit on the event loop's thread, when no other task
        is ready to run: the session already holds its lease with more than a renewal period
        of it left, its recent commits were quick, and no group commit is in flight in a
        worker thread.

        Handing a one-round-trip commit to a thread and waking the loop when it returns costs
        more CPU than the commit's own client side; a loop with nothing else to run loses
        nothing by waiting for the server itself. The round trip keeps its deadline.
        """
        log = writer.log
        return (
            log is not None
            and log.lost is None
            and writer.write_seconds < INLINE_WRITE_LIMIT
            and time.monotonic() < log.valid_until - self.lease_ttl / RENEWALS_PER_TTL
            and not self._group.busy
            and not self._gathering.busy
        )

    def _renew(self, log: _Lease) -> bool:
        """Renew *log*'s lease (blocking); whether it was still this backend's to renew."""
        asked = time.monotonic()
        observer = self.observer
        try:
            log.lease = self._writable().renew(log.lease)
        except LeaseLostError as lost:
            log.lost = lost
            if observer is not None:
                observer.lease_lost(self, log.lease.session_id)
            return False
        log.valid_until = asked + log.lease.ttl
        if observer is not None:
            observer.leases_renewed(self, 1)
        return True

    def _location(self, log: _Lease) -> str:
        return self._location_of(log.lease.session_id)

    def _location_of(self, session_id: str) -> str:
        return f"{self.where}, session {session_id!r}"

    def _after_write(self, writer: Writer[_Lease]) -> None:
        """Keep renewing the lease of a session that wrote (on the loop's thread)."""
        log = writer.log
        if log is not None and log.lost is None and log not in self._held:
            self._held[log] = None
            if self._renewer is None and self._task_group is not None:
                self._renewer = (anyio.CancelScope(), anyio.Event())
                self._task_group.start_soon(self._keep_leases, *self._renewer)

    def _release(self, log: _Lease) -> None:
        """Stop renewing *log*'s lease, and give it up in the background (or when closing)."""
        self._held.pop(log, None)
        if log.lost is None:
            self._unreleased.append(log.lease)
            log.lost = LeaseLostError(f"the lease on session {log.lease.session_id!r} was given up")
            if self._task_group is not None:
                self._task_group.start_soon(self._release_leases)

    async def _flush(self, writer: Writer[_Lease]) -> None:
        """Flush as the core does; then, even with nothing to write, refuse a lost lease.

        A lease not renewed for a whole ttl (the renewals failed, or this process was
        paused) is renewed first, so that the checkpoint is never passed on a lease another
        host took over meanwhile.
        """
        await super()._flush(writer)
        log = writer.log
        if log is None:
            return
        if log.lost is None and time.monotonic() >= log.valid_until:
            async with writer.lane:
                if writer.log is log:
                    await run_in_worker(partial(self._renew, log))
        if log.lost is not None:
            raise LeaseLostError(str(log.lost))

    async def _keep_leases(self, scope: anyio.CancelScope, stopped: anyio.Event) -> None:
        """Renew every lease held, in one statement, every third of the ttl, until cancelled."""
        try:
            with scope:
                while True:
                    await anyio.sleep(self.lease_ttl / RENEWALS_PER_TTL)
                    held = list(self._held)
                    if held:
                        await self._renew_all(held)
        finally:
            stopped.set()

    async def _renew_all(self, held: list[_Lease]) -> None:
        asked = time.monotonic()

        def renew() -> list[tuple[_Lease, Lease | LeaseLostError]]:
            with self._lease_statements:
                # Under the lock that releases take: a lease given up since the renewal was
                # decided (its session closed) is not renewed, which would keep it held.
                still = [log for log in held if log.lost is None]
                if not still:
                    return []
                renewed = self._writable().renew_many([log.lease for log in still])
                return list(zip(still, renewed, strict=True))

        try:
            outcomes = await run_in_worker(renew)
        except PersistenceError as exc:
            logger.warning("could not renew %d session leases: %s", len(held), exc)
            return
        observer, renewed = self.observer, 0
        for log, lease in outcomes:
            if isinstance(lease, LeaseLostError):
                if log.lost is None:
                    log.lost = lease
                    logger.warning("%s", lease)
                    if observer is not None:
                        observer.lease_lost(self, log.lease.session_id)
                self._held.pop(log, None)
            elif log.lost is None and lease.epoch == log.lease.epoch:
                log.lease, log.valid_until = lease, asked + lease.ttl
                renewed += 1
        if observer is not None and renewed:
            observer.leases_renewed(self, renewed)

    async def _release_leases(self) -> None:
        """Give up the leases of the sessions that were released, in one statement."""

        def release() -> int:
            with self._lease_statements:
                leases, self._unreleased = self._unreleased, []
                return self._writable().release_many(leases) if leases else 0

        try:
            await run_in_worker(release)
        except PersistenceError as exc:  # they expire by themselves
            logger.warning("could not give up session leases: %s", exc)

    # -- reading --------------------------------------------------------------------------------

    async def list_sessions(self) -> list[SessionHeader]:
        """The headers of the sessions stored in the database, oldest first."""
        return list((await self.scan_sessions()).headers)

    async def scan_sessions(self) -> SessionListing:
        """The headers of the stored sessions; a database has no session it cannot list."""
        headers = await run_in_worker(lambda: self.store.list_sessions())
        await checkpoint_if_cancelled()  # a listing cancelled meanwhile returns nothing
        return SessionListing(tuple(headers), ())

    supports_raw_artifacts: Final = False
    """Whether :meth:`read_raw` gives a session's artifact: a database has no file of it."""

    def locate(self, session_id: str, cwd: str | None = None) -> SessionLocation:
        """Where *session_id* is, or would be, stored: the database and the session; no I/O.

        *cwd* is taken for the same call as the JSONL backend's, and changes nothing here.

        :raises InvalidSessionIdError: if the id cannot be stored.
        """
        check_storable_id(session_id)
        return SessionLocation("postgres", self._location_of(session_id))

    async def revision(self, session_id: str) -> str | None:
        """The revision of *session_id* (``None`` if it is not stored): the format version and
        the count of its events, found from their index without reading them. An append, and a
        repair (which appends closers), change it; nothing else changes a stored session."""
        count = await run_in_worker(partial(self.store.count_if_stored, session_id))
        await checkpoint_if_cancelled()
        return None if count is None else _revision(count)

    async def list_snapshots(self) -> list[SessionSnapshot]:
        """The header and revision of each stored session, oldest first, in one query."""
        counts = await run_in_worker(lambda: self.store.list_counts())
        await checkpoint_if_cancelled()
        return [SessionSnapshot(header, _revision(count)) for header, count in counts]

    async def read_from(self, session_id: str, from_seq: int) -> StoredSuffix:
        """The stored events of *session_id* from seq *from_seq* on, exactly as stored (no
        closers); only those rows are read. A *from_seq* at or past the end gives no events.

        :raises ValueError: if *from_seq* is not a non-negative integer.
        :raises SessionNotFoundError, CorruptRecordError: as :meth:`inspect`.
        """
        check_from_seq(from_seq)
        header, records, count = await run_in_worker(
            partial(self.store.read_suffix, session_id, from_seq)
        )
        location = self._location_of(session_id)
        events: Sequence[SessionEvent] = _decode_each(records, from_seq, location)
        try:
            upgraded = upgrade_suffix(events, session_id, from_seq)
        except LegacyRecordError as error:
            raise CorruptRecordError(location, error.seq, error.problem) from None
        if upgraded is None:  # an older record needs an earlier one: read the whole log
            header, whole = await run_in_worker(partial(self._read, self.store, session_id))
            count, events = len(whole), whole[from_seq:]
        else:
            events = upgraded
        await checkpoint_if_cancelled()
        return StoredSuffix(header, from_seq, tuple(events), _revision(count))

    async def read_raw(self, session_id: str) -> RawArtifact | None:
        """Refused: a database stores rows, not an artifact (:attr:`supports_raw_artifacts`).

        :raises PersistenceError: always.
        """
        await checkpoint_if_cancelled()
        raise PersistenceError(
            f"the PostgreSQL backend does not expose raw artifacts (session {session_id!r})"
        )

    async def inspect(self, session_id: str) -> StoredLog:
        """Read a log without changing anything; ``repair`` is what recovery would append.

        :raises SessionNotFoundError: if the database holds no log for *session_id*.
        :raises CorruptRecordError: if a stored event cannot be read.
        """
        log = await run_in_worker(partial(self._inspect, session_id))
        await checkpoint_if_cancelled()
        return log

    async def load(self, session_id: str) -> StoredLog:
        """Read a log with recovery, under the session's lease; the repair is durable.

        :raises LiveSessionError: if the session is live here and its turn is still open.
        :raises SessionLockedError: if another host holds the session's lease.
        :raises SessionNotFoundError, CorruptRecordError: as :meth:`inspect`; nothing is
            changed.
        """
        return await super().load(session_id)

    def _inspect(self, session_id: str) -> StoredLog:
        check_storable_id(session_id)
        header, events = self._read(self.store, session_id)
        repair = self._repair(session_id, events)
        return StoredLog(header, events, repair, 0, self._location_of(session_id))

    def _recover(self, session_id: str) -> StoredLog:
        check_storable_id(session_id)
        store = self._writable()
        lease = store.acquire(session_id, self.owner, self.lease_ttl)
        try:
            header, events = self._read(store, session_id)
            repair = self._repair(session_id, events)  # a database has no torn tail to cut
            if repair:
                store.append(lease, len(events), repair)
            return StoredLog(header, events + repair, repair, 0, self._location_of(session_id))
        finally:
            with contextlib.suppress(PersistenceError):  # it expires by itself
                store.release(lease)

    def _repair(self, session_id: str, events: Sequence[SessionEvent]) -> tuple[SessionEvent, ...]:
        return repair_of(events, partial(CorruptRecordError, self._location_of(session_id)))

    def _read(
        self, store: PostgresSessionStore, session_id: str
    ) -> tuple[SessionHeader, StoredEvents]:
        location = self._location_of(session_id)

        def decode(
            header: SessionHeader, records: Iterator[str]
        ) -> tuple[SessionHeader, StoredEvents]:
            return header, _decode_records(records, location)

        header, events = store.read_with(session_id, decode)
        try:
            return header, upgrade_events(events, session_id)
        except LegacyRecordError as error:
            raise CorruptRecordError(location, error.seq, error.problem) from None
