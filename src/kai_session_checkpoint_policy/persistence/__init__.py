"""Persistence: the JSONL backend, its on-disk format, and crash repair.

This package never imports the policy: a backend makes the flushes it is asked for durable,
and does not choose when they happen.
"""

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

__all__ = [
    "DEFAULT_BATCH_WINDOW",
    "FORMAT_VERSION",
    "NOT_STARTED_TEXT",
    "OUTCOME_UNKNOWN_TEXT",
    "Compression",
    "CorruptLogError",
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
    "RecordError",
    "RollbackError",
    "SeqMismatchError",
    "SessionHeader",
    "SessionListing",
    "SessionLockedError",
    "SessionNotFoundError",
    "SessionPersistence",
    "SessionProblem",
    "StoredLog",
    "UnsupportedFormatError",
    "WriteBehind",
    "decode_event",
    "decode_session_id",
    "encode_session_id",
    "interrupted_turn_closers",
]
