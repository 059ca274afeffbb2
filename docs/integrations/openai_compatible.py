"""The reference agent against an OpenAI-compatible endpoint, with the checkpoint policy.

Run it with the endpoint's base URL, a model name and a directory for the session logs; the API
key is read from ``OPENAI_API_KEY``::

    python docs/integrations/openai_compatible.py https://api.openai.com/v1 gpt-4o-mini sessions

Any endpoint that speaks the protocol will do: ``http://localhost:11434/v1`` for Ollama,
``https://api.deepseek.com`` for DeepSeek (with ``DEEPSEEK_API_KEY``, passed as
``api_key_env``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import anyio

# example: start
from kai_session_checkpoint_policy import Agent, Host, Tool, ToolExecution, invariant, policy
from kai_session_checkpoint_policy.adapters.openai_compat import OpenAICompatibleModel
from kai_session_checkpoint_policy.persistence import open_store

if TYPE_CHECKING:
    from kai_session_checkpoint_policy import JSON

INVOICES: dict[str, JSON] = {
    "1042": {"invoice": "1042", "amount": "120.00 EUR", "due": "2025-04-30", "paid": False},
}


async def invoice_status(execution: ToolExecution) -> JSON:
    arguments = execution.arguments
    number = arguments.get("invoice") if isinstance(arguments, dict) else None
    return INVOICES.get(str(number), f"no invoice {number}")


INVOICE_STATUS = Tool(
    "invoice_status",
    invoice_status,
    description="Look up an invoice: its amount, and whether it is paid.",
    concurrency_safe=True,
    parameters={  # the JSON Schema the model is given for the arguments
        "type": "object",
        "properties": {"invoice": {"type": "string", "description": "The invoice number."}},
        "required": ["invoice"],
    },
)


async def main(base_url: str, model: str, store: str) -> None:
    async with Host([open_store(store), policy, invariant], autoload=False) as host:
        host.llm.register_adapter("openai", OpenAICompatibleModel(base_url))
        host.tools.register(INVOICE_STATUS)
        session = await host.sessions.open("invoices")  # resumed if it is stored
        agent = Agent(host, session, provider="openai", model=model)
        outcome = await agent.run_turn("Is invoice 1042 paid?")
        await host.sessions.flush(session)
    print(outcome.text if outcome.error is None else f"the turn failed: {outcome.error}")


# example: end


if __name__ == "__main__":
    base_url, model, store = sys.argv[1:4]
    anyio.run(main, base_url, model, store)
