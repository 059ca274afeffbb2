"""A Pydantic AI agent whose payment needs a person's approval: the child of the crash tests.

Run as a script (it imports nothing from the tests)::

    python tests/integrations/pydantic_ai_approval_child.py MODE ROOT SESSION WORKDIR

The session *SESSION* is opened through the integration in the JSONL store *ROOT*. The model
asks for the call ``pay-1`` of ``pay`` (``requires_approval=True``; each payment is a line in
``WORKDIR/ledger``). ``MODE`` is one of:

``asked``
    Run "Pay invoice 42": it stops with Pydantic AI's deferred requests. Then, as an
    application waiting for a person would, write ``asked`` into ``WORKDIR/marker`` and block
    until killed.
``decided``
    The same run; then the person says yes, and the run that carries the yes starts. Once a
    flush has made its ``approval/decided`` durable, the backend writes ``decided`` into the
    marker and blocks until killed, before the call starts.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults

from kai_session_checkpoint_policy import hookimpl
from kai_session_checkpoint_policy.integrations.pydantic_ai import open_session
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence

PROMPT = "Pay invoice 42"
PAY_ID = "pay-1"


def append_line(path: Path, data: bytes) -> None:
    """Append one line, straight to the OS and then to the disk."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def make_agent(workdir: Path) -> Agent[None, str | DeferredToolRequests]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [part for part in messages[-1].parts if isinstance(part, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(" / ".join(str(r.content) for r in returns))])
        return ModelResponse(parts=[ToolCallPart("pay", {"invoice": 42}, tool_call_id=PAY_ID)])

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(model), output_type=[str, DeferredToolRequests]
    )

    @agent.tool_plain(requires_approval=True, metadata={"effect": "side-effecting"})
    async def pay(invoice: int) -> str:
        append_line(workdir / "ledger", f"paid invoice {invoice}".encode())
        return f"invoice {invoice} paid"

    return agent


class PausingJsonl(JsonlSessionPersistence):
    """The JSONL backend; once a flush has made an ``approval/decided`` durable, it writes the
    marker and never returns."""

    def __init__(self, root: Path, marker: Path) -> None:
        super().__init__(root)
        self.marker = marker

    @hookimpl
    def session_flush(self, session: Any) -> Any:
        thunk = super().session_flush(session)
        if thunk is None:
            return None
        flush, marker = thunk, self.marker

        async def pausing() -> None:
            await flush()
            if session.events and session.events[-1].type == "approval/decided":
                marker.write_text("decided")
                await asyncio.Event().wait()  # until SIGKILL

        return pausing


async def main(mode: str, root: Path, session_id: str, workdir: Path) -> None:
    agent = make_agent(workdir)
    marker = workdir / "marker"
    store = JsonlSessionPersistence(root) if mode == "asked" else PausingJsonl(root, marker)
    async with open_session(store, session_id) as session:
        capabilities = [session.capability]
        result = await agent.run(
            PROMPT, message_history=session.message_history, capabilities=capabilities
        )
        assert isinstance(result.output, DeferredToolRequests)
        if mode == "asked":
            marker.write_text("asked")
            await asyncio.Event().wait()  # a person is deciding; SIGKILL comes first
        yes = DeferredToolResults(approvals={PAY_ID: True})
        await agent.run(
            message_history=session.message_history,
            deferred_tool_results=yes,
            capabilities=capabilities,
        )


if __name__ == "__main__":
    mode, root, session_id, workdir = sys.argv[1:5]
    asyncio.run(main(mode, Path(root), session_id, Path(workdir)))
