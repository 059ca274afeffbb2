"""Persistence: the JSONL and PostgreSQL backends, the JSONL format, and crash repair.

This package never imports the policy: a backend makes the flushes it is asked for durable,
and does not choose when they happen. The PostgreSQL backend's names are imported when first
used, so that only a host that uses it needs the PostgreSQL driver.
"""

import importlib as _importlib
import typing as _typing

from .core import DEFAULT_BATCH_WINDOW, PersistenceStatistics, StoredLog, WriteBehind
from .errors import (
    CorruptLogError,
    InvalidSessionIdError,
    LeaseLostError,
    LiveSessionError,
    NotARegularFileError,
    PersistenceError,
    RollbackError,
    SeqMismatchError,
    SessionLockedError,
    SessionNotFoundError,
    UnsupportedFormatError,
)
from .files import LockedError, OsFiles
from .format import (
    FORMAT_VERSION,
    Compression,
    RecordError,
    SessionHeader,
    decode_event,
    decode_session_id,
    encode_session_id,
)
from .jsonl import JsonlSessionPersistence, JsonlStatistics, SessionListing, SessionProblem
from .repair import NOT_STARTED_TEXT, OUTCOME_UNKNOWN_TEXT, interrupted_turn_closers
from .service import SessionPersistence
from .stores import Store, copy_session, display_url, is_postgres_url, open_store

if _typing.TYPE_CHECKING:
    from .postgres import (
        DEFAULT_LEASE_TTL,
        CorruptRecordError,
        PostgresSessionPersistence,
        PostgresStatistics,
    )

_POSTGRES: _typing.Final = frozenset(
    {"DEFAULT_LEASE_TTL", "CorruptRecordError", "PostgresSessionPersistence", "PostgresStatistics"}
)

__all__ = [
    "DEFAULT_BATCH_WINDOW",
    "DEFAULT_LEASE_TTL",
    "FORMAT_VERSION",
    "NOT_STARTED_TEXT",
    "OUTCOME_UNKNOWN_TEXT",
    "Compression",
    "CorruptLogError",
    "CorruptRecordError",
    "InvalidSessionIdError",
    "JsonlSessionPersistence",
    "JsonlStatistics",
    "LeaseLostError",
    "LiveSessionError",
    "LockedError",
    "NotARegularFileError",
    "OsFiles",
    "PersistenceError",
    "PersistenceStatistics",
    "PostgresSessionPersistence",
    "PostgresStatistics",
    "RecordError",
    "RollbackError",
    "SeqMismatchError",
    "SessionHeader",
    "SessionListing",
    "SessionLockedError",
    "SessionNotFoundError",
    "SessionPersistence",
    "SessionProblem",
    "Store",
    "StoredLog",
    "UnsupportedFormatError",
    "WriteBehind",
    "copy_session",
    "decode_event",
    "decode_session_id",
    "display_url",
    "encode_session_id",
    "interrupted_turn_closers",
    "is_postgres_url",
    "open_store",
]


def _load(name: str) -> object:
    """Import a PostgreSQL name from the backend's module when first used."""
    if name not in _POSTGRES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = getattr(_importlib.import_module(".postgres", __name__), name)
    globals()[name] = value
    return value


if not _typing.TYPE_CHECKING:  # type checkers see the imports above
    __getattr__ = _load


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
