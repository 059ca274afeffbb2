"""Measurement helpers shared by the scenarios: summaries, the raw baseline, the machine."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Final

from kai_session_checkpoint_policy.persistence import OsFiles

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from kai_session_checkpoint_policy.persistence import Compression

__all__ = [
    "CHUNK_DATA",
    "DEFAULT_FORMAT",
    "FORMATS",
    "Baseline",
    "Summary",
    "TimedFiles",
    "cpu_reference",
    "machine",
    "summarize",
]

CHUNK_DATA: Final = {
    "turn": 1,
    "step": 1,
    "chunk": {"type": "text-delta", "index": 0, "text": "x" * 32},
}
"""The data of the stream event the scenarios append: a line of about 150 bytes on disk."""

FORMATS: Final[dict[str, tuple[Compression, bool]]] = {
    "plain": ("none", False),
    "plain packed": ("none", True),
    "zstd": ("zstd", True),
}
"""The formats of a log measured side by side: (compression, packing of chunk runs)."""
DEFAULT_FORMAT: Final = "zstd"
"""The backend's default, whose figures the targets judge."""

_RAW_LINE: Final = b"{" + b"x" * 148 + b"\n"
"""What the raw baseline writes: one 150-byte line."""


@dataclass(frozen=True, slots=True)
class Summary:
    """The distribution of one measured quantity (microseconds unless said otherwise)."""

    n: int
    median: float
    p90: float
    p99: float
    mean: float

    def to_json(self) -> dict[str, float]:
        return {key: round(value, 3) for key, value in asdict(self).items()}


def _rank(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank *q* quantile of *ordered* (sorted ascending, not empty)."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarize(samples_ns: Sequence[int] | Sequence[float], *, scale: float = 1e-3) -> Summary:
    """Median, p90, p99 and mean of *samples_ns*, scaled (default: nanoseconds to µs)."""
    if not samples_ns:
        raise ValueError("no samples")
    ordered = sorted(sample * scale for sample in samples_ns)
    return Summary(
        n=len(ordered),
        median=_rank(ordered, 0.5),
        p90=_rank(ordered, 0.9),
        p99=_rank(ordered, 0.99),
        mean=sum(ordered) / len(ordered),
    )


class Baseline:
    """The physical limit: write one 150-byte line with ``os.write``, then ``os.fsync``.

    It appends to a file in the benchmark directory, so it measures the same file system as
    the scenarios. Samples are taken in rounds interleaved with the scenario's own, so both
    see the same state of the machine.
    """

    def __init__(self, directory: Path) -> None:
        self._fd = os.open(
            directory / "baseline.raw", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
        )
        self.samples: list[int] = []

    def sample(self, count: int) -> list[int]:
        """Take *count* samples (nanoseconds each), keep them, and return them."""
        fd, line, clock = self._fd, _RAW_LINE, time.perf_counter_ns
        taken = []
        for _ in range(count):
            start = clock()
            os.write(fd, line)
            os.fsync(fd)
            taken.append(clock() - start)
        self.samples += taken
        return taken

    def close(self) -> None:
        os.close(self._fd)


class TimedFiles(OsFiles):
    """The real file layer, adding up the nanoseconds spent in its ``write`` and ``fsync`` calls.

    What a flush takes beyond :attr:`io_ns` is the library's own time (and the hops between
    threads): the part a faster disk would not shorten.
    """

    def __init__(self) -> None:
        super().__init__()
        self.io_ns = 0
        self.written = 0
        """Bytes written, to logs and the files published beside them."""

    def write(self, fd: int, data: bytes) -> None:
        start = time.perf_counter_ns()
        try:
            super().write(fd, data)
            self.written += len(data)
        finally:
            self.io_ns += time.perf_counter_ns() - start

    def fsync(self, fd: int) -> None:
        start = time.perf_counter_ns()
        try:
            super().fsync(fd)
        finally:
            self.io_ns += time.perf_counter_ns() - start


def _run(*command: str) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine(directory: Path) -> dict[str, object]:
    """What the figures were measured on: CPUs, memory, Python, kernel, file system."""
    memory = _memory_bytes()
    return {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_gib": None if memory is None else round(memory / 2**30, 1),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": sys.platform,
        "kernel": platform.release(),
        "file_system": _run("df", "--output=fstype", str(directory)).split()[-1],
    }


def cpu_reference() -> float:
    """Microseconds for ``json.loads(json.dumps(...))`` of a stream chunk's data.

    A yardstick of the CPU's speed at the time of the run, independent of this package: on
    a shared or virtual machine it varies, and every CPU-bound figure varies with it.
    """
    runs = []
    for _ in range(21):
        start = time.perf_counter_ns()
        for _ in range(1000):
            json.loads(json.dumps(CHUNK_DATA))
        runs.append((time.perf_counter_ns() - start) / 1000)
    return round(summarize(runs).median, 3)
