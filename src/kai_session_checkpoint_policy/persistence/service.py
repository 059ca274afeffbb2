"""The persistence service a host offers its plugins as ``host.session_persistence``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..contract import SessionPersistenceLike

if TYPE_CHECKING:
    from .values import StoredLog

__all__ = ["SessionPersistence"]


@runtime_checkable
class SessionPersistence(SessionPersistenceLike, Protocol):
    """What this package's persistence backends offer as ``host.session_persistence``.

    The checkpoint policy only checks that one is present; flushing goes through the
    ``session_flush`` hook. Besides what the contract asks of every backend, these read a log
    without changing it (``inspect``) and tell how much of a live session is durable
    (``durable_count``).
    """

    def session_exists(self, session_id: str) -> bool:
        """Whether the backend has a stored log for *session_id*; answers at once."""
        ...

    async def load(self, session_id: str) -> StoredLog:
        """Read a session's log with crash recovery, making the repair durable."""
        ...

    async def inspect(self, session_id: str) -> StoredLog:
        """Read a session's log and the repair recovery would add, changing nothing."""
        ...

    def durable_count(self, session_id: str) -> int:
        """How many events of the live session *session_id* are known to be durable."""
        ...
