"""Write the sample logs shown in the docs, with a fixed clock, and print one of them.

``complete``: the log of one whole turn of the demo agent. ``recovered``: the same log cut
off right after the ``tool/call`` (as a crash inside the tool body leaves it), then loaded
with recovery, which appends the closers. The logs are written uncompressed
(``compression="none"``), so that they can be read as they are.

    python docs/examples/sample_log.py complete > docs/examples/sample-session.jsonl
    python docs/examples/sample_log.py recovered > docs/examples/recovered-session.jsonl
"""

from __future__ import annotations

import itertools
import sys
import tempfile
from pathlib import Path

import anyio

from kai_session_checkpoint_policy import Agent, Host, invariant, policy
from kai_session_checkpoint_policy.demo import (
    MODEL,
    PROMPT,
    PROVIDER,
    ScriptedModel,
    make_payment_tool,
)
from kai_session_checkpoint_policy.host import SessionMeta
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence
from kai_session_checkpoint_policy.persistence.jsonl.format import LOG_NAME, NO_CWD

START = 1_767_225_600_000  # 2026-01-01T00:00:00Z, in epoch milliseconds
SESSION = "invoice-1042"


async def complete(root: Path) -> bytes:
    """Run one turn of the demo agent with a clock that ticks 1 ms per event; return the log."""
    ticks = itertools.count(START)
    backend = JsonlSessionPersistence(root, compression="none")
    async with Host(
        [backend, policy, invariant], autoload=False, clock=lambda: next(ticks)
    ) as host:
        host.llm.register_adapter(PROVIDER, ScriptedModel())
        host.tools.register(make_payment_tool(announce=lambda text: None))
        # Created at the clock's first time, which the first event then has too.
        session = host.sessions.create(SESSION, meta=SessionMeta(created_at=START))
        await Agent(host, session, provider=PROVIDER, model=MODEL).run_turn(PROMPT)
        await host.sessions.flush(session)
    return (root / NO_CWD / SESSION / LOG_NAME).read_bytes()


async def recovered(root: Path) -> bytes:
    """Cut the complete log after its ``tool/call``, recover it, and return the result."""
    lines = (await complete(root)).splitlines(keepends=True)
    cut = next(index for index, line in enumerate(lines) if b'"type":"tool/call"' in line)
    log = root / NO_CWD / SESSION / LOG_NAME
    log.write_bytes(b"".join(lines[: cut + 1]))
    await JsonlSessionPersistence(root).load(SESSION)
    return log.read_bytes()


async def main(which: str) -> None:
    write = {"complete": complete, "recovered": recovered}[which]
    with tempfile.TemporaryDirectory() as root:
        sys.stdout.buffer.write(await write(Path(root)))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else "complete")
