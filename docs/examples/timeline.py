"""Print the timeline of one turn: each event as it is appended, each checkpoint as it ends.

The backend's batch window is set to an hour, so that nothing but the checkpoints (and the
host's flush after the turn) writes: the timeline is the same on every run.

    python docs/examples/timeline.py > docs/examples/timeline.txt
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio

from kai_session_checkpoint_policy import Agent
from kai_session_checkpoint_policy.cli import Console
from kai_session_checkpoint_policy.demo import (
    MODEL,
    PROMPT,
    PROVIDER,
    CheckpointReporter,
    demo_host,
)


async def main() -> None:
    console = Console(sys.stdout, color=False)
    reporter = CheckpointReporter(console)
    with tempfile.TemporaryDirectory() as root:
        async with demo_host(
            Path(root),
            extra_plugins=[reporter],
            announce=lambda text: console.line(f"   $ {text}"),
            batch_window=3600,
        ) as (host, _backend):
            session = host.sessions.create("invoice-1042")
            await Agent(host, session, provider=PROVIDER, model=MODEL).run_turn(PROMPT)
            await host.sessions.flush(session)
            reporter.report(host, session, "the host's own flush after the turn")


if __name__ == "__main__":
    anyio.run(main)
