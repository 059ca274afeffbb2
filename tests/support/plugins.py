"""Plugins that several test modules register on a host."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from kai_session_checkpoint_policy import hookimpl

if TYPE_CHECKING:
    import anyio

    from kai_session_checkpoint_policy import Session
    from kai_session_checkpoint_policy.hookspecs import FlushThunk


class FlushListener:
    """A ``session_flush`` plugin that records its steps in *order* and may wait or fail.

    A flush appends the session id to :attr:`sessions` and ``"<name>:start"`` to *order*,
    waits for *gate* if there is one, then raises *error* (after ``"<name>:failed"``) or
    appends ``"<name>:end"``.
    """

    def __init__(
        self,
        name: str,
        order: list[str],
        *,
        gate: anyio.Event | None = None,
        error: Exception | None = None,
    ) -> None:
        self.name = name
        self.order = order
        self.gate = gate
        self.error = error
        self.sessions: list[str] = []

    @hookimpl
    def session_flush(self, session: Session) -> FlushThunk:
        return partial(self._flush, session)

    async def _flush(self, session: Session) -> None:
        self.sessions.append(session.id)
        self.order.append(f"{self.name}:start")
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            self.order.append(f"{self.name}:failed")
            raise self.error
        self.order.append(f"{self.name}:end")
