"""An OpenAI Agents SDK agent whose session is a checkpointed session log.

Run it with a directory for the session logs, or without one to use a temporary directory::

    python docs/examples/integration_openai_agents.py [ROOT]

It runs offline: the model is a scripted one that asks for one payment and then answers. With a
real model, give the agent its name instead (``model="gpt-4.1"``) and leave the rest as it is.
Run it twice with the same directory: the second run resumes the session, and its model sees
the first run's transcript.
"""

from __future__ import annotations

import sys
import tempfile
from typing import TYPE_CHECKING, Any

import anyio
from agents import (
    Agent,
    ModelResponse,
    ModelSettings,
    Runner,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.models.interface import Model, ModelTracing
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from kai_session_checkpoint_policy.integrations.openai_agents import CheckpointSession

if TYPE_CHECKING:
    from agents.agent_output import AgentOutputSchemaBase
    from agents.handoffs import Handoff
    from agents.items import TResponseInputItem
    from agents.tool import Tool


# example: start
@function_tool
def send_payment(invoice: str, amount: str) -> str:
    """Pay an invoice. Each call moves money: it is not safe to repeat."""
    return f"sent {amount} EUR for invoice {invoice}"


async def main(root: str) -> None:
    agent = Agent(name="payments", model=ScriptedModel(), tools=[send_payment])
    async with CheckpointSession(root, "invoice-1042") as session:  # resumed if it is stored
        result = await Runner.run(
            agent, "Please pay invoice 1042.", session=session, hooks=session.hooks
        )
    print(result.final_output)


# example: end


class ScriptedModel(Model):
    """Asks for one payment until its input holds the payment's output, then answers."""

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        **options: Any,
    ) -> ModelResponse:
        items = [] if isinstance(input, str) else [dict(item) for item in input]
        outputs = [item["output"] for item in items if item.get("type") == "function_call_output"]
        turn = sum(1 for item in items if item.get("role") == "user")
        if len(outputs) < turn:
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id=f"call-pay-{turn}",
                name="send_payment",
                arguments='{"invoice": "1042", "amount": "120.00"}',
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text=f"Done: {outputs[-1]}.", annotations=[])
        message = ResponseOutputMessage(
            id="msg", type="message", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")


if __name__ == "__main__":
    set_tracing_disabled(True)  # the example runs offline: no traces are exported
    if len(sys.argv) > 1:
        anyio.run(main, sys.argv[1], backend="asyncio")
    else:
        with tempfile.TemporaryDirectory() as directory:
            anyio.run(main, directory, backend="asyncio")
