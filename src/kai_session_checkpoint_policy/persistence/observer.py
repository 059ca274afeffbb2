"""What a persistence backend tells an observer: batches written, recoveries, leases.

A backend's :attr:`~.core.WriteBehind.observer` is ``None`` unless something listens (the
OpenTelemetry plugin, :mod:`kai_session_checkpoint_policy.telemetry`, sets it): with no
observer, the write path only tests that attribute. An observer is called on the event loop's
thread for batches and recoveries, and from any thread for leases; it must return at once and
never raise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .values import StoredLog

__all__ = ["PersistenceObserver"]


class PersistenceObserver(Protocol):
    """Hears what a backend's write path does; every method returns at once."""

    def batch_written(
        self,
        backend: object,
        session_id: str,
        events: int,
        size: int | None,
        seconds: float,
        error: Exception | None,
    ) -> None:
        """One batch of *events* events was written (or failed with *error*, and stays queued).

        *size* is how many bytes the stored log grew by, where the backend knows it (``None``
        otherwise); *seconds* is how long the write took, waiting for a worker thread included.
        Called in the task that wrote the batch: the flush that led it, or the batch window's
        timer.
        """

    def recovered(
        self,
        backend: object,
        session_id: str,
        stored: StoredLog | None,
        started_ns: int,
        error: Exception | None,
    ) -> None:
        """A load with recovery that started at *started_ns* (``time.time_ns()``) has ended:
        with the log it returned, or with *error* (then *stored* is ``None``)."""

    def leases_renewed(self, backend: object, count: int) -> None:
        """*count* session leases were renewed (PostgreSQL)."""

    def lease_lost(self, backend: object, session_id: str) -> None:
        """The lease on *session_id* was found taken over: the session is written here no more."""
