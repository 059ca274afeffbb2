"""An Agents SDK agent whose payment needs a person's approval: the child of the crash tests.

Run as a script (it imports nothing from the tests)::

    python tests/integrations/openai_agents_approval_child.py MODE ROOT SESSION WORKDIR

The session *SESSION* of the JSONL store *ROOT* is a :class:`CheckpointSession`, with a batch
window of an hour (only the checkpoints and the integration's own flushes write). The scripted
model asks for the call ``call-pay-1`` of ``pay`` (``needs_approval=True``; each payment is a
line in ``WORKDIR/ledger``). The run stops with the approval item; its ``RunState`` is saved
into ``WORKDIR/state.json``, as an application keeps it. ``MODE`` is one of:

``asked``
    Then, as an application waiting for a person would, write ``asked`` into
    ``WORKDIR/marker`` and block until killed.
``decided``
    The person says yes and the run goes on from the state. Once the yes is durable, before
    the call starts, a ``tools_execute`` wrapper writes ``decided`` into the marker and blocks
    until killed.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

from kai_session_checkpoint_policy import hookimpl
from kai_session_checkpoint_policy.integrations.openai_agents import CheckpointSession

PROMPT = "Pay invoice 1042."
CALL = "call-pay-1"


def append_line(path: Path, data: bytes) -> None:
    """Append one line, straight to the OS and then to the disk."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def paying_agent(workdir: Path) -> Agent[Any]:
    """The model asks for one payment, then says what came of it."""

    @function_tool(needs_approval=True)
    async def pay(invoice: str) -> str:
        """Pay an invoice."""
        append_line(workdir / "ledger", f"paid invoice {invoice}".encode())
        return f"invoice {invoice} paid"

    steps = [
        ModelStep([function_call("pay", {"invoice": "1042"}, call_id=CALL)]),
        ModelStep([assistant_message("done")]),
    ]
    return Agent(name="payer", model=ScriptedModel(steps), tools=[pay])


class PauseBeforeTheCall:
    """Writes the marker and blocks where a call is about to start: its yes is durable."""

    name = "pause-before-the-call"

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    @hookimpl(wrapper=True, tryfirst=True)
    def tools_execute(self, execution: Any) -> Generator[None, Any, Any]:
        yield
        marker = self.marker

        async def pausing() -> Any:
            marker.write_text("decided")
            await asyncio.Event().wait()  # until SIGKILL

        return pausing


async def main(mode: str, root: Path, session_id: str, workdir: Path) -> None:
    set_tracing_disabled(True)
    agent = paying_agent(workdir)
    marker = workdir / "marker"
    plugins = [PauseBeforeTheCall(marker)] if mode == "decided" else []
    session = CheckpointSession(
        root, session_id, batch_window=3600, plugins=plugins, effects={"pay": "side-effecting"}
    )
    async with session:
        result = await Runner.run(agent, PROMPT, session=session, hooks=session.hooks)
        state = result.to_state()
        (workdir / "state.json").write_text(state.to_string())
        if mode == "asked":
            marker.write_text("asked")
            await asyncio.Event().wait()  # a person is deciding; SIGKILL comes first
        for item in result.interruptions:
            state.approve(item)
        await Runner.run(agent, state, session=session, hooks=session.hooks)


if __name__ == "__main__":
    mode, root, session_id, workdir = sys.argv[1:5]
    asyncio.run(main(mode, Path(root), session_id, Path(workdir)))
