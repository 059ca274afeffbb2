"""Cooperative cancellation of one operation, in the manner of ``AbortController``.

anyio cancellation stops the *caller*; an abort signal tells the *callee* that its result is no
longer wanted. Tools check it before dispatch; the checkpoint policy checks it after its flush.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..cancellation import cancel_pending

if TYPE_CHECKING:
    import asyncio

__all__ = ["AbortController", "AbortError", "AbortSignal"]


class AbortError(Exception):
    """Raised by :meth:`AbortSignal.raise_if_aborted`."""


class AbortSignal:
    """Read-only view of an :class:`AbortController`."""

    __slots__ = ("_parent", "_reason", "_task")

    def __init__(self) -> None:
        self._reason: str | None = None
        self._parent: AbortSignal | None = None
        self._task: asyncio.Task[object] | None = None

    @property
    def aborted(self) -> bool:
        return self.reason is not None

    @property
    def reason(self) -> str | None:
        """Why the operation was aborted, or ``None`` while it was not."""
        if self._reason is not None:
            return self._reason
        if self._parent is not None and (reason := self._parent.reason) is not None:
            return reason
        if self._task is not None and cancel_pending(self._task):
            return "cancelled"
        return None

    def raise_if_aborted(self) -> None:
        """:raises AbortError: with the reason, if the signal was aborted."""
        if (reason := self.reason) is not None:
            raise AbortError(reason)

    def _following(self, task: asyncio.Task[object] | None) -> AbortSignal:
        """A signal aborted with this one, or as soon as ``task.cancel()`` is called.

        Work that other tasks do for *task* (concurrent tool calls for a turn) learns of a
        native cancellation of it at once, before asyncio resumes *task* to deliver it.
        """
        if task is None:
            return self
        signal = AbortSignal()
        signal._parent, signal._task = self, task
        return signal


class AbortController:
    """Owns an :class:`AbortSignal` and is the only way to abort it."""

    __slots__ = ("signal",)

    def __init__(self) -> None:
        self.signal = AbortSignal()

    def abort(self, reason: str = "aborted") -> None:
        """Abort the signal; the first reason wins."""
        if self.signal._reason is None:
            self.signal._reason = reason
