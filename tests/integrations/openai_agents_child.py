"""A payment agent on the OpenAI Agents SDK, offline: the model is scripted, the tool pays.

The model (:class:`PaymentModel`) asks for one ``send_payment`` call while the input it is sent
holds no output for a call, and answers with text once it does; it records every request's
input. The tool appends one line per payment to a ledger file (fsynced) before it returns, so
the ledger is the world's memory of what was paid.

Run as a script it is the child process of the crash tests::

    python openai_agents_child.py MODE STORE SESSION LEDGER REQUESTS PROMPT [--marker FILE]

MODE is ``checkpoint`` (a :class:`CheckpointSession` in the store STORE, with its hooks) or
``sqlite`` (the SDK's own ``SQLiteSession`` in the database file STORE). Each request the model
receives is appended to REQUESTS as one JSON line. With ``--marker``, the tool writes
``tool-side-effect`` into FILE after the payment and blocks until the process is killed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
from agents import (
    Agent,
    FunctionTool,
    ModelResponse,
    ModelSettings,
    Runner,
    RunResult,
    SQLiteSession,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model, ModelTracing
from agents.tool import Tool
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam

from kai_session_checkpoint_policy.integrations.openai_agents import CheckpointSession

TOOL_NAME: Final = "send_payment"
MODEL_NAME: Final = "scripted-payments"
PROMPT: Final = "Please pay invoice 1042: 120.00 EUR to ACME Corp."
ARGUMENTS: Final = '{"invoice": "1042", "amount": "120.00"}'
MARKER_TEXT: Final = "tool-side-effect"

Probe = Callable[[list[dict[str, Any]]], Awaitable[None]]


def call_id_for(items: list[dict[str, Any]]) -> str:
    """The id of the call the model asks for: numbered by the user messages it has seen."""
    return f"call-pay-{sum(1 for item in items if item.get('role') == 'user')}"


@dataclass
class PaymentModel(Model):
    """A scripted model: asks to pay until a call's output is in its input, then answers.

    ``requests`` holds the input of every request; *probe*, if given, is awaited with it first
    (tests read the store there); *requests_file* gets each input as one JSON line.
    """

    probe: Probe | None = None
    model: str = MODEL_NAME
    requests_file: Path | None = None
    requests: list[list[dict[str, Any]]] = field(default_factory=list)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        items: list[dict[str, Any]] = (
            [{"role": "user", "content": input}]
            if isinstance(input, str)
            else [dict(item) for item in input]
        )
        self.requests.append(items)
        if self.requests_file is not None:
            _append_synced(self.requests_file, json.dumps(items) + "\n")
        if self.probe is not None:
            await self.probe(items)
        outputs = [item for item in items if item.get("type") == "function_call_output"]
        if not outputs:
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id=call_id_for(items),
                name=TOOL_NAME,
                arguments=ARGUMENTS,
                status="completed",
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        last = str(outputs[-1].get("output"))
        answer = (
            "Invoice 1042 is paid."
            if last.startswith("paid")
            else "I cannot tell whether invoice 1042 was paid; I will check before paying again."
        )
        text = ResponseOutputText(type="output_text", text=answer, annotations=[])
        message = ResponseOutputMessage(
            id="msg-1", type="message", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the scripted model does not stream")


def payment_tool(
    ledger: Path, *, marker: Path | None = None, probe: Callable[[], Awaitable[None]] | None = None
) -> FunctionTool:
    """The ``send_payment`` tool: one fsynced ledger line per payment, then its receipt.

    *probe* is awaited when the body starts; with *marker*, the body writes the marker after
    the payment and then blocks until the process is killed.
    """

    async def send_payment(invoice: str, amount: str) -> str:
        """Pay an invoice. Each call moves money: it is not safe to repeat."""
        if probe is not None:
            await probe()
        _append_synced(ledger, json.dumps({"invoice": invoice, "amount": amount}) + "\n")
        if marker is not None:
            _append_synced(marker, MARKER_TEXT)
            await anyio.sleep_forever()
        return f"paid {amount} EUR for invoice {invoice}"

    return function_tool(send_payment, name_override=TOOL_NAME)


def payment_agent(model: PaymentModel, tool: FunctionTool) -> Agent[Any]:
    return Agent(name="payments", instructions="Pay invoices.", model=model, tools=[tool])


def _append_synced(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())


async def _main(arguments: list[str]) -> RunResult:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("checkpoint", "sqlite"))
    parser.add_argument("store")
    parser.add_argument("session")
    parser.add_argument("ledger", type=Path)
    parser.add_argument("requests", type=Path)
    parser.add_argument("prompt")
    parser.add_argument("--marker", type=Path)
    options = parser.parse_args(arguments)
    set_tracing_disabled(True)
    agent = payment_agent(
        PaymentModel(requests_file=options.requests),
        payment_tool(options.ledger, marker=options.marker),
    )
    if options.mode == "sqlite":
        session = SQLiteSession(options.session, db_path=options.store)
        return await Runner.run(agent, options.prompt, session=session)
    effects = {TOOL_NAME: "side-effecting"}
    async with CheckpointSession(options.store, options.session, effects=effects) as checkpointed:
        return await Runner.run(
            agent, options.prompt, session=checkpointed, hooks=checkpointed.hooks
        )


if __name__ == "__main__":
    result = anyio.run(_main, sys.argv[1:], backend="asyncio")
    print(result.final_output)
