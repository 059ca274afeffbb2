"""A host with the JSONL backend and the checkpoint policy runs one turn of the demo agent.

Run it with a directory for the session logs, or without one to use a temporary directory::

    python docs/examples/quickstart.py [ROOT]

Run it again with the same directory: the session is resumed, and the turn sees the first one's
transcript.
"""

from __future__ import annotations

import sys
import tempfile

import anyio

# example: start
from kai_session_checkpoint_policy import Agent, Host, JsonlSessionPersistence, invariant, policy
from kai_session_checkpoint_policy.demo import PROVIDER, ScriptedModel, make_payment_tool


async def main(root: str) -> None:
    async with Host([JsonlSessionPersistence(root), policy, invariant], autoload=False) as host:
        host.llm.register_adapter(PROVIDER, ScriptedModel())
        host.tools.register(make_payment_tool())
        session = await host.sessions.open("invoice-1042")  # resumed if it is on disk
        agent = Agent(host, session, provider=PROVIDER, model="demo")
        print((await agent.run_turn("Please pay invoice 1042.")).text)
        await host.sessions.flush(session)  # the loop does not flush at the end of a turn


# example: end


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as scratch:
        anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else scratch)
