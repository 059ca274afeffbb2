"""Persistence: the JSONL and PostgreSQL backends, the session format, and crash repair.

Laid out by object: :mod:`.values` (what a backend hands out), :mod:`.ids`, :mod:`.records`
(one event record, the codec both backends use), :mod:`.core` (the write-behind queue every
backend shares, with the abstract methods a backend provides), :mod:`.repair`, and the two
backends side by side, :mod:`.jsonl` and :mod:`.postgres`, which never import each other.

This package never imports the policy: a backend makes the flushes it is asked for durable,
and does not choose when they happen. The names below are imported when first used, so that a
host importing one backend's entry point loads neither the other backend nor its driver.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from .core import DEFAULT_BATCH_WINDOW, WriteBehind
    from .errors import (
        CorruptLogError,
        CorruptRecordError,
        DatabaseError,
        DuplicateLogError,
        EncodingMismatchError,
        EventTimeError,
        InvalidSessionIdError,
        LeaseLostError,
        LiveSessionError,
        LogChangedError,
        MisplacedLogError,
        NotARegularFileError,
        PersistenceError,
        RecoveryRequiredError,
        RollbackError,
        SeedMismatchError,
        SeqMismatchError,
        SessionLockedError,
        SessionNotFoundError,
        UnsupportedFormatError,
    )
    from .ids import check_session_id, decode_session_id, encode_session_id
    from .jsonl.backend import JsonlSessionPersistence, JsonlStatistics
    from .jsonl.files import LockedError, OsFiles
    from .jsonl.format import Compression
    from .postgres.backend import (
        DEFAULT_LEASE_TTL,
        PostgresSessionPersistence,
        PostgresStatistics,
    )
    from .records import RecordError, decode_event
    from .repair import NOT_STARTED_TEXT, OUTCOME_UNKNOWN_TEXT, interrupted_turn_closers
    from .service import SessionPersistence
    from .stores import Store, copy_session, display_url, is_postgres_url, open_store
    from .values import (
        FORMAT_VERSION,
        PersistenceStatistics,
        RawArtifact,
        SessionHeader,
        SessionListing,
        SessionLocation,
        SessionProblem,
        SessionSnapshot,
        StoredLog,
        StoredSuffix,
    )

_LAZY: _typing.Final = {
    "DEFAULT_BATCH_WINDOW": ".core",
    "WriteBehind": ".core",
    "CorruptLogError": ".errors",
    "CorruptRecordError": ".errors",
    "DatabaseError": ".errors",
    "DuplicateLogError": ".errors",
    "EncodingMismatchError": ".errors",
    "EventTimeError": ".errors",
    "InvalidSessionIdError": ".errors",
    "LeaseLostError": ".errors",
    "LiveSessionError": ".errors",
    "LogChangedError": ".errors",
    "MisplacedLogError": ".errors",
    "NotARegularFileError": ".errors",
    "PersistenceError": ".errors",
    "RecoveryRequiredError": ".errors",
    "RollbackError": ".errors",
    "SeedMismatchError": ".errors",
    "SeqMismatchError": ".errors",
    "SessionLockedError": ".errors",
    "SessionNotFoundError": ".errors",
    "UnsupportedFormatError": ".errors",
    "check_session_id": ".ids",
    "decode_session_id": ".ids",
    "encode_session_id": ".ids",
    "JsonlSessionPersistence": ".jsonl.backend",
    "JsonlStatistics": ".jsonl.backend",
    "LockedError": ".jsonl.files",
    "OsFiles": ".jsonl.files",
    "Compression": ".jsonl.format",
    "DEFAULT_LEASE_TTL": ".postgres.backend",
    "PostgresSessionPersistence": ".postgres.backend",
    "PostgresStatistics": ".postgres.backend",
    "RecordError": ".records",
    "decode_event": ".records",
    "NOT_STARTED_TEXT": ".repair",
    "OUTCOME_UNKNOWN_TEXT": ".repair",
    "interrupted_turn_closers": ".repair",
    "SessionPersistence": ".service",
    "Store": ".stores",
    "copy_session": ".stores",
    "display_url": ".stores",
    "is_postgres_url": ".stores",
    "open_store": ".stores",
    "FORMAT_VERSION": ".values",
    "PersistenceStatistics": ".values",
    "SessionHeader": ".values",
    "SessionListing": ".values",
    "SessionProblem": ".values",
    "StoredLog": ".values",
    "RawArtifact": ".values",
    "SessionLocation": ".values",
    "SessionSnapshot": ".values",
    "StoredSuffix": ".values",
}
"""Where each name of this package is defined: imported from there when first used."""

__all__ = [
    "DEFAULT_BATCH_WINDOW",
    "DEFAULT_LEASE_TTL",
    "FORMAT_VERSION",
    "NOT_STARTED_TEXT",
    "OUTCOME_UNKNOWN_TEXT",
    "Compression",
    "CorruptLogError",
    "CorruptRecordError",
    "DatabaseError",
    "DuplicateLogError",
    "EncodingMismatchError",
    "EventTimeError",
    "InvalidSessionIdError",
    "JsonlSessionPersistence",
    "JsonlStatistics",
    "LeaseLostError",
    "LiveSessionError",
    "LockedError",
    "LogChangedError",
    "MisplacedLogError",
    "NotARegularFileError",
    "OsFiles",
    "PersistenceError",
    "PersistenceStatistics",
    "PostgresSessionPersistence",
    "PostgresStatistics",
    "RawArtifact",
    "RecordError",
    "RecoveryRequiredError",
    "RollbackError",
    "SeedMismatchError",
    "SeqMismatchError",
    "SessionHeader",
    "SessionListing",
    "SessionLocation",
    "SessionLockedError",
    "SessionNotFoundError",
    "SessionPersistence",
    "SessionProblem",
    "SessionSnapshot",
    "Store",
    "StoredLog",
    "StoredSuffix",
    "UnsupportedFormatError",
    "WriteBehind",
    "check_session_id",
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
    """Import *name* from where it is defined, and keep it here for the next time."""
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = getattr(_importlib.import_module(module_name, __name__), name)
    globals()[name] = value
    return value


if not _typing.TYPE_CHECKING:  # type checkers see the imports above
    __getattr__ = _load


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
