"""The persistence service a host offers its plugins as ``host.session_persistence``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..contract import SessionPersistenceLike

if TYPE_CHECKING:
    from .values import RawArtifact, SessionLocation, SessionSnapshot, StoredLog, StoredSuffix

__all__ = ["SessionPersistence"]


@runtime_checkable
class SessionPersistence(SessionPersistenceLike, Protocol):
    """What this package's persistence backends offer as ``host.session_persistence``.

    The checkpoint policy only checks that one is present; flushing goes through the
    ``session_flush`` hook. Besides what the contract asks of every backend, these read a log
    without changing it (``inspect``), tell how much of a live session is durable
    (``durable_count``), and offer the original harness's reads that need not load a whole
    log: where a session is (``locate``), its revision (``revision``, ``list_snapshots``), the
    stored events from a seq on (``read_from``) and its artifact as written (``read_raw``, where
    ``supports_raw_artifacts``).
    """

    @property
    def supports_raw_artifacts(self) -> bool: ...

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

    def locate(self, session_id: str, cwd: str | None = None) -> SessionLocation:
        """Where the session is, or would be, stored; no I/O."""
        ...

    async def revision(self, session_id: str) -> str | None:
        """The stored session's revision (an opaque token), or ``None`` if it is not stored."""
        ...

    async def list_snapshots(self) -> list[SessionSnapshot]:
        """Each stored session's header and revision, without reading whole logs."""
        ...

    async def read_from(self, session_id: str, from_seq: int) -> StoredSuffix:
        """The stored events from seq *from_seq* on, exactly as stored (no repair)."""
        ...

    async def read_raw(self, session_id: str) -> RawArtifact | None:
        """The stored artifact as written, decoded; ``None`` if the session is not stored."""
        ...
