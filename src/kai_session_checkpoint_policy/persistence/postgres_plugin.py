"""Moved to :mod:`.postgres.plugin` (the entry point ``session-persistence-postgres``); this
module re-exports its names until version 0.4, hook implementations included."""

from .postgres.plugin import (
    DSN_OPTION,
    LEASE_TTL_OPTION,
    host_configure,
    host_declare_options,
    name,
)

__all__ = ["DSN_OPTION", "LEASE_TTL_OPTION", "host_configure", "host_declare_options", "name"]
