"""The PostgreSQL session store: schema, leases and batches, as blocking calls.

Every method blocks: an async backend calls them from worker threads (each call takes its own
connection from the store's pool, so calls from several threads run at once). The store never
imports the policy, the host or the command line.

The tables and their migrations are :mod:`.schema`'s.

**Leases.** One writer per session across machines: a writer holds the session's lease (owner,
epoch, expiry), renews it, and every batch is checked against it in the batch's own transaction
(fencing). Expiry is by the *database server's* clock (``clock_timestamp()``), so it means the
same to every machine, and a lease expires by time even while its holder's connection stays
open. Taking over an expired lease increments the epoch; its holder may renew a lease that
expired as long as nobody took it over (no other writer has held that epoch). The lease row is
locked (``FOR UPDATE``) by each batch, so a takeover waits for a batch in flight to commit;
every statement that locks the row has a ``lock_timeout``, and the server ends a transaction
that stays idle (``idle_in_transaction_session_timeout``), so a writer paused inside a batch
can delay a takeover but never block it forever.

**Batches.** A batch is one transaction that checks the lease, checks that the stored log holds
exactly the events before the batch, and inserts the batch; the primary key makes a duplicate
seq impossible. If the acknowledgement of a commit is lost (the connection drops after the
``COMMIT`` was sent), the caller cannot tell whether the batch is durable, so it sends it again:
a batch whose events are already stored, record for record, is acknowledged without writing
anything again, and one that differs from what is stored is refused. The store makes that
retry itself, once, when a call fails because its connection broke (a connection left over from
before a server restart, or a backend that was terminated); otherwise the error is raised.

**Bounded failure.** Connecting has ``connect_timeout``, waiting for a pooled connection has the
pool's ``timeout``, every statement has ``statement_timeout`` on the server, and every round trip
has a deadline kept by the client (``statement_deadline`` plus ``lock_timeout``; see
:class:`_BoundedConnection`): a server that is down or unreachable makes a call fail within
about ``pool_timeout`` seconds, one that stops answering within the round trip's deadline (plus
at most a second for the cancel request), and once the server is back the same store works
again. The store's first connection is made outside the pool: a database that refuses it for
good (no such database or role, a bad option) fails the first call at once, in one line.

**Reading changes nothing.** A store opened with ``migrate=False`` creates no schema: on a
database without one, it holds no sessions; :meth:`PostgresSessionStore.migrate` creates it
when the first write needs it. Reads stream the records from a server-side cursor, a chunk at a
time, so a long log is never held twice in memory.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar, cast

import psycopg
from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.generators import execute
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from ..errors import (
    DatabaseError,
    InvalidSessionIdError,
    LeaseLostError,
    SeqMismatchError,
    SessionLockedError,
    SessionNotFoundError,
    UnsupportedFormatError,
)
from ..ids import check_session_id
from ..options import check_seconds
from ..values import FORMAT_VERSION, SessionHeader
from .schema import (
    APPEND_AT_ONCE,
    APPEND_EVENT,
    APPEND_EVENTS,
    DEFAULT_SCHEMA,
    MIGRATIONS,
    SCHEMA_VERSION,
    check_schema_name,
    migration_lock_key,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
    from datetime import datetime

    from psycopg.abc import PQGen
    from psycopg.pq.abc import PGresult

    from ...events import SessionEvent

    _Connection: TypeAlias = "_BoundedConnection"

__all__ = [
    "DEFAULT_SCHEMA",
    "DEFAULT_STATEMENT_DEADLINE",
    "MAX_SESSION_ID_BYTES",
    "SCHEMA_VERSION",
    "Batch",
    "Lease",
    "PostgresSessionStore",
    "StoredRecords",
    "check_storable_id",
    "migration_lock_key",
]

_T = TypeVar("_T")

_TEXT: Final = 25
_INT8: Final = 20
"""The type OIDs of ``text`` and ``bigint``, which are the same in every PostgreSQL."""
_APPEND_EVENT_TYPES: Final = (_TEXT, _TEXT, _INT8, _INT8, _TEXT, _INT8, _TEXT)
_APPEND_EVENTS_TYPES: Final = (_TEXT, _TEXT, _INT8, _INT8, _TEXT, _TEXT, _TEXT)

_dumps: Final = json.JSONEncoder(ensure_ascii=False, check_circular=False).encode
"""JSON text of a statement's parameter (the standard library's C encoder)."""

DEFAULT_STATEMENT_DEADLINE: Final = 3.0
"""Seconds the server has to answer a statement (beyond the time it may wait for a lock)."""

MAX_SESSION_ID_BYTES: Final = 2048
"""The longest session id a database stores, in UTF-8 bytes: an id is a key of the tables'
indexes, and an index entry must fit in a third of a page (about 2.7 kB) with the rest of its
key."""
_UNSTORABLE: Final = re.compile("[\x00\ud800-\udfff]")


_LOCKED_IN_ORDER: Final = """, locked AS MATERIALIZED (
        SELECT lease.session_id FROM {schema}.leases AS lease JOIN held USING (session_id)
        WHERE lease.owner = held.owner AND lease.epoch = held.epoch
        ORDER BY lease.session_id
        FOR UPDATE OF lease
    )"""
"""The rows of the leases in ``held`` that still name their owner and epoch, locked in the
order of their session ids, as a group commit locks them: statements that lock several lease
rows never wait for each other in a cycle."""


def check_storable_id(session_id: object) -> str:
    """*session_id*, if a database can store it: a non-empty string that is valid UTF-8 text
    (no lone surrogate), holds no NUL character, and is at most :data:`MAX_SESSION_ID_BYTES`
    long in UTF-8.

    Checked before any statement is sent, so that an id the database would refuse (or that
    the driver could not even encode) fails with an error naming why, and changes nothing.

    :raises InvalidSessionIdError: naming what the id holds, and where.
    """
    checked = check_session_id(session_id)
    found = _UNSTORABLE.search(checked)
    if found is not None:
        character = found[0]
        where = f"at index {found.start()}"
        problem = (
            f"it holds a NUL character {where}, which PostgreSQL text cannot hold"
            if character == "\x00"
            else f"it holds a lone surrogate (U+{ord(character):04X}) {where}, which UTF-8 "
            "cannot encode"
        )
    else:
        size = len(checked.encode("utf-8"))
        if size <= MAX_SESSION_ID_BYTES:
            return checked
        problem = f"it is {size} bytes long in UTF-8, more than {MAX_SESSION_ID_BYTES}"
    shown = repr(checked) if len(checked) <= 60 else f"starting {checked[:40]!r}"
    raise InvalidSessionIdError(f"session id {shown} cannot be stored in PostgreSQL: {problem}")


class _NotAtOnce(Exception):
    """A batch could not be written by the one statement: a lease or a count was not as
    expected."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A writer's lease on one session, as the database granted it."""

    session_id: str
    owner: str
    epoch: int
    """Incremented by every takeover: a batch is accepted only under the current epoch."""
    expires_at: datetime
    """When the lease expires, by the database server's clock (time zone aware)."""
    ttl: float
    """Seconds each grant or renewal lasts."""


