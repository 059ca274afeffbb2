"""Entry point ``session-persistence-postgres``: a PostgreSQL backend configured from host options.

A host opened with the option ``"postgres.dsn"`` (a libpq connection string or
``postgresql://`` URI) gets a
:class:`~kai_session_checkpoint_policy.persistence.PostgresSessionPersistence` on that
database; ``"postgres.lease_ttl"`` (seconds) sets how long its leases last. Without the dsn
option this plugin does nothing, and imports nothing more (nor the PostgreSQL driver).

It needs only what :class:`~kai_session_checkpoint_policy.contract.PluginHost` declares.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ...hookspecs import hookimpl
from ..options import seconds_option

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ...contract import PluginHost

__all__ = ["DSN_OPTION", "LEASE_TTL_OPTION", "name"]

name: Final = "session-persistence-postgres"
DSN_OPTION: Final = "postgres.dsn"
LEASE_TTL_OPTION: Final = "postgres.lease_ttl"


@hookimpl
def host_declare_options() -> Mapping[str, str]:
    return {
        DSN_OPTION: "the PostgreSQL database of the sessions (loads the PostgreSQL backend)",
        LEASE_TTL_OPTION: "seconds a session's lease lasts unless renewed (default 10)",
    }


@hookimpl
def host_configure(host: PluginHost[Any]) -> None:
    options = host.options
    dsn = options.get(DSN_OPTION)
    if dsn is None:
        return
    if not isinstance(dsn, str):
        raise TypeError(f"host option {DSN_OPTION!r} must be a connection string, not {dsn!r}")
    from .backend import DEFAULT_LEASE_TTL, PostgresSessionPersistence

    backend = PostgresSessionPersistence(
        dsn, lease_ttl=seconds_option(options, LEASE_TTL_OPTION, DEFAULT_LEASE_TTL)
    )
    host.register(backend, name=f"{name}:{backend.where}")
