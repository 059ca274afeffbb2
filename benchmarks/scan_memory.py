"""Peak memory of scanning a 1,000,000-event log: the whole file read first, or chunk by chunk.

``python -m benchmarks.scan_memory [--events N] [--directory D]`` writes the log of
:mod:`benchmarks.recovery` (plain lines, and the same events compressed), then scans each in a
fresh process two ways, and prints a JSON object of the results:

* ``whole``: the file read into one buffer, then scanned (how the backend read a log before);
* ``chunked``: the file scanned a chunk of :data:`~kai_session_checkpoint_policy.persistence.
  jsonl.format.CHUNK_BYTES` at a time, as the backend reads it now.

Each child reports the peak resident size of its own address space (``VmHWM``, Linux) before
and after the scan; the difference is what the scan took at its peak, the events it made
included (they hold their records' raw bytes, so a plain log's text stays referenced by them
either way).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Final

from kai_session_checkpoint_policy.persistence.jsonl.files import OsFiles
from kai_session_checkpoint_policy.persistence.jsonl.format import scan_file, scan_log

from .recovery import convert, generate_log

EVENTS: Final = 1_000_000
WAYS: Final = ("whole", "chunked")


def _hwm() -> int:
    """The peak resident size of this process's own address space, in bytes (Linux)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (this benchmark needs Linux)")


def measure(path: Path, way: str) -> dict[str, object]:
    """Scan the log at *path* one *way*; the peak before and after, and what was read."""
    files = OsFiles()
    before = _hwm()
    started = time.perf_counter()
    if way == "whole":
        scan = scan_log(files.read(path), path)
    else:
        scan = scan_file(partial(files.reader, path), path)
    seconds = time.perf_counter() - started
    after = _hwm()
    return {
        "events": len(scan.events),
        "torn_bytes": len(scan.torn),
        "seconds": round(seconds, 3),
        "peak_before": before,
        "peak_after": after,
        "scan_peak_mib": round((after - before) / (1 << 20), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scan_memory")
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument("--directory", type=Path)
    parser.add_argument("--measure", nargs=2, metavar=("LOG", "WAY"), help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.measure:
        log, way = arguments.measure
        print(json.dumps(measure(Path(log), way)))
        return 0
    with tempfile.TemporaryDirectory(dir=arguments.directory) as scratch:
        plain = Path(scratch) / "session.jsonl"
        generate_log(plain, arguments.events)
        compressed = convert(plain, "zstd").rename(Path(scratch) / "session.jsonl.zstd")
        results: dict[str, object] = {}
        for log in (plain, compressed):
            for way in WAYS:
                child = subprocess.run(
                    [sys.executable, "-m", "benchmarks.scan_memory", "--measure", str(log), way],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                measured = json.loads(child.stdout)
                measured["file_mib"] = round(log.stat().st_size / (1 << 20), 1)
                results[f"{log.name} {way}"] = measured
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
