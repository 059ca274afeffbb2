"""Persistence: the JSONL backend, its on-disk format, and crash repair.

This package never imports the policy: a backend makes the flushes it is asked for durable,
and does not choose when they happen.
"""

from __future__ import annotations

from typing import Protocol

from .errors import (
    CorruptLogError,
    InvalidSessionIdError,
    LiveSessionError,
    PersistenceError,
    RollbackError,
    SeqMismatchError,
    SessionLockedError,
    SessionNotFoundError,
    UnsupportedFormatError,
)
from .files import LockedError, OsFiles
from .format import FORMAT, FORMAT_VERSION, SessionHeader, decode_session_id, encode_session_id
from .jsonl import DEFAULT_BATCH_WINDOW, JsonlSessionPersistence, PersistenceStatistics, StoredLog
from .repair import NOT_STARTED_TEXT, OUTCOME_UNKNOWN_TEXT, interrupted_turn_closers

__all__ = [
    "DEFAULT_BATCH_WINDOW",
    "FORMAT",
    "FORMAT_VERSION",
    "NOT_STARTED_TEXT",
    "OUTCOME_UNKNOWN_TEXT",
    "CorruptLogError",
    "InvalidSessionIdError",
    "JsonlSessionPersistence",
    "LiveSessionError",
    "LockedError",
    "OsFiles",
    "PersistenceError",
    "PersistenceStatistics",
    "RollbackError",
    "SeqMismatchError",
    "SessionHeader",
    "SessionLockedError",
    "SessionNotFoundError",
    "SessionPersistence",
    "StoredLog",
    "UnsupportedFormatError",
    "decode_session_id",
    "encode_session_id",
    "interrupted_turn_closers",
]


class SessionPersistence(Protocol):
    """What a persistence backend offers as ``host.session_persistence``.

    The checkpoint policy only checks that one is present; flushing goes through the
    ``session_flush`` hook.
    """

    @property
    def name(self) -> str: ...

    async def load(self, session_id: str) -> StoredLog:
        """Read a session's log with crash recovery, making the repair durable."""
        ...

    async def inspect(self, session_id: str) -> StoredLog:
        """Read a session's log and the repair recovery would add, changing nothing."""
        ...
