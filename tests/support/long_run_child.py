"""Serve many sessions one after another in one host, under a small limit on open files.

Run as ``python long_run_child.py ROOT SESSIONS FILE_LIMIT``: the process lowers its own limit
on open files to FILE_LIMIT, serves SESSIONS sessions one after another (each: three events,
three flushes, then ``sessions.close``), then keeps twice FILE_LIMIT sessions live at once and
flushes each. It prints one JSON object with what it measured: the flushes that succeeded, the
peak number of open descriptors, and how much the resident memory grew after a warm-up.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
from pathlib import Path

import anyio

from kai_session_checkpoint_policy import Host, JsonlSessionPersistence

WARM_UP = 1_000
"""Sessions served before the resident memory is first measured."""


def descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_kib() -> int:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


async def serve(root: Path, sessions: int, file_limit: int) -> dict[str, int]:
    backend = JsonlSessionPersistence(root)
    flushes = 0
    async with Host([backend], autoload=False) as host:
        at_start = peak = descriptors()
        rss_after_warm_up = 0
        for index in range(sessions):
            if index == WARM_UP:
                rss_after_warm_up = rss_kib()
            session = host.sessions.create(f"session-{index}")
            session.append("turn/start", {"turn": 1})
            await host.sessions.flush(session)
            session.append("step/start", {"turn": 1, "step": 1})
            await host.sessions.flush(session)
            peak = max(peak, descriptors())  # the session's log and lock are open
            session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
            await host.sessions.close(session)
            flushes += 3
        rss_growth = rss_kib() - rss_after_warm_up
        live = [host.sessions.create(f"live-{index}") for index in range(2 * file_limit)]
        live_peak = descriptors()
        for session in live:
            session.append("turn/start", {"turn": 1})
            await host.sessions.flush(session)
            live_peak = max(live_peak, descriptors())
        for session in live:
            await host.sessions.close(session)
    return {
        "sessions": sessions,
        "flushes": flushes,
        "file_limit": file_limit,
        "descriptors_at_start": at_start,
        "peak_descriptors": peak,
        "rss_growth_kib": rss_growth,
        "live_phase_sessions": len(live),
        "live_phase_peak_descriptors": live_peak,
    }


def main() -> int:
    root, sessions, file_limit = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (file_limit, hard))
    with tempfile.TemporaryDirectory(dir=root, prefix="kai-long-run-") as scratch:
        report = anyio.run(serve, Path(scratch), sessions, file_limit)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
