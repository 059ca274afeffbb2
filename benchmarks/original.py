"""A burst of 32 checkpoints here and in the original harness, side by side in one run.

The original is the TypeScript harness whose persistence this library mirrors. It runs only
where a checkout of it is given (``--original``), with its session packages built
(``lib/index.js`` of ``vendor/cordis``, ``packages/core/session`` and
``packages/session/session-persistence-jsonl``), and a Node.js it accepts (22.19 or newer,
``--node``); otherwise the figure is skipped with a note.

Both sides run the same rounds, in each log format (plain lines, and zstd frames): one live
session whose log exists; each round records 32 ``tool/call`` events (as an agent loop records
a whole batch of tool calls before dispatching them), parks 32 tasks that each flush the
session (what the checkpoint policy awaits before a tool body runs), releases them together,
and times from the release to the last return, with the CPU the process spent meanwhile. Each
round also times one raw ``write`` of the bytes the burst wrote and its ``fsync``, on a file
beside the log, before or after the burst in turn. This side runs on asyncio, the original in
a Node.js process (``original_burst.mjs``); a pass runs one side, then the other, the order
alternating between passes. The figures are the medians of each pass, then their median over
the passes; the ratio is this library's latency over the original's.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.lowlevel

from ._support import FORMATS
from .steps import load_average

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["BURST", "DRIVER", "node_problem", "original_figures", "our_bursts"]

BURST: Final = 32
"""Checkpoints in one burst."""
DRIVER: Final = Path(__file__).with_name("original_burst.mjs")
"""The original's side of the figure, run with Node.js."""
_MINIMUM_NODE: Final = (22, 19)
_LOG_FORMATS: Final = ("plain", "zstd")


def node_problem(version: str) -> str | None:
    """Why the Node.js that printed *version* (``node --version``) cannot run the original,
    or ``None`` if it can."""
    found = re.fullmatch(r"v(\d+)\.(\d+)\.\d+\S*", version.strip())
    if found is None:
        return f"Node.js printed no version it could be judged by: {version.strip()!r}"
    if (int(found[1]), int(found[2])) < _MINIMUM_NODE:
        return f"the original needs Node.js 22.19 or newer, and this one is {version.strip()}"
    return None


