"""A child process: many live sessions of one host checkpoint at once under a low file limit.

Run as ``python burst_child.py ROOT SESSIONS LIMIT``: it lowers its soft limit on open files
to LIMIT, opens one host with the JSONL backend, makes SESSIONS sessions live, appends one
event to each, and flushes them all at once, twice (their first batch creates each log, the
second appends). It prints one JSON object: the flushes that succeeded and failed (with the
first error), the most descriptors it had open at once, and the backend's limit.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
from pathlib import Path

import anyio

from kai_session_checkpoint_policy import Host
from kai_session_checkpoint_policy.host import Session
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence


class PeakDescriptors:
    """Counts this process's open descriptors from a thread, keeping the most seen."""

    def __init__(self) -> None:
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.wait(0.0005):
            try:
                self.peak = max(self.peak, len(os.listdir("/proc/self/fd")))
            except OSError:  # no descriptor left to list them with: the limit is reached
                self.peak = max(self.peak, resource.getrlimit(resource.RLIMIT_NOFILE)[0])

    def __enter__(self) -> PeakDescriptors:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()


async def burst(root: Path, sessions: int) -> dict[str, object]:
    backend = JsonlSessionPersistence(root, batch_window=3600, compression="none")
    ok = failed = 0
    first_error = ""

    async with Host([backend]) as host:
        live = [host.sessions.create(f"s{index}") for index in range(sessions)]

        async def flush_all(turn: int) -> None:
            nonlocal ok, failed, first_error

            async def flush(session: Session) -> None:
                nonlocal ok, failed, first_error
                try:
                    await host.sessions.flush(session)
                except Exception as exc:  # counted and reported, not raised
                    failed += 1
                    first_error = first_error or f"{type(exc).__name__}: {exc}"
                else:
                    ok += 1

            for session in live:
                session.append("turn/start", {"turn": turn})
            async with anyio.create_task_group() as group:
                for session in live:
                    group.start_soon(flush, session)

        with PeakDescriptors() as peak:
            await flush_all(1)
            await flush_all(2)
        for session in live:
            await host.sessions.close(session)
    return {
        "flushes": ok,
        "failed": failed,
        "first_error": first_error,
        "peak_descriptors": peak.peak,
        "max_open_sessions": backend.max_open_sessions,
    }


def main() -> None:
    root, sessions, limit = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    print(json.dumps(anyio.run(burst, root, sessions)))


if __name__ == "__main__":
    main()
