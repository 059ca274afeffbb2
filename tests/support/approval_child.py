"""The child of the approval crash tests: a turn that waits for a person's yes before paying.

Run as a script (it imports nothing from the tests)::

    python tests/support/approval_child.py ROOT SESSION MODE MARKER EFFECTS

One turn of session SESSION in the reference host (checkpoint policy, JSONL backend at ROOT):
the model asks for the call ``call-1`` of ``pay`` (which needs approval) with
:data:`ARGUMENTS`. MODE says where the child stops:

``wait``
    The approver writes ``asked`` into MARKER and waits for an answer that never comes; the
    child is killed there (SIGKILL), or stopped (SIGINT: the turn is cancelled, the session
    flushed, and the child exits with status 0, as a command line does on Ctrl-C).
``decided``
    The approver says yes; once the ``approval/decided`` is durable, the backend writes
    ``decided`` into MARKER and blocks until the child is killed, before the call starts.

The body of ``pay`` appends one line to EFFECTS per payment.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio
import anyio.abc

from kai_session_checkpoint_policy import (
    Agent,
    Finish,
    Host,
    TextDelta,
    Tool,
    hookimpl,
    invariant,
    policy,
    tool_call_block,
)
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from kai_session_checkpoint_policy import (
        JSON,
        LlmRequest,
        SessionLogLike,
        StreamChunk,
        ToolExecution,
    )
    from kai_session_checkpoint_policy.hookspecs import FlushThunk
    from kai_session_checkpoint_policy.host.approvals import ApprovalQuestion

PROVIDER: Final = "scripted"
TOOL: Final = "pay"
ARGUMENTS: Final = '{"invoice": "77", "amount": "10.00"}'


def make_pay_tool(effects: Path) -> Tool:
    """``pay``: side-effecting, needs approval; each payment is one line in *effects*."""

    async def pay(execution: ToolExecution) -> JSON:
        async with await anyio.open_file(effects, "a") as file:
            await file.write(f"{execution.call_id}\n")
        return "paid"

    return Tool(TOOL, pay, effect="side-effecting", needs_approval=True)


class PausingJsonl(JsonlSessionPersistence):
    """The JSONL backend; once a flush has made an ``approval/decided`` durable, it writes the
    marker and never returns."""

    def __init__(self, root: Path, marker: Path) -> None:
        super().__init__(root)
        self.marker = marker

    @hookimpl
    def session_flush(self, session: SessionLogLike) -> FlushThunk | None:
        thunk = super().session_flush(session)
        if thunk is None:
            return None
        flush, marker = thunk, self.marker

        async def pausing() -> None:
            await flush()
            if session.events and session.events[-1].type == "approval/decided":
                await anyio.Path(marker).write_text("decided")
                await anyio.sleep_forever()

        return pausing


async def _first_call(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
    if len(request.messages) == 1:
        for chunk in tool_call_block(0, "call-1", TOOL, ARGUMENTS):
            yield chunk
        yield Finish("tool-calls")
    else:
        yield TextDelta("done")
        yield Finish("stop")


async def main(arguments: argparse.Namespace) -> None:
    marker = Path(arguments.marker)
    root = Path(arguments.root)
    backend = JsonlSessionPersistence(root) if arguments.mode == "wait" else None
    backend = backend or PausingJsonl(root, marker)

    async def approver(question: ApprovalQuestion) -> bool:
        if arguments.mode == "decided":
            return True
        await anyio.Path(marker).write_text("asked")
        await anyio.sleep_forever()
        return False  # never reached

    async def stop_on_sigint(
        scope: anyio.CancelScope, *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        with anyio.open_signal_receiver(signal.SIGINT) as signals:
            task_status.started()
            async for _ in signals:
                scope.cancel()
                return

    async with Host([backend, policy, invariant], autoload=False) as host:
        host.llm.register_adapter(PROVIDER, _first_call)
        host.tools.register(make_pay_tool(Path(arguments.effects)))
        session = host.sessions.create(arguments.session)
        agent = Agent(host, session, provider=PROVIDER, model="m", approver=approver)
        async with anyio.create_task_group() as group:
            await group.start(stop_on_sigint, group.cancel_scope)
            await agent.run_turn("pay invoice 77")
            group.cancel_scope.cancel()
        with anyio.CancelScope(shield=True):
            await host.sessions.flush(session)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("session")
    parser.add_argument("mode", choices=["wait", "decided"])
    parser.add_argument("marker")
    parser.add_argument("effects")
    anyio.run(main, parser.parse_args())