async def our_bursts(
    directory: Path, log_format: str, rounds: int, warmup: int
) -> list[dict[str, Any]]:
    """This library's side: the measured rounds of :data:`BURST` checkpoints in *log_format*,
    each ``{"burst": {"wall", "cpu"}, "raw": {"wall", "cpu"}, "bytes", "writes", "fsyncs"}``
    (microseconds; the backend's own ``write`` and ``fsync`` calls in the burst)."""
    from kai_session_checkpoint_policy import Host
    from kai_session_checkpoint_policy.persistence import (
        JsonlSessionPersistence,
        encode_session_id,
    )
    from kai_session_checkpoint_policy.persistence.jsonl.format import NO_CWD, log_name

    compression, pack = FORMATS[log_format]
    session_id = f"burst-{log_format}"
    log = directory / NO_CWD / encode_session_id(session_id) / log_name(compression)
    backend = JsonlSessionPersistence(directory, compression=compression, pack_chunks=pack)
    measured: list[dict[str, Any]] = []
    async with Host([backend], autoload=False) as host:
        session = host.sessions.create(session_id)
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
        raw = os.open(log.with_name("raw.bin"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

        def raw_write(size: int) -> dict[str, float]:
            data = b"a" * size
            cpu, start = time.process_time_ns(), time.perf_counter_ns()
            os.write(raw, data)
            os.fsync(raw)
            end = time.perf_counter_ns()
            return {"wall": (end - start) / 1000, "cpu": (time.process_time_ns() - cpu) / 1000}

        try:
            step = size = 0
            for round_number in range(warmup + rounds):
                for _ in range(BURST):
                    step += 1
                    session.append(
                        "tool/call",
                        {
                            "turn": 1,
                            "step": step,
                            "callId": f"call-{step}",
                            "name": "lookup",
                            "arguments": "{}",
                        },
                    )
                before, counts = log.stat().st_size, backend.statistics()
                gate = anyio.Event()
                parked = 0
                last = last_cpu = 0

                async def checkpoint(gate: anyio.Event = gate) -> None:
                    nonlocal parked, last, last_cpu
                    parked += 1
                    await gate.wait()
                    await host.sessions.flush(session)
                    last, last_cpu = time.perf_counter_ns(), time.process_time_ns()

                async with anyio.create_task_group() as group:
                    for _ in range(BURST):
                        group.start_soon(checkpoint)
                    while parked < BURST:
                        await anyio.lowlevel.checkpoint()
                    baseline = raw_write(size) if round_number % 2 and size else None
                    cpu, start = time.process_time_ns(), time.perf_counter_ns()
                    gate.set()
                burst = {"wall": (last - start) / 1000, "cpu": (last_cpu - cpu) / 1000}
                size = log.stat().st_size - before
                after = backend.statistics()
                if round_number >= warmup:
                    measured.append(
                        {
                            "burst": burst,
                            "raw": baseline or raw_write(size),
                            "bytes": size,
                            "writes": after.writes - counts.writes,
                            "fsyncs": after.fsyncs - counts.fsyncs,
                        }
                    )
                elif baseline is None:
                    raw_write(size)
        finally:
            os.close(raw)
    return measured


def _medians(rounds: Sequence[dict[str, Any]]) -> dict[str, float]:
    return {
        "wall_us": statistics.median(item["burst"]["wall"] for item in rounds),
        "cpu_us": statistics.median(item["burst"]["cpu"] for item in rounds),
        "raw_us": statistics.median(item["raw"]["wall"] for item in rounds),
        "bytes": statistics.median(item["bytes"] for item in rounds),
    }


def _theirs(node: str, checkout: Path, directory: Path, rounds: int, warmup: int) -> dict[str, Any]:
    command = [node, str(DRIVER), "--checkout", str(checkout), "--dir", str(directory)]
    command += ["--k", str(BURST), "--rounds", str(rounds), "--warmup", str(warmup)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        raise RuntimeError(f"the original's side failed: {lines[-1]}")
    figures: dict[str, Any] = json.loads(done.stdout)
    return figures


def _summary(passes: Sequence[dict[str, float]]) -> dict[str, float]:
    """The median over the passes of each figure, and the burst's ratio to its raw write."""
    summary = {key: round(statistics.median(item[key] for item in passes), 1) for key in passes[0]}
    summary["raw_ratio"] = round(summary["wall_us"] / summary["raw_us"], 2)
    return summary


def original_figures(
    directory: Path,
    *,
    checkout: Path | None,
    node: str = "node",
    passes: int = 3,
    rounds: int = 50,
    warmup: int = 5,
) -> dict[str, Any]:
    """The burst figures of both sides, per format, and their ratio; skipped with a note
    where the original cannot run here."""
    if checkout is None:
        return {
            "skipped": "no checkout of the original was given (--original DIR, with its "
            "session packages built)"
        }
    try:
        version = subprocess.run(
            [node, "--version"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        return {"skipped": f"Node.js did not run as {node!r}: {exc}"}
    problem = node_problem(version)
    if problem is not None:
        return {"skipped": problem}
    directory.mkdir(parents=True, exist_ok=True)
    load = load_average()
    ours: dict[str, list[dict[str, float]]] = {name: [] for name in _LOG_FORMATS}
    theirs: dict[str, list[dict[str, float]]] = {name: [] for name in _LOG_FORMATS}
    writes: dict[str, set[tuple[int, int]]] = {name: set() for name in _LOG_FORMATS}
    for number in range(passes):
        sides = ("ours", "theirs") if number % 2 == 0 else ("theirs", "ours")
        for side in sides:
            if side == "theirs":
                try:
                    figures = _theirs(node, checkout, directory, rounds, warmup)
                except RuntimeError as exc:
                    return {"skipped": str(exc)}
                for name in _LOG_FORMATS:
                    theirs[name].append(_medians(figures[name]))
                continue
            for name in _LOG_FORMATS:
                place = directory / f"ours-{number}-{name}"
                place.mkdir()
                measured = anyio.run(our_bursts, place, name, rounds, warmup)
                ours[name].append(_medians(measured))
                writes[name].update((item["writes"], item["fsyncs"]) for item in measured)
    commit = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short=12", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    result: dict[str, Any] = {
        "load_average": load,
        "node": version.strip(),
        "original_commit": commit or None,
        "passes": passes,
        "rounds": rounds,
    }
    for name in _LOG_FORMATS:
        here, there = _summary(ours[name]), _summary(theirs[name])
        result[name] = {
            "library": here,
            "original": there,
            "writes_and_fsyncs_per_burst": sorted(writes[name]),
            "ratio": round(here["wall_us"] / there["wall_us"], 2),
        }
    return result