@dataclass(frozen=True, slots=True)
class Batch:
    """Events to append to one session: seqs ``expected_count`` onwards, under *lease*."""

    lease: Lease
    expected_count: int
    """How many events the stored log must hold before these."""
    events: Sequence[SessionEvent]
    header: SessionHeader | None = None
    """The header of the session if this batch starts its log (``None``: one made of the
    first event's time)."""

    @property
    def created_at(self) -> int:
        return self.events[0].time if self.header is None else self.header.created_at

    @property
    def meta(self) -> str:
        """The header's metadata fields, as the ``meta`` column holds them."""
        fields = {"delegationDepth": 0} if self.header is None else self.header.fields()
        return json.dumps(fields, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class StoredRecords:
    """A stored session: its header, and each event's log line in seq order."""

    header: SessionHeader
    records: tuple[str, ...]


_PASSING_REFUSALS: Final = (
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "the database system is not accepting connections",
    "sorry, too many clients already",
    "remaining connection slots are reserved",
)
"""What a server says when it refuses a connection for now (the rest of its refusals last)."""


def _refused_for_good(exc: psycopg.Error) -> bool:
    """Whether a failed connection attempt would fail the same way however often it is tried.

    The server refused it for a reason of its own: no such database or role, a password or
    an option it does not accept (libpq reports a refusal as the server's ``FATAL`` message,
    and gives it no SQLSTATE). Anything else may pass: no server there yet, a timeout, a
    server starting up or out of connection slots; so may a refusal in a language other than
    English, which is not recognised as such.
    """
    if not isinstance(exc, psycopg.OperationalError):
        return True  # a connection string libpq does not accept
    message = str(exc)
    return "FATAL:" in message and not any(reason in message for reason in _PASSING_REFUSALS)


def _milliseconds(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


class _BoundedConnection(psycopg.Connection[TupleRow]):
    """A connection each of whose round trips must be answered within a deadline.

    Every statement, fetch, commit and rollback waits for the server through :meth:`wait`.
    A wait that passes its deadline sends the server a cancel request (for at most
    ``cancel_timeout`` seconds: a server that is stopped takes none), closes the connection,
    and raises :class:`psycopg.OperationalError` naming the deadline. This bounds what neither
    the server's ``statement_timeout`` nor the operating system bounds: a server process that
    is stopped (or a network that drops everything) while the connection stays open, where a
    Unix socket has no keepalives and a stopped server's kernel still answers TCP's.
    """

    round_trip_deadline: float | None = None
    """Seconds a round trip may take; ``None``: no deadline (set by the store's pool)."""
    cancel_timeout: float = 1.0
    missed: float | None = None
    """The deadline a round trip missed, which closed the connection; ``None`` while none did."""
    _kai_prepared: set[bytes] | None = None
    """The names of the statements :meth:`run_prepared` prepared on this connection."""

    def run_prepared(
        self, name: bytes, statement: bytes, types: Sequence[int], parameters: Sequence[bytes]
    ) -> int:
        """Run *statement*, prepared on this connection as *name* with parameters of the type
        OIDs *types*, with *parameters* as text in the client encoding (UTF-8), in one round
        trip; return how many rows it changed.

        The statement is prepared on its first use here. This goes below psycopg's cursors,
        whose query conversion and result wrapping cost as much client CPU as the round trip's
        own, for a statement that runs at every flush. psycopg discards a connection's
        prepared statements (``DEALLOCATE ALL``) after a rollback or a schema change run on it;
        a statement found missing then did nothing, and is prepared again and run once more.

        :raises psycopg.Error: the server's error as a cursor raises it (its class by SQLSTATE),
            or the connection's.
        """
        prepared = self._kai_prepared
        if prepared is None:
            prepared = self._kai_prepared = set()
        pgconn = self.pgconn
        for attempt in range(2):
            if name not in prepared:
                pgconn.send_prepare(name, statement, types)
                self._single_result(self.wait(execute(pgconn)))
                prepared.add(name)
            pgconn.send_query_prepared(name, parameters)
            try:
                result = self._single_result(self.wait(execute(pgconn)))
            except psycopg.errors.InvalidSqlStatementName:
                prepared.discard(name)
                if attempt:
                    raise
            else:
                return result.command_tuples or 0
        raise AssertionError("unreachable")  # pragma: no cover

    def _single_result(self, results: list[PGresult]) -> PGresult:
        """The one result of a statement; raises its error if it failed."""
        (result,) = results
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise psycopg.errors.error_from_result(result, encoding=self.info.encoding)
        return result

    def wait(self, gen: PQGen[_T], interval: float = 0.1, timeout: float | None = None) -> _T:
        limit = self.round_trip_deadline
        if limit is None or timeout is not None:
            return super().wait(gen, interval, timeout)
        started = time.monotonic()
        try:
            return super().wait(gen, interval, limit)
        except psycopg.OperationalError as exc:
            if time.monotonic() - started < limit:
                raise  # an answer, or a broken connection: not the deadline
            self.missed = limit
            try:
                self.cancel_safe(timeout=self.cancel_timeout)
            except psycopg.Error:
                pass  # the server may be stopped: closing the connection is what matters
            finally:
                self.close()
            raise psycopg.OperationalError(
                f"no reply from the server within the {limit:g} s deadline; the statement "
                "was cancelled and its connection closed"
            ) from exc


class PostgresSessionStore:
    """Sessions, their events and their leases in one PostgreSQL schema.

    Creating a store opens its connection pool and creates or migrates the schema; close it
    with :meth:`close` (or use it as a context manager). With ``open=False`` it only checks its
    options: the database is contacted on the first call, and the schema is created only by
    :meth:`migrate` (until then, a database without the schema holds no sessions).

    :param dsn: A libpq connection string or ``postgresql://`` URI.
    :param schema: The schema that holds the tables: a plain lowercase SQL identifier.
    :param max_connections: The most connections the pool opens at once.
    :param connect_timeout: Seconds a connection attempt may take (libpq rounds up to whole
        seconds, at least 2).
    :param pool_timeout: Seconds a call waits for a connection from the pool; with the server
        down, a call fails after this long.
    :param statement_timeout: Seconds any one statement may run on the server.
    :param lock_timeout: Seconds a statement may wait for a lock (a lease row that a batch in
        flight holds, a seq that another transaction is inserting).
    :param statement_deadline: Seconds the server has to answer each round trip (a statement,
        a fetch, a commit), beyond the ``lock_timeout`` it may spend waiting for a lock; a
        round trip still unanswered then is cancelled, its connection closed, and the call
        fails. This bounds a server that stops answering while its connections stay open.
    :param idle_in_transaction_timeout: Seconds the server lets one of the store's transactions
        sit idle before it ends the session, releasing its locks (a writer paused inside a batch).
    :param migration_timeout: Seconds a migration may wait for another process's migration, and
        each of its statements may run.
    :param application_name: Shown in ``pg_stat_activity`` for the store's connections.
    :param open: Whether to connect and migrate now.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        max_connections: int = 4,
        connect_timeout: float = 5.0,
        pool_timeout: float = 5.0,
        statement_timeout: float = 10.0,
        lock_timeout: float = 2.0,
        statement_deadline: float = DEFAULT_STATEMENT_DEADLINE,
        idle_in_transaction_timeout: float = 10.0,
        migration_timeout: float = 60.0,
        application_name: str = "kai-session-store",
        open: bool = True,
    ) -> None:
        check_schema_name(schema)
        size: object = max_connections
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"max_connections must be an integer, at least 1, not {size!r}")
        self.schema: Final = schema
        self._statements: dict[str, bytes] = {}  # composed once each (_statement)
        self.pool_timeout: Final = check_seconds("pool_timeout", pool_timeout)
        self.migration_timeout: Final = check_seconds("migration_timeout", migration_timeout)
        self.lock_timeout: Final = check_seconds("lock_timeout", lock_timeout)
        self.statement_deadline: Final = check_seconds("statement_deadline", statement_deadline)
        self.round_trip_deadline: Final = self.statement_deadline + self.lock_timeout
        """Seconds a round trip may take: ``statement_deadline`` plus ``lock_timeout``."""
        self.cancel_timeout: Final = min(1.0, self.statement_deadline)
        """Seconds a cancel request may take once a round trip missed its deadline."""
        server_settings = {
            "statement_timeout": check_seconds("statement_timeout", statement_timeout),
            "lock_timeout": self.lock_timeout,
            "idle_in_transaction_session_timeout": check_seconds(
                "idle_in_transaction_timeout", idle_in_transaction_timeout
            ),
        }
        connect_seconds = max(2, math.ceil(check_seconds("connect_timeout", connect_timeout)))
        parameters = conninfo_to_dict(dsn)
        self._where: Final = self.describe(parameters)
        # Set at connection start, after any options the connection string gives.
        options = [str(parameters.get("options") or "")] + [
            f"-c {name}={_milliseconds(seconds)}" for name, seconds in server_settings.items()
        ]
        self._dsn: Final = dsn
        self._connect_seconds: Final = connect_seconds
        self._connect_kwargs: Final[dict[str, Any]] = {
            # A statement on its own commits with its reply, in one round trip; the
            # operations of several statements open a transaction (_run).
            "autocommit": True,
            "client_encoding": "UTF8",  # what run_prepared encodes its parameters in
            "connect_timeout": connect_seconds,
            "application_name": application_name,
            "options": " ".join(options).strip(),
        }
        self._pool: Final = ConnectionPool(
            dsn,
            connection_class=_BoundedConnection,
            configure=self._configure,
            kwargs=self._connect_kwargs,
            min_size=1,
            max_size=max_connections,
            timeout=self.pool_timeout,
            # Give up on a failed connection attempt quickly: a new request starts a new
            # attempt at once, while an attempt kept alive through the pool's backoff (1, 2,
            # 4... seconds) would keep requests waiting long after the server is back.
            reconnect_timeout=self.pool_timeout / 2,
            name=f"kai-sessions-{schema}",
            open=False,
        )
        self._opening: Final = threading.Lock()
        self._closed = False
        self.schema_version = 0
        """The version of the schema in the database, as last seen (0: none seen yet)."""
        if open:
            try:
                self.migrate()
            except BaseException:
                self._pool.close()
                raise

    def __repr__(self) -> str:
        return f"<PostgresSessionStore {self._where}, schema {self.schema!r}>"

    def __enter__(self) -> PostgresSessionStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection of the pool; the store cannot be used afterwards."""
        with self._opening:
            self._closed = True
        self._pool.close()

    @property
    def where(self) -> str:
        """Where the database is, for messages: its name, host and port (never the password)."""
        return self._where

    @staticmethod
    def describe(parameters: Mapping[str, object]) -> str:
        """Where the database is, for messages (never the password)."""
        database = parameters.get("dbname") or parameters.get("user") or "(default database)"
        host = parameters.get("host") or "(default host)"
        port = parameters.get("port")
        return f"database {database!s} at {host!s}" + (f":{port!s}" if port else "")

    # -- running transactions -------------------------------------------------------------------

    def _run(
        self,
        what: str,
        operation: Callable[[_Connection], _T],
        *,
        single: bool = False,
        deadline: float | None = None,
    ) -> _T:
        """Run *operation* in one transaction on a pooled connection; commit if it returns.

        A *single* operation runs one statement that writes (or none): it commits with its
        reply, without a transaction around it.

        Each round trip must be answered within *deadline* seconds (the store's
        :attr:`round_trip_deadline` by default): one that is not fails the call, and its
        connection is closed (:class:`_BoundedConnection`).

        A call whose connection broke (a connection from before a server restart, or one whose
        backend was terminated) is run once more on a new connection; every operation is safe
        to repeat. A connection closed at its deadline is not broken: that call fails. A
        database error is raised as a :class:`PersistenceError` naming *what* failed, with the
        driver's exception as its cause.
        """
        retried = False
        with self._opening:
            if self._pool.closed and not self._closed:
                self._connect_first()
                self._pool.open(wait=False)
        while True:
            try:
                connection = self._pool.getconn()
            except psycopg.Error as exc:
                raise self._error(what, exc) from exc
            connection.round_trip_deadline = deadline or self.round_trip_deadline
            try:
                if single:
                    return operation(connection)
                with connection.transaction():  # commits on return, rolls back on an exception
                    return operation(connection)
            except psycopg.Error as exc:
                if connection.broken and not retried:
                    retried = True
                    # Replace the other broken connections it holds too (each check a round
                    # trip with its deadline).
                    self._pool.check()
                    continue
                raise self._error(what, exc) from exc
            finally:
                connection.round_trip_deadline = self.round_trip_deadline
                self._pool.putconn(connection)

    def _connect_first(self) -> None:
        """Connect once outside the pool, before opening it: fail at once if that cannot work.

        A refusal that would last (:func:`_refused_for_good`: no such database, role or
        option, a password refused) is raised at once, rather than retried by the pool until
        ``pool_timeout``; any other failure is tried again until ``pool_timeout`` has passed
        (plus one attempt's ``connect_timeout`` at most), then raised. The error names the
        database and the server's reason on one line, never the password. The pool's own
        attempts, each of which it logs, start only once the database is known to be there.
        """
        give_up = time.monotonic() + self.pool_timeout
        pause = 0.05
        while True:
            left = give_up - time.monotonic()
            attempt = {
                **self._connect_kwargs,
                "connect_timeout": min(self._connect_seconds, max(2, math.ceil(left))),
            }
            try:
                psycopg.Connection.connect(self._dsn, **attempt).close()
            except psycopg.Error as exc:
                if _refused_for_good(exc):
                    raise self._connect_error("connecting failed", exc) from exc
                if time.monotonic() + pause >= give_up:
                    tried = f"connecting failed (tried for {self.pool_timeout:g} s)"
                    raise self._connect_error(tried, exc) from exc
                time.sleep(pause)
                pause = min(2 * pause, 0.5)
            else:
                return

    def _connect_error(self, failure: str, exc: psycopg.Error) -> DatabaseError:
        reason = str(exc).removeprefix("connection failed: ")
        problem = " ".join(reason.split()) or type(exc).__name__
        return DatabaseError(f"PostgreSQL session store, {self._where}: {failure}: {problem}")

    def _configure(self, connection: _BoundedConnection) -> None:
        """Give a new connection of the pool its deadlines."""
        connection.round_trip_deadline = self.round_trip_deadline
        connection.cancel_timeout = self.cancel_timeout

    def _error(self, what: str, exc: psycopg.Error) -> DatabaseError:
        # The server's primary message alone: its context lines do not fit in one line.
        problem = (exc.diag.message_primary or str(exc)).strip() or type(exc).__name__
        return DatabaseError(f"PostgreSQL session store, {self._where}: {what} failed: {problem}")

    def _sql(self, statement: str) -> sql.Composed:
        return sql.SQL(statement).format(schema=sql.Identifier(self.schema))

    def _statement(self, template: str, connection: _Connection) -> bytes:
        """*template* with the schema filled in, composed once (the same bytes every time, so
        that it is prepared once on each connection: by the store's own :meth:`run_prepared`, or
        by the driver once it has run a few times)."""
        statement = self._statements.get(template)
        if statement is None:
            statement = self._statements[template] = self._sql(template).as_bytes(connection)
        return statement

    # -- schema ---------------------------------------------------------------------------------

    def _stored_version(self, connection: _Connection) -> int:
        # Read from the catalog, not with to_regclass(): a name lookup may answer from this
        # backend's cache, which does not yet know of a table that another process created
        # while this one waited for the migration lock.
        row = connection.execute(
            """SELECT EXISTS (
                   SELECT FROM pg_catalog.pg_class c
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                   WHERE n.nspname = %s AND c.relname = 'schema_version')""",
            (self.schema,),
        ).fetchone()
        if row is None or not row[0]:
            return 0
        row = connection.execute(
            self._sql("SELECT coalesce(max(version), 0) FROM {schema}.schema_version")
        ).fetchone()
        assert row is not None
        version: int = row[0]
        if version > SCHEMA_VERSION:
            raise UnsupportedFormatError(
                f"PostgreSQL session store, {self._where}: schema {self.schema!r} is at version "
                f"{version}, newer than version {SCHEMA_VERSION} which this release knows; "
                "upgrade kai-session-checkpoint-policy"
            )
        return version

    def migrate(self) -> int:
        """Create or migrate the schema, if it is not at :data:`SCHEMA_VERSION`; return that."""
        if self.schema_version < SCHEMA_VERSION:
            self.schema_version = self._migrate()
        return self.schema_version

    def _migrate(self) -> int:
        """Apply the migrations the schema lacks, each in a transaction of its own.

        A migration holds an advisory lock, so two processes opening a store at once never
        both apply one: the second waits, then finds it applied.
        """
        # Its statements may wait migration_timeout for another process's migration.
        deadline = self.migration_timeout + self.statement_deadline
        while (
            version := self._run("migrating the schema", self._migrate_once, deadline=deadline)
        ) < SCHEMA_VERSION:
            pass
        return version

    def _no_schema(self, connection: _Connection) -> bool:
        """Whether the database has no schema yet (looked up again while it had none)."""
        if self.schema_version == 0:
            self.schema_version = self._stored_version(connection)
        return self.schema_version == 0

    def _migrate_once(self, connection: _Connection) -> int:
        """Apply the next migration the schema lacks, if any; return the version it is at."""
        version = self._stored_version(connection)
        if version == SCHEMA_VERSION:
            return version
        timeout = f"{_milliseconds(self.migration_timeout)}ms"
        for setting in ("lock_timeout", "statement_timeout"):
            connection.execute("SELECT set_config(%s, %s, true)", (setting, timeout))
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (migration_lock_key(self.schema),))
        version = self._stored_version(connection)  # another process may have migrated meanwhile
        if version == SCHEMA_VERSION:
            return version
        for statement in MIGRATIONS[version]:
            connection.execute(self._sql(statement))
        connection.execute(
            self._sql("INSERT INTO {schema}.schema_version (version) VALUES (%s)"), (version + 1,)
        )
        return version + 1

    # -- leases ---------------------------------------------------------------------------------

    def acquire(self, session_id: str, owner: str, ttl: float) -> Lease:
        """Take the lease on *session_id* for *owner*, for *ttl* seconds.

        A lease nobody holds, or one that expired, is taken (a new epoch). While *owner* holds
        the lease already, it is returned as it stands (so a retried call whose
        acknowledgement was lost gets the lease it took): *owner* must name one writer, and
        never a later one, such as a host name, a process id and a random token.

        :raises SessionLockedError: if another owner holds an unexpired lease (naming it and
            when the lease expires), or if a batch in flight keeps the lease row locked past
            ``lock_timeout``.
        """
        check_storable_id(session_id)
        seconds = check_seconds("ttl", ttl)

        def acquire(connection: _Connection) -> Lease:
            try:
                row = connection.execute(
                    self._sql(
                        """INSERT INTO {schema}.leases AS lease
                               (session_id, owner, epoch, expires_at)
                           VALUES (%(session)s, %(owner)s, 1, clock_timestamp() + %(ttl)s)
                           ON CONFLICT (session_id) DO UPDATE
                           SET owner = excluded.owner, epoch = lease.epoch + 1,
                               expires_at = clock_timestamp() + %(ttl)s
                           WHERE lease.expires_at <= clock_timestamp()
                           RETURNING epoch, expires_at"""
                    ),
                    {"session": session_id, "owner": owner, "ttl": timedelta(seconds=seconds)},
                ).fetchone()
            except psycopg.errors.LockNotAvailable as exc:
                raise SessionLockedError(
                    f"session {session_id!r}: a batch in flight keeps its lease locked (waited "
                    f"{self.lock_timeout:g} s for it); try again"
                ) from exc
            if row is not None:
                return Lease(session_id, owner, row[0], row[1], seconds)
            holder = connection.execute(
                self._sql(
                    "SELECT owner, epoch, expires_at FROM {schema}.leases WHERE session_id = %s"
                ),
                (session_id,),
            ).fetchone()
            assert holder is not None  # the conflicting row, locked by the insert above
            if holder[0] == owner:
                return Lease(session_id, owner, holder[1], holder[2], seconds)
            raise SessionLockedError(
                f"session {session_id!r} is held by {holder[0]!r} (lease epoch {holder[1]}), "
                f"whose lease expires at {holder[2].isoformat()} by the database's clock "
                "unless renewed"
            )

        return self._run(f"acquiring the lease on session {session_id!r}", acquire)

    def renew(self, lease: Lease) -> Lease:
        """Extend *lease* by its ttl from now, even if it expired, unless it was taken over.

        :raises LeaseLostError: if another owner took the lease over (or it was never granted).
        """
        (renewed,) = self.renew_many([lease])
        if isinstance(renewed, LeaseLostError):
            raise renewed
        return renewed

    def renew_many(self, leases: Sequence[Lease]) -> list[Lease | LeaseLostError]:
        """Renew several leases in one statement; each one's renewal, or why it was lost.

        A lease is renewed while its row still names its owner and epoch: nobody took it over,
        so nobody else wrote under it, even if it expired meanwhile. The rows are locked in the
        order of their session ids, as a group commit locks them, so that the two never wait for
        each other in a cycle (a deadlock, which the server would break by failing one).
        """
        if not leases:
            return []

        def renew(connection: _Connection) -> list[Lease | LeaseLostError]:
            rows = connection.execute(
                self._sql(
                    """WITH held AS (
                           SELECT * FROM unnest(%s::text[], %s::text[], %s::bigint[],
                               %s::interval[]) AS held(session_id, owner, epoch, ttl)
                       ), locked AS MATERIALIZED (
                           SELECT lease.session_id FROM {schema}.leases AS lease
                           JOIN held USING (session_id)
                           WHERE lease.owner = held.owner AND lease.epoch = held.epoch
                           ORDER BY lease.session_id
                           FOR UPDATE OF lease
                       )
                       UPDATE {schema}.leases AS lease
                       SET expires_at = clock_timestamp() + held.ttl
                       FROM held JOIN locked USING (session_id)
                       WHERE lease.session_id = held.session_id
                       RETURNING lease.session_id, lease.expires_at"""
                ),
                (
                    [lease.session_id for lease in leases],
                    [lease.owner for lease in leases],
                    [lease.epoch for lease in leases],
                    [timedelta(seconds=lease.ttl) for lease in leases],
                ),
            ).fetchall()
            expiries: dict[str, datetime] = dict(rows)
            return [
                Lease(
                    lease.session_id,
                    lease.owner,
                    lease.epoch,
                    expiries[lease.session_id],
                    lease.ttl,
                )
                if lease.session_id in expiries
                else self._lease_lost(connection, lease, "cannot renew it")
                for lease in leases
            ]

        what = f"renewing the lease on session {leases[0].session_id!r}" + (
            f" and {len(leases) - 1} more" if len(leases) > 1 else ""
        )
        return self._run(what, renew, single=True)

    def release(self, lease: Lease) -> bool:
        """Give *lease* up (it expires now); return whether it was still held."""
        return self.release_many([lease]) == 1

    def release_many(self, leases: Sequence[Lease]) -> int:
        """Give several leases up in one statement; return how many were still held. The rows are
        locked in the order of their session ids, as :meth:`renew_many` locks them."""
        if not leases:
            return 0

        def release(connection: _Connection) -> int:
            cursor = connection.execute(
                self._sql(
                    """WITH held AS (
                           SELECT * FROM unnest(%s::text[], %s::text[], %s::bigint[])
                               AS held(session_id, owner, epoch)
                       )"""
                    + _LOCKED_IN_ORDER
                    + """
                       UPDATE {schema}.leases AS lease SET expires_at = clock_timestamp()
                       FROM locked
                       WHERE lease.session_id = locked.session_id
                         AND lease.expires_at > clock_timestamp()"""
                ),
                (
                    [lease.session_id for lease in leases],
                    [lease.owner for lease in leases],
                    [lease.epoch for lease in leases],
                ),
            )
            return cursor.rowcount

        what = f"releasing the lease on session {leases[0].session_id!r}" + (
            f" and {len(leases) - 1} more" if len(leases) > 1 else ""
        )
        return self._run(what, release, single=True)

    def _lease_lost(
        self, connection: _Connection, lease: Lease, consequence: str
    ) -> LeaseLostError:
        """Describe why *lease* is no longer held, from the lease row as it is now."""
        row = connection.execute(
            self._sql(
                """SELECT owner, epoch, expires_at, expires_at <= clock_timestamp()
                   FROM {schema}.leases WHERE session_id = %s"""
            ),
            (lease.session_id,),
        ).fetchone()
        return self._lease_lost_error(lease, row, consequence)

    @staticmethod
    def _lease_lost_error(
        lease: Lease, row: tuple[object, ...] | None, consequence: str
    ) -> LeaseLostError:
        held = f"the lease of {lease.owner!r} (epoch {lease.epoch}) on session {lease.session_id!r}"
        if row is None:
            reason = "was never granted"
        elif (row[0], row[1]) != (lease.owner, lease.epoch):
            reason = f"was taken over by {row[0]!r} (epoch {row[1]})"
        else:
            expires_at = row[2]
            assert hasattr(expires_at, "isoformat")
            reason = f"expired at {expires_at.isoformat()} by the database's clock"
        return LeaseLostError(f"{held} {reason}; {consequence}")

    # -- writing --------------------------------------------------------------------------------

    def append(self, lease: Lease, expected_count: int, events: Sequence[SessionEvent]) -> int:
        """Append *events* (seqs ``expected_count`` onwards) to the lease's session durably.

        Returns how many of the events this call wrote: fewer than all when a previous attempt
        whose acknowledgement was lost had already stored the first ones (exactly these
        records, at these seqs).

        :raises LeaseLostError: if *lease* expired or was taken over; nothing is written.
        :raises SeqMismatchError: if the stored log does not end right before the batch, or
            holds different events at its seqs; nothing is written.
        :raises PersistenceError: if the database fails or cannot be reached in time.
        """
        return self.append_many([Batch(lease, expected_count, events)])[0]

    def append_many(self, batches: Sequence[Batch]) -> list[int]:
        """Append several sessions' batches in one transaction (so one WAL flush).

        All or nothing: if any batch is refused, none is written, and the error names its
        session. Returns, for each batch, how many of its events this call wrote (as
        :meth:`append`).
        """
        if not batches:
            return []
        sessions = [batch.lease.session_id for batch in batches]
        if len(batches) == 1:
            what = f"appending to session {sessions[0]!r}"
            records = [self._checked_records(batches[0])]
            at_once = self._append_one if batches[0].expected_count else self._append_at_once
        else:
            if len(set(sessions)) != len(sessions):
                raise ValueError(f"one transaction can take one batch per session, not {sessions}")
            what = f"appending to session {sessions[0]!r} and {len(sessions) - 1} more"
            records = [self._checked_records(batch) for batch in batches]
            at_once = self._append_at_once
        try:
            self._run(what, partial(at_once, batches, records), single=True)
        except _NotAtOnce:
            pass  # something is not as expected: the transaction below finds out what
        else:
            return [len(batch.events) for batch in batches]

        def append(connection: _Connection) -> list[int]:
            rows = connection.execute(
                self._sql(
                    """SELECT session_id, owner, epoch, expires_at,
                              expires_at <= clock_timestamp()
                       FROM {schema}.leases WHERE session_id = ANY(%s)
                       ORDER BY session_id FOR UPDATE"""
                ),
                (sessions,),
            ).fetchall()
            leases = {row[0]: row[1:] for row in rows}
            for batch in batches:
                row = leases.get(batch.lease.session_id)
                if row is None or (row[0], row[1], row[3]) != (
                    batch.lease.owner,
                    batch.lease.epoch,
                    False,
                ):
                    raise self._lease_lost_error(batch.lease, row, "refusing to write")
            counts: dict[str, int] = dict(
                connection.execute(
                    self._sql(
                        """SELECT session_id, max(seq) + 1 FROM {schema}.events
                           WHERE session_id = ANY(%s) GROUP BY session_id"""
                    ),
                    (sessions,),
                ).fetchall()
            )
            written: list[int] = []
            new_sessions: list[tuple[str, int, str]] = []
            rows_to_insert: list[tuple[str, SessionEvent, str]] = []
            for batch, lines in zip(batches, records, strict=True):
                session_id = batch.lease.session_id
                stored = counts.get(session_id, 0)
                already = self._already_stored(connection, batch, lines, stored)
                if stored == 0:  # the batch starts the log: its header is created with it
                    new_sessions.append((session_id, batch.created_at, batch.meta))
                pending = list(zip(batch.events, lines, strict=True))[already:]
                rows_to_insert += [(session_id, event, line) for event, line in pending]
                written.append(len(pending))
            if new_sessions:
                connection.execute(
                    self._sql(
                        """INSERT INTO {schema}.sessions (session_id, created_at, meta, version)
                           SELECT *, %s FROM unnest(%s::text[], %s::bigint[], %s::text[])"""
                    ),
                    (
                        FORMAT_VERSION,
                        [row[0] for row in new_sessions],
                        [row[1] for row in new_sessions],
                        [row[2] for row in new_sessions],
                    ),
                )
            if rows_to_insert:
                connection.execute(
                    self._sql(
                        """INSERT INTO {schema}.events (session_id, seq, type, time, record)
                           SELECT * FROM unnest(
                               %s::text[], %s::bigint[], %s::text[], %s::bigint[], %s::text[])"""
                    ),
                    (
                        [row[0] for row in rows_to_insert],
                        [row[1].seq for row in rows_to_insert],
                        [row[1].type for row in rows_to_insert],
                        [row[1].time for row in rows_to_insert],
                        [row[2] for row in rows_to_insert],
                    ),
                )
            return written

        return self._run(what, append)

    def _append_one(
        self, batches: Sequence[Batch], records: list[list[str]], connection: _Connection
    ) -> None:
        """Write one batch of a session that holds events already, in one statement
        (:data:`~.schema.APPEND_EVENT` or :data:`~.schema.APPEND_EVENTS`), which commits with
        its reply: one round trip.

        The statement inserts the batch only if the lease is held under its epoch and the
        stored log ends right before the batch; otherwise it inserts nothing.

        :raises _NotAtOnce: if it inserted nothing, or a seq it meant to write is stored
            already (the caller's transaction then finds out why, and writes what it may).
        """
        (batch,), (lines,) = batches, records
        lease, events = batch.lease, batch.events
        if len(events) == 1:
            event = events[0]
            template, name, oids = APPEND_EVENT, b"kai_append_event", _APPEND_EVENT_TYPES
            values = (event.type.encode(), b"%d" % event.time, lines[0].encode())
        else:
            types = "\n".join([event.type for event in events])
            if types.count("\n") != len(events) - 1:  # a type that holds a newline
                self._append_at_once(batches, records, connection)
                return
            template, name, oids = APPEND_EVENTS, b"kai_append_events", _APPEND_EVENTS_TYPES
            times = ",".join([str(event.time) for event in events])
            values = (types.encode(), times.encode(), "\n".join(lines).encode())
        try:
            written = connection.run_prepared(
                name,
                self._statement(template, connection),
                oids,
                (
                    lease.session_id.encode(),
                    lease.owner.encode(),
                    b"%d" % lease.epoch,
                    b"%d" % batch.expected_count,
                    *values,
                ),
            )
        except psycopg.errors.UniqueViolation:
            raise _NotAtOnce from None  # a seq is taken: as in _append_at_once
        if written != len(events):
            raise _NotAtOnce

    def _append_at_once(
        self, batches: Sequence[Batch], records: list[list[str]], connection: _Connection
    ) -> None:
        """Write every batch in one statement, which commits with its reply: one round trip.

        The statement locks the leases, and writes only if every lease is held under its epoch
        and every stored log ends right before its batch. Otherwise its last expression
        divides by zero, and the whole statement is undone.

        :raises _NotAtOnce: if the statement found anything else, or a seq it meant to write
            already stored (the caller's transaction then finds out what, and writes what it
            may).
        """
        events = [event for batch in batches for event in batch.events]
        try:
            connection.execute(
                self._statement(APPEND_AT_ONCE, connection),
                {
                    "batches": _dumps(
                        [
                            {
                                "session_id": batch.lease.session_id,
                                "owner": batch.lease.owner,
                                "epoch": batch.lease.epoch,
                                "expected": batch.expected_count,
                                "created_at": batch.created_at,
                                "meta": batch.meta,
                                "size": len(batch.events),
                            }
                            for batch in batches
                        ]
                    ),
                    "version": FORMAT_VERSION,
                    "count": len(batches),
                    "types": _dumps([event.type for event in events]),
                    "times": ",".join([str(event.time) for event in events]),
                    "records": "\n".join([line for lines in records for line in lines]),
                },
            )
        except psycopg.errors.DivisionByZero:
            raise _NotAtOnce from None
        except psycopg.errors.UniqueViolation:
            # A seq of the batch is stored already: a batch whose acknowledgement was lost, or
            # one that this store had given up on (its connection was closed at the deadline)
            # but the server ran anyway once it answered again, stored while the statement
            # waited for the lease row. The transaction finds out what is stored now.
            raise _NotAtOnce from None

    @staticmethod
    def _checked_records(batch: Batch) -> list[str]:
        """The log lines of the batch's events, once their seqs are checked to follow on."""
        session_id = batch.lease.session_id
        if not batch.events:
            raise ValueError(f"session {session_id!r}: a batch needs at least one event")
        for index, event in enumerate(batch.events):
            if event.seq != batch.expected_count + index:
                raise SeqMismatchError(
                    f"session {session_id!r}: refusing to write seq {event.seq} at position "
                    f"{index} of a batch that starts after {batch.expected_count} events, so "
                    f"seq {batch.expected_count + index} was expected"
                )
        return [event.encode() for event in batch.events]

    def _already_stored(
        self, connection: _Connection, batch: Batch, lines: list[str], stored: int
    ) -> int:
        """How many of the batch's first events are stored already, exactly as given.

        A log that ends right before the batch holds none of it. One that holds events at the
        batch's seqs must hold exactly the batch's records there (a retry of a batch whose
        acknowledgement was lost, which may have grown since); anything else is refused.
        """
        session_id, expected = batch.lease.session_id, batch.expected_count
        if stored == expected:
            return 0
        if stored < expected:
            raise SeqMismatchError(
                f"session {session_id!r}: refusing to write seq {expected} at position 0 of a "
                f"batch; the database holds {stored} events, so seq {stored} was expected"
            )
        overlap = connection.execute(
            self._sql(
                """SELECT record FROM {schema}.events
                   WHERE session_id = %s AND seq >= %s AND seq < %s ORDER BY seq"""
            ),
            (session_id, expected, expected + len(lines)),
        ).fetchall()
        for index, (record,) in enumerate(overlap):
            if record != lines[index]:
                raise SeqMismatchError(
                    f"session {session_id!r}: refusing to write seq {expected + index}: the "
                    f"database holds {stored} events, and a different event at that seq"
                )
        return len(overlap)

    # -- reading --------------------------------------------------------------------------------

    def exists(self, session_id: str) -> bool:
        """Whether the store holds a session *session_id* (a lease alone makes none).

        :raises InvalidSessionIdError: if the id cannot be stored (:func:`check_storable_id`).
        """
        check_storable_id(session_id)

        def exists(connection: _Connection) -> bool:
            if self._no_schema(connection):
                return False
            row = connection.execute(
                self._sql("SELECT EXISTS (SELECT FROM {schema}.sessions WHERE session_id = %s)"),
                (session_id,),
            ).fetchone()
            return bool(row and row[0])

        return self._run(f"looking up session {session_id!r}", exists, single=True)

    def count(self, session_id: str) -> int:
        """How many events the store holds for *session_id* (0 for a session it does not hold)."""
        check_storable_id(session_id)

        def count(connection: _Connection) -> int:
            if self._no_schema(connection):
                return 0
            row = connection.execute(
                self._sql(
                    "SELECT coalesce(max(seq) + 1, 0) FROM {schema}.events WHERE session_id = %s"
                ),
                (session_id,),
            ).fetchone()
            assert row is not None
            stored: int = row[0]
            return stored

        return self._run(f"counting the events of session {session_id!r}", count, single=True)

    def read(self, session_id: str) -> StoredRecords:
        """The header and the events' log lines of *session_id*, in seq order.

        :raises SessionNotFoundError: if the store holds no such session.
        """
        return self.read_with(
            session_id, lambda header, records: StoredRecords(header, tuple(records))
        )

    def read_with(
        self,
        session_id: str,
        consume: Callable[[SessionHeader, Iterator[str]], _T],
        *,
        chunk: int = 10_000,
    ) -> _T:
        """Return what *consume* makes of the header and the log lines of *session_id*.

        *consume* gets the lines in seq order from a server-side cursor that fetches *chunk*
        at a time, all in one read-only snapshot. It may be called again from the start, if
        the connection broke before it returned.

        :raises SessionNotFoundError: if the store holds no such session.
        :raises InvalidSessionIdError: if the id cannot be stored (:func:`check_storable_id`).
        """
        check_storable_id(session_id)

        def read(connection: _Connection) -> _T:
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            row = None
            if not self._no_schema(connection):
                row = connection.execute(
                    self._sql(
                        """SELECT created_at, version, meta FROM {schema}.sessions
                           WHERE session_id = %s"""
                    ),
                    (session_id,),
                ).fetchone()
            if row is None:
                raise SessionNotFoundError(
                    f"no session {session_id!r} in the PostgreSQL session store, {self._where}"
                )
            with connection.cursor(name="kai_session_records") as cursor:
                cursor.itersize = chunk
                cursor.execute(
                    self._sql(
                        "SELECT record FROM {schema}.events WHERE session_id = %s ORDER BY seq"
                    ),
                    (session_id,),
                )
                header = _header(session_id, *row)
                return consume(header, _first_column(cursor))

        return self._run(f"reading session {session_id!r}", read)

    def read_suffix(self, session_id: str, from_seq: int) -> tuple[SessionHeader, list[str], int]:
        """The header of *session_id*, the log lines of its events from seq *from_seq* on, and
        how many events it holds, all in one read-only snapshot.

        :raises SessionNotFoundError: if the store holds no such session.
        """
        check_storable_id(session_id)

        def read(connection: _Connection) -> tuple[SessionHeader, list[str], int]:
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            row = None
            if not self._no_schema(connection):
                row = connection.execute(
                    self._sql(
                        """SELECT created_at, version, (SELECT coalesce(max(seq) + 1, 0)
                           FROM {schema}.events WHERE session_id = %(id)s)
                           FROM {schema}.sessions WHERE session_id = %(id)s"""
                    ),
                    {"id": session_id},
                ).fetchone()
            if row is None:
                raise SessionNotFoundError(
                    f"no session {session_id!r} in the PostgreSQL session store, {self._where}"
                )
            records = connection.execute(
                self._sql(
                    "SELECT record FROM {schema}.events WHERE session_id = %s AND seq >= %s "
                    "ORDER BY seq"
                ),
                (session_id, from_seq),
            ).fetchall()
            return SessionHeader(session_id, row[0], row[1]), list(_first_column(records)), row[2]

        return self._run(f"reading session {session_id!r} from seq {from_seq}", read)

    def count_if_stored(self, session_id: str) -> int | None:
        """How many events *session_id* holds, or ``None`` if the store has no such session."""
        check_storable_id(session_id)

        def count(connection: _Connection) -> int | None:
            if self._no_schema(connection):
                return None
            row = connection.execute(
                self._sql(
                    """SELECT (SELECT coalesce(max(seq) + 1, 0) FROM {schema}.events
                               WHERE session_id = %(id)s)
                       FROM {schema}.sessions WHERE session_id = %(id)s"""
                ),
                {"id": session_id},
            ).fetchone()
            return None if row is None else int(row[0])

        return self._run(f"counting the events of session {session_id!r}", count, single=True)

    def list_counts(self) -> list[tuple[SessionHeader, int]]:
        """The header of every stored session, oldest first, and how many events it holds
        (found from the events' index, without reading them)."""

        def list_counts(connection: _Connection) -> list[tuple[SessionHeader, int]]:
            if self._no_schema(connection):
                return []
            rows = connection.execute(
                self._sql(
                    """SELECT s.session_id, s.created_at, s.version,
                              (SELECT coalesce(max(e.seq) + 1, 0) FROM {schema}.events AS e
                               WHERE e.session_id = s.session_id)
                       FROM {schema}.sessions AS s ORDER BY s.created_at, s.session_id"""
                )
            ).fetchall()
            return [(SessionHeader(row[0], row[1], row[2]), int(row[3])) for row in rows]

        return self._run("listing sessions", list_counts, single=True)

    def list_sessions(self) -> list[SessionHeader]:
        """The headers of every stored session, oldest first."""

        def list_sessions(connection: _Connection) -> list[SessionHeader]:
            if self._no_schema(connection):
                return []
            rows = connection.execute(
                self._sql(
                    """SELECT session_id, created_at, version, meta FROM {schema}.sessions
                       ORDER BY created_at, session_id"""
                )
            ).fetchall()
            return [_header(*row) for row in rows]

        return self._run("listing sessions", list_sessions, single=True)


def _header(session_id: str, created_at: int, version: int, meta: str | None) -> SessionHeader:
    """The header a ``sessions`` row holds (a row without ``meta`` has none of its fields)."""
    fields: dict[str, object] = {} if meta is None else json.loads(meta)
    depth = fields.get("delegationDepth", 0)
    return SessionHeader(
        session_id,
        created_at,
        version,
        cwd=cast("str | None", fields.get("cwd")),
        delegation_depth=depth if type(depth) is int else 0,
        parent_session=cast("str | None", fields.get("parentSession")),
        seed_length=cast("int | None", fields.get("seedLength")),
        origin=cast("str | None", fields.get("origin")),
        agent_preset=cast("str | None", fields.get("agentPreset")),
    )


def _first_column(rows: Iterable[tuple[object, ...]]) -> Iterator[str]:
    for (record,) in rows:
        assert isinstance(record, str)
        yield record
