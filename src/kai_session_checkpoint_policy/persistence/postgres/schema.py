"""The PostgreSQL backend's schema: its tables, their migrations, and the batch statement.

Tables, in a schema of the store's own (``kai_sessions`` unless configured)::

    schema_version(version integer primary key, applied_at timestamptz)
    sessions(session_id text primary key, created_at bigint, version integer, meta text)
    events(session_id text references sessions, seq bigint, type text, time bigint,
           record text, primary key (session_id, seq))
    leases(session_id text primary key, owner text, epoch bigint, expires_at timestamptz)

``events.record`` is the event's record exactly as :mod:`..records` encodes it (one
:meth:`SessionEvent.encode() <kai_session_checkpoint_policy.SessionEvent.encode>` line, never a
packed row), stored as text so that it reads back byte for byte; ``type`` and ``time`` repeat two
of its fields for queries. A session's header is its ``sessions`` row, created with its first
batch; ``meta`` holds the header's other fields (``cwd``, ``parentSession``, ``seedLength``,
``origin``, ``delegationDepth``, ``agentPreset``) as the JSON object a JSONL header has them in,
or ``NULL`` for a row written before the column was added. Statements name the schema as
``{schema}``, filled in by the store.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

__all__ = [
    "APPEND_AT_ONCE",
    "APPEND_EVENT",
    "APPEND_EVENTS",
    "DEFAULT_SCHEMA",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "check_schema_name",
    "migration_lock_key",
]

DEFAULT_SCHEMA: Final = "kai_sessions"

_IDENTIFIER: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    (  # 1: the tables
        "CREATE SCHEMA IF NOT EXISTS {schema}",
        """CREATE TABLE {schema}.schema_version (
            version integer PRIMARY KEY,
            applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
        )""",
        """CREATE TABLE {schema}.sessions (
            session_id text PRIMARY KEY,
            created_at bigint NOT NULL,
            version integer NOT NULL
        )""",
        """CREATE TABLE {schema}.events (
            session_id text NOT NULL REFERENCES {schema}.sessions,
            seq bigint NOT NULL CHECK (seq >= 0),
            type text NOT NULL,
            time bigint NOT NULL,
            record text NOT NULL,
            PRIMARY KEY (session_id, seq)
        )""",
        """CREATE TABLE {schema}.leases (
            session_id text PRIMARY KEY,
            owner text NOT NULL,
            epoch bigint NOT NULL,
            expires_at timestamptz NOT NULL
        )""",
    ),
    (  # 2: the header's metadata
        "ALTER TABLE {schema}.sessions ADD COLUMN meta text",
    ),
)
"""Each entry takes the schema from the version before it to the next; never edit one."""

SCHEMA_VERSION: Final = len(MIGRATIONS)
"""The schema version this release writes."""
APPEND_AT_ONCE: Final = """
    WITH batch AS (
        SELECT * FROM ROWS FROM (json_to_recordset(%(batches)s::json)
            AS (session_id text, owner text, epoch bigint, expected bigint, created_at bigint,
                meta text, size bigint)) WITH ORDINALITY
            AS batch(session_id, owner, epoch, expected, created_at, meta, size, number)
    ), held AS (
        SELECT batch.* FROM {schema}.leases AS lease JOIN batch USING (session_id)
        WHERE lease.owner = batch.owner AND lease.epoch = batch.epoch
          AND lease.expires_at > clock_timestamp()
        ORDER BY lease.session_id
        FOR UPDATE OF lease
    ), ready AS (
        SELECT * FROM held
        WHERE held.expected = 0 OR EXISTS (SELECT FROM {schema}.events
            WHERE session_id = held.session_id AND seq = held.expected - 1)
    ), new_sessions AS (
        INSERT INTO {schema}.sessions (session_id, created_at, version, meta)
        SELECT session_id, created_at, %(version)s, meta FROM ready WHERE expected = 0
    ), slot AS (
        SELECT session_id, seq, row_number() OVER (ORDER BY number, seq) AS position
        FROM batch CROSS JOIN LATERAL generate_series(expected, expected + size - 1) AS seq
    ), written AS (
        INSERT INTO {schema}.events (session_id, seq, type, time, record)
        SELECT slot.session_id, slot.seq, event.type, event.time, event.record
        FROM slot JOIN ROWS FROM (
            json_array_elements_text(%(types)s::json),
            unnest(string_to_array(%(times)s, ',')::bigint[]),
            unnest(string_to_array(%(records)s, E'\\n'))
        ) WITH ORDINALITY AS event(type, time, record, position) USING (position)
        WHERE slot.session_id IN (SELECT session_id FROM ready)
    )
    SELECT 1 / (SELECT CASE count(*) WHEN %(count)s THEN 1 ELSE 0 END FROM ready)
