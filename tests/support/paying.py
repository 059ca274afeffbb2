"""A host with a model that asks for one payment, and a tool that records each payment made.

Tests break the store just before the model asks for the call (``before_the_call``), and see
whether the tool's checkpoint failed closed (no payment) or went through.
"""

from __future__ import annotations

import inspect
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kai_session_checkpoint_policy import (
    Agent,
    Finish,
    Host,
    LlmRequest,
    TextDelta,
    Tool,
    ToolExecution,
    tool_call_block,
)

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence

    from kai_session_checkpoint_policy import Session, StreamChunk, TurnOutcome

PROVIDER = "scripted"


@dataclass
class Paying:
    """The open host, and the call ids of the payments its tool made."""

    host: Host
    bodies: list[str] = field(default_factory=list)

    async def turn(self, session: Session, text: str = "pay") -> TurnOutcome:
        return await Agent(self.host, session, provider=PROVIDER, model="m").run_turn(text)


@asynccontextmanager
async def paying_host(
    plugins: Sequence[object], before_the_call: Callable[[], object]
) -> AsyncIterator[Paying]:
    """Open a host of *plugins* whose model calls *before_the_call* (awaited if it returns an
    awaitable) on its first request, then asks for the call ``pay-1``; then it answers."""

    async def model(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        if len(request.messages) == 1:
            done = before_the_call()
            if inspect.isawaitable(done):
                await done
            for chunk in tool_call_block(0, "pay-1", "pay"):
                yield chunk
            yield Finish("tool-calls")
        else:
            yield TextDelta("done")
            yield Finish("stop")

    async with Host(list(plugins)) as host:
        paying = Paying(host)

        async def pay(execution: ToolExecution) -> str:
            paying.bodies.append(execution.call_id)
            return "paid"

        host.llm.register_adapter(PROVIDER, model)
        host.tools.register(Tool("pay", pay))
        yield paying


def result_text(session: Session) -> str:
    """The text of the one tool result in *session*."""
    (result,) = [item for item in session.events if item.type == "tool/result"]
    data: Any = result.data
    return str(data["message"]["content"][0]["content"][0]["text"])
