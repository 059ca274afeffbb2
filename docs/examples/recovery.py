"""Crash the demo agent inside its payment tool, then resume the session after recovery.

The first half runs ``kai-checkpoint agent --hang-at tool`` as a child process and kills it
with SIGKILL once the payment is made. The second half is what a host does when it starts
again: load the session with recovery, and go on from the repaired log.

    python docs/examples/recovery.py [ROOT]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio

from kai_session_checkpoint_policy import TOOL_OUTCOME_UNKNOWN, Agent, Host, invariant, policy
from kai_session_checkpoint_policy.demo import (
    MARKERS,
    PROVIDER,
    ScriptedModel,
    agent_command,
    make_payment_tool,
    wait_for_marker,
)
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence


async def crash(root: Path, session_id: str, scratch: Path) -> None:
    """Run the agent in a child process and kill it inside the tool, after the payment."""
    marker = scratch / "marker"
    marker.write_bytes(b"")  # created empty: only its content says the child got there
    command = agent_command(
        root, session_id, hang_at="tool", marker=marker, ledger=scratch / "ledger", use_policy=True
    )
    async with await anyio.open_process(command) as process:
        await wait_for_marker(marker, MARKERS["tool"], process)
        process.kill()  # SIGKILL: no cleanup, no final flush
        await process.wait()


# example: start
async def resume(root: Path, session_id: str) -> str:
    backend = JsonlSessionPersistence(root)
    async with Host([backend, policy, invariant], autoload=False) as host:
        host.llm.register_adapter(PROVIDER, ScriptedModel())
        host.tools.register(make_payment_tool())
        stored = await backend.load(session_id)  # closes the interrupted turn, durably
        for event in stored.repair:
            print("recovery added", event.seq, event.type, event.data.get("error", ""))
        session = host.sessions.create(session_id, seed=stored.events)
        agent = Agent(host, session, provider=PROVIDER, model="demo")
        outcome = await agent.run_turn("Did the payment of invoice 1042 go through?")
        await host.sessions.flush(session)
        return outcome.text


# example: end


async def main(root: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        await crash(root, "invoice-1042", Path(scratch))
    answer = await resume(root, "invoice-1042")
    print("the model answered:", answer)
    assert TOOL_OUTCOME_UNKNOWN not in answer  # the model reads the text, not the code
    assert answer.startswith("I could not confirm that invoice 1042 was paid")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as sessions:
        anyio.run(main, Path(sys.argv[1] if len(sys.argv) > 1 else sessions))
