"""A Pydantic AI agent that pays one invoice: the child process of the crash tests.

Run as a script (it imports nothing from the tests)::

    python tests/integrations/pydantic_ai_child.py MODE STORE SESSION WORKDIR [LEASE_TTL]

``MODE`` is one of:

``pay``
    Run "Pay invoice 42" through the integration, with the session *SESSION* of the store
    *STORE*. The model asks for two calls: ``pay-1``, whose body pays (appends a line to
    ``WORKDIR/ledger``), then writes ``paid`` into ``WORKDIR/marker`` and blocks until killed;
    and ``receipt-1``, which would append a line to ``WORKDIR/receipts`` once the payment is
    done (``pay`` is a sequential tool: the calls after it wait for it).
``resume``
    Open the session again through the integration and run on from its history, without a
    new prompt.
``pay-native``, ``resume-native``
    The same without the integration, as Pydantic AI offers it: the run's history is saved
    with Pydantic AI's own serialization after every node (``agent.iter``), into
    ``WORKDIR/history.json``, and a resumed run starts from it.

Every model request appends its messages to ``WORKDIR/requests.jsonl``, one line per request,
in Pydantic AI's JSON form. With *LEASE_TTL* (seconds), a PostgreSQL store's lease lasts that
long, and ``resume`` waits for a killed writer's lease to expire.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from pydantic_ai import Agent, ModelMessagesTypeAdapter
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from kai_session_checkpoint_policy.integrations.pydantic_ai import open_session
from kai_session_checkpoint_policy.persistence import SessionLockedError, Store, open_store

PROMPT = "Pay invoice 42"
PAY_ID = "pay-1"
RECEIPT_ID = "receipt-1"


def append_line(path: Path, data: bytes) -> None:
    """Append one line, straight to the OS and then to the disk."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def make_agent(workdir: Path, *, block_after_paying: bool) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        append_line(workdir / "requests.jsonl", ModelMessagesTypeAdapter.dump_json(messages))
        returns = [part for part in messages[-1].parts if isinstance(part, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(" / ".join(str(r.content) for r in returns))])
        return ModelResponse(
            parts=[
                ToolCallPart("pay", {"invoice": 42}, tool_call_id=PAY_ID),
                ToolCallPart("send_receipt", {"invoice": 42}, tool_call_id=RECEIPT_ID),
            ]
        )

    agent = Agent(FunctionModel(model), instructions="Pay what you are asked to pay.")

    @agent.tool_plain(sequential=True, metadata={"effect": "side-effecting"})
    async def pay(invoice: int) -> str:
        append_line(workdir / "ledger", f"paid invoice {invoice}".encode())
        if block_after_paying:
            (workdir / "marker").write_text("paid")
            await asyncio.Event().wait()  # until SIGKILL
        return f"invoice {invoice} paid"

    @agent.tool_plain
    async def send_receipt(invoice: int) -> str:
        append_line(workdir / "receipts", f"receipt for invoice {invoice}".encode())
        return "receipt sent"

    return agent


def store_of(store: str, lease_ttl: float | None) -> str | Store:
    return store if lease_ttl is None else open_store(store, lease_ttl=lease_ttl)


async def with_integration(
    mode: str, store: str, session_id: str, workdir: Path, ttl: float | None
) -> None:
    agent = make_agent(workdir, block_after_paying=mode == "pay")
    deadline = time.monotonic() + 30
    while True:
        try:
            async with open_session(store_of(store, ttl), session_id) as session:
                prompt = PROMPT if mode == "pay" else None
                history = session.message_history
                await agent.run(prompt, message_history=history, capabilities=[session.capability])
            return
        except SessionLockedError:
            if ttl is None or time.monotonic() > deadline:
                raise
            await asyncio.sleep(ttl / 10)  # the killed writer's lease has not expired yet


async def native(mode: str, workdir: Path) -> None:
    agent = make_agent(workdir, block_after_paying=mode == "pay-native")
    saved = workdir / "history.json"
    history = ModelMessagesTypeAdapter.validate_json(saved.read_bytes()) if saved.exists() else []
    prompt = PROMPT if mode == "pay-native" else None
    async with agent.iter(prompt, message_history=history) as run:
        async for _node in run:
            saved.write_bytes(ModelMessagesTypeAdapter.dump_json(run.all_messages()))


def main(argv: list[str]) -> None:
    mode, store, session_id, workdir = argv[:4]
    ttl = float(argv[4]) if len(argv) > 4 else None
    if mode.endswith("-native"):
        asyncio.run(native(mode, Path(workdir)))
    else:
        asyncio.run(with_integration(mode, store, session_id, Path(workdir), ttl))


if __name__ == "__main__":
    main(sys.argv[1:])
