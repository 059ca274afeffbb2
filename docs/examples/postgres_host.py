"""A host whose sessions live in PostgreSQL: the backend comes from its entry point.

Run it with a database any number of times, from any machine that reaches the database: the
session is resumed wherever it was left.

    python docs/examples/postgres_host.py postgresql://kai@db.example/kai
"""

from __future__ import annotations

import sys

import anyio

# example: start
from kai_session_checkpoint_policy import Agent, Host
from kai_session_checkpoint_policy.demo import PROVIDER, ScriptedModel, make_payment_tool


async def main(dsn: str) -> None:
    options = {"postgres.dsn": dsn, "postgres.lease_ttl": 10}
    async with Host(options=options) as host:  # the policy and the backend from entry points
        host.llm.register_adapter(PROVIDER, ScriptedModel())
        host.tools.register(make_payment_tool())
        # Resumed (and recovered first) if any host stored it; refused as locked while
        # another live host holds its lease.
        session = await host.sessions.open("invoice-1042")
        agent = Agent(host, session, provider=PROVIDER, model="demo")
        print((await agent.run_turn("Please pay invoice 1042.")).text)
        await host.sessions.flush(session)


# example: end


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