"""
"""Every batch in one statement, if every lease is held and every stored log ends right before
its batch; else a division by zero, which undoes the statement
(:meth:`~.store.PostgresSessionStore.append_many`).

A log ends right before a batch at seq *n* when it holds seq *n - 1* (or *n* is 0) and not seq
*n*: the first is one probe of the primary key, the second the primary key's own check as the
batch is inserted (a duplicate fails the statement). Seqs are written without gaps, so that is
exactly "the log holds *n* events", found without counting them. The probe reads the
statement's snapshot, taken before it waited for a lease row; a batch committed meanwhile makes
it refuse (the probe finds too little) or fail (the duplicate), never accept what it should not.

Its parameters are texts, which the client passes without converting them: the batches as a
JSON array of objects, the events' types as a JSON array, their times joined by commas, and
their records joined by newlines (a record is one line of JSON, which holds no newline)."""

_NEXT_EVENTS_OF_HELD_LEASE: Final = """
    WHERE lease.session_id = $1 AND lease.owner = $2 AND lease.epoch = $3
      AND lease.expires_at > clock_timestamp()
      AND EXISTS (SELECT FROM {schema}.events WHERE session_id = $1 AND seq = $4 - 1)
    FOR UPDATE OF lease
"""

APPEND_EVENT: Final = (
    """
    INSERT INTO {schema}.events (session_id, seq, type, time, record)
    SELECT lease.session_id, $4, $5, $6, $7
    FROM {schema}.leases AS lease"""
    + _NEXT_EVENTS_OF_HELD_LEASE
)
"""One event appended to a session that holds events already (the common flush: one batch of
one session), if the session's lease is held and its stored log ends right before the event;
else nothing is inserted (the statement's row count is 0) or, if the seq is taken, the
statement fails on the primary key.

Its parameters are numbered (the store prepares it itself, with their types): ``$1`` the
session id, ``$2`` the lease's owner, ``$3`` its epoch, ``$4`` the event's seq (how many events
the log must hold before it), ``$5`` its type, ``$6`` its time, ``$7`` its record.

The lease row is locked (``FOR UPDATE``), so a takeover waits for the statement to commit, and
a statement that waited for a takeover reads the row as the takeover left it (PostgreSQL
checks a row it waited for again): refused. Whether the log ends right before the event is
checked as :data:`APPEND_AT_ONCE` checks it: a probe of seq ``$4 - 1``, and the primary key's
check of seq ``$4``. One statement, committed with its reply, prepared once on each connection,
so that the server does not parse and plan it for every batch."""

APPEND_EVENTS: Final = (
    """
    INSERT INTO {schema}.events (session_id, seq, type, time, record)
    SELECT lease.session_id, $4 + event.position - 1, event.type, event.time, event.record
    FROM {schema}.leases AS lease, ROWS FROM (
        unnest(string_to_array($5, E'\\n')),
        unnest(string_to_array($6, ',')::bigint[]),
        unnest(string_to_array($7, E'\\n'))
    ) WITH ORDINALITY AS event(type, time, record, position)"""
    + _NEXT_EVENTS_OF_HELD_LEASE
)
"""Several events appended to a session that holds events already, checked as
:data:`APPEND_EVENT`: all of them are inserted, or none. Its parameters are
:data:`APPEND_EVENT`'s, except that ``$4`` is the first event's seq and ``$5``, ``$6`` and ``$7``
hold every event's: their types and their records joined by newlines (the caller passes a
batch with a type that holds one to :data:`APPEND_AT_ONCE`), their times by commas."""


def migration_lock_key(schema: str) -> int:
    """The advisory lock key that serializes migrations of *schema* (a signed 64-bit int)."""
    digest = hashlib.sha256(f"kai-session-store:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def check_schema_name(schema: object) -> str:
    """*schema*, if it is a plain lowercase SQL identifier.

    :raises ValueError: if it is not.
    """
    if not isinstance(schema, str) or not _IDENTIFIER.fullmatch(schema):
        raise ValueError(
            f"schema must be a plain lowercase SQL identifier (letters, digits and "
            f"underscores, at most 63, not starting with a digit), not {schema!r}"
        )
    return schema
