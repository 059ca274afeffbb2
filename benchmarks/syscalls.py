"""A fixed workload whose write and fsync counts can be checked against ``strace``.

Run it under ``strace -c -f -e trace=write,fsync,fdatasync python -m benchmarks.syscalls``:
the backend's own counters (``statistics()``) are printed as one JSON line at the end, with
one ``write`` system call, so strace should count ``writes + 1`` writes and ``fsyncs +
directory_fsyncs`` fsyncs (the event loops wake themselves with ``send``, not ``write``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from kai_session_checkpoint_policy import Host
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence

from ._support import CHUNK_DATA

if TYPE_CHECKING:
    from collections.abc import Sequence


async def workload(root: Path, flushes: int, burst: int) -> dict[str, object]:
    """One new session file, *flushes* flushes of one event each, then a burst of checkpoints."""
    backend = JsonlSessionPersistence(root)
    async with Host([backend], autoload=False) as host:
        session = host.sessions.create("syscalls")
        session.append("assistant/chunk", CHUNK_DATA)
        await host.sessions.flush(session)  # publishes the file: temporary file, link, dir
        for _ in range(flushes):
            session.append("assistant/chunk", CHUNK_DATA)
            await host.sessions.flush(session)
        for _ in range(burst):
            session.append("tool/call", {"turn": 1, "step": 1, "callId": "c", "name": "t"})
        async with anyio.create_task_group() as group:
            for _ in range(burst):
                group.start_soon(host.sessions.flush, session)
        statistics = backend.statistics()
    return {"flushes": flushes + 1, "burst": burst, **asdict(statistics)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.syscalls")
    parser.add_argument("--backend", default="asyncio", choices=("asyncio", "trio"))
    parser.add_argument("--flushes", type=int, default=100)
    parser.add_argument("--burst", type=int, default=32)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="kai-syscalls-"))
    try:
        counts = anyio.run(workload, root, args.flushes, args.burst, backend=args.backend)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    sys.stdout.write(json.dumps(counts) + "\n")  # one write(2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
