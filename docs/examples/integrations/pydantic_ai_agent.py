"""A Pydantic AI agent whose runs are recorded in a session log, with the policy's checkpoints.

Run it with the directory of the session logs (or a ``postgresql://`` URL)::

    python docs/examples/integrations/pydantic_ai_agent.py sessions/

The model is Pydantic AI's ``FunctionModel``, so that the example runs offline; an agent of
your own takes any model Pydantic AI supports.
"""

from __future__ import annotations

import asyncio
import sys

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from kai_session_checkpoint_policy.integrations.pydantic_ai import open_session


def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Asks for one payment, then says it is done; thanks, when thanked."""
    if len(messages) == 1:
        call = ToolCallPart("send_payment", {"invoice": 42, "cents": 12000}, tool_call_id="pay-42")
        return ModelResponse(parts=[call])
    if len(messages) == 3:
        return ModelResponse(parts=[TextPart("Invoice 42 is paid.")])
    return ModelResponse(parts=[TextPart("You are welcome.")])


# example: agent
agent = Agent(FunctionModel(scripted_model), instructions="You pay invoices.")


@agent.tool_plain
def send_payment(invoice: int, cents: int) -> str:
    """Pay an invoice. Each call moves money: it is not safe to repeat."""
    return f"paid {cents} cents for invoice {invoice}"


async def main(store: str) -> None:
    async with open_session(store, "invoice-42") as session:
        result = await agent.run(
            "Pay invoice 42: 120.00 EUR",
            message_history=session.message_history,
            capabilities=[session.capability],
        )
        print(result.output)

    # Later, in this process or another one: the session is recovered, and goes on.
    async with open_session(store, "invoice-42") as session:
        result = await agent.run(
            "Thank you!",
            message_history=session.message_history,
            capabilities=[session.capability],
        )
        print(result.output)
        print(", ".join(event.type for event in session.events))


# example: end

if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
