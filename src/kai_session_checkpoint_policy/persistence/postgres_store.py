"""Moved to :mod:`.postgres.store` (and the schema to :mod:`.postgres.schema`); this module
re-exports their names until version 0.4."""

from .postgres.schema import DEFAULT_SCHEMA, SCHEMA_VERSION, migration_lock_key
from .postgres.store import Batch, Lease, PostgresSessionStore, StoredRecords

__all__ = [
    "DEFAULT_SCHEMA",
    "SCHEMA_VERSION",
    "Batch",
    "Lease",
    "PostgresSessionStore",
    "StoredRecords",
    "migration_lock_key",
]
