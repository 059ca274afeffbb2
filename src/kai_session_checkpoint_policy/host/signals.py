"""Cooperative cancellation of one operation, in the manner of ``AbortController``.

anyio cancellation stops the *caller*; an abort signal tells the *callee* that its result is no
longer wanted. Tools check it before dispatch; the checkpoint policy checks it after its flush.
"""

from __future__ import annotations

__all__ = ["AbortController", "AbortError", "AbortSignal"]


class AbortError(Exception):
    """Raised by :meth:`AbortSignal.raise_if_aborted`."""


class AbortSignal:
    """Read-only view of an :class:`AbortController`."""

    __slots__ = ("_reason",)

    def __init__(self) -> None:
        self._reason: str | None = None

    @property
    def aborted(self) -> bool:
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        """Why the operation was aborted, or ``None`` while it was not."""
        return self._reason

    def raise_if_aborted(self) -> None:
        """:raises AbortError: with the reason, if the signal was aborted."""
        if self._reason is not None:
            raise AbortError(self._reason)


class AbortController:
    """Owns an :class:`AbortSignal` and is the only way to abort it."""

    __slots__ = ("signal",)

    def __init__(self) -> None:
        self.signal = AbortSignal()

    def abort(self, reason: str = "aborted") -> None:
        """Abort the signal; the first reason wins."""
        if self.signal._reason is None:
            self.signal._reason = reason
