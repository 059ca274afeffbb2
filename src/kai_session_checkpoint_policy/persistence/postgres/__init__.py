"""The PostgreSQL backend: sessions in a database that many hosts share, under leases.

:mod:`.schema` holds the tables and their migrations, :mod:`.store` the blocking store (leases,
batches, reads), :mod:`.group_commit` the sharing of transactions, :mod:`.backend` the backend
class, :mod:`.plugin` the entry point ``session-persistence-postgres``. Importing this package
imports none of them, nor the PostgreSQL driver; the names below (those of the module this
package replaces, ``persistence.postgres``) are imported when first used.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from ..errors import CorruptRecordError
    from .backend import (
        DEFAULT_LEASE_TTL,
        RENEWALS_PER_TTL,
        PostgresSessionPersistence,
        PostgresStatistics,
    )

_LAZY: _typing.Final = {
    "CorruptRecordError": "..errors",
    "DEFAULT_LEASE_TTL": ".backend",
    "PostgresSessionPersistence": ".backend",
    "PostgresStatistics": ".backend",
    "RENEWALS_PER_TTL": ".backend",
}
"""Where each name is defined: imported from there when first used."""

__all__ = [
    "DEFAULT_LEASE_TTL",
    "RENEWALS_PER_TTL",
    "CorruptRecordError",
    "PostgresSessionPersistence",
    "PostgresStatistics",
]


def _load(name: str) -> object:
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
