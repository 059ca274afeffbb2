"""The same host, with its plugins loaded from the ``kai`` entry-point group.

The installed package declares three entry points: the policy, its invariant companion, and the
JSONL backend, which comes to life when the host has the option ``"jsonl.root"``.

    python docs/examples/entry_points.py [ROOT]
"""

from __future__ import annotations

import sys
import tempfile

import anyio

# example: start
from kai_session_checkpoint_policy import Agent, Host
from kai_session_checkpoint_policy.demo import PROVIDER, ScriptedModel, make_payment_tool


async def main(root: str) -> None:
    async with Host(options={"jsonl.root": root, "jsonl.batch_window": 0.2}) as host:
        print(host.session_persistence)  # the JSONL backend the entry point configured
        host.llm.register_adapter(PROVIDER, ScriptedModel())
        host.tools.register(make_payment_tool())
        session = host.sessions.create("invoice-1042")
        agent = Agent(host, session, provider=PROVIDER, model="demo")
        print((await agent.run_turn("Please pay invoice 1042.")).text)
        await host.sessions.flush(session)


# example: end


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as scratch:
        anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else scratch)
