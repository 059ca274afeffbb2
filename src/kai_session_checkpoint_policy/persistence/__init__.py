"""Persistence: the service a backend offers, the JSONL backend, and crash repair."""

from __future__ import annotations

from typing import Protocol

__all__ = ["SessionPersistence"]


class SessionPersistence(Protocol):
    """What a persistence backend offers the host as ``host.session_persistence``."""

    @property
    def name(self) -> str: ...
