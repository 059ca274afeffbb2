"""``python -m benchmarks``: run the suite, print a table (or ``--json``), optionally a chart."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from ._support import cpu_reference, machine
from .chart import render_svg
from .postgres import postgres_figures
from .recovery import recovery
from .report import evaluate, table
from .scenarios import Plan, run_all
from .steps import load_average, step_figures

if TYPE_CHECKING:
    from collections.abc import Sequence

SCENARIOS = (
    "flush",
    "checkpoints",
    "stream",
    "policy",
    "resume",
    "telemetry",
    "recovery",
    "postgres",
    "steps",
)
BACKENDS = ("asyncio", "trio")

FULL = Plan(rounds=20, per_round=50, stream_events=20_000, stream_runs=3, policy_turns=50)
QUICK = Plan(
    rounds=2,
    per_round=10,
    stream_events=2_000,
    stream_runs=1,
    policy_turns=5,
    resumed_events=2_000,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=(
            "Measure the checkpoint path against a raw write+fsync in the same run, and the "
            "PostgreSQL backend against a one-row INSERT and COMMIT on its own server."
        ),
    )
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (small samples)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="directory to measure in (its file system is the one measured; default: a "
        "temporary directory)",
    )
    parser.add_argument(
        "--backend", action="append", choices=BACKENDS, help="event loop (default: both)"
    )
    parser.add_argument(
        "--scenario", action="append", choices=SCENARIOS, help="scenario (default: all)"
    )
    parser.add_argument(
        "--events", type=int, default=None, help="events in the recovered logs (default 1000000)"
    )
    parser.add_argument(
        "--recovery-runs", type=int, default=None, help="loads per event loop (default 3)"
    )
    parser.add_argument("--svg", type=Path, default=None, help="write the flush chart here")
    parser.add_argument(
        "--original",
        type=Path,
        default=None,
        help="a checkout of the original harness with its session packages built, for the "
        "burst figure of the steps scenario (default: that figure is skipped)",
    )
    parser.add_argument(
        "--node", default="node", help="the Node.js that runs the original (default: node)"
    )
    return parser


def run(args: argparse.Namespace, directory: Path) -> dict[str, object]:
    plan = QUICK if args.quick else FULL
    backends: Sequence[str] = args.backend or BACKENDS
    scenarios: Sequence[str] = args.scenario or SCENARIOS
    results: dict[str, object] = {
        "suite": "kai-session-checkpoint-policy benchmarks",
        "quick": args.quick,
        "machine": machine(directory),
        "plan": {
            "rounds": plan.rounds,
            "samples_per_round": plan.per_round,
            "stream_events": plan.stream_events,
            "stream_runs": plan.stream_runs,
            "policy_turns_per_round": plan.policy_turns,
            "resumed_events": plan.resumed_events,
        },
    }
    started = time.perf_counter()
    reference = cpu_reference()
    loads: dict[str, float] = {}
    results["load_average"] = loads  # the one-minute load average as each part started
    loop_scenarios = [name for name in scenarios if name not in ("recovery", "postgres", "steps")]
    if loop_scenarios:
        figures: dict[str, object] = {}
        for backend in backends:
            root = directory / backend
            root.mkdir()
            loads[backend] = load_average()
            figures[backend] = anyio.run(run_all, root, plan, loop_scenarios, backend=backend)
        results["backends"] = figures
    events = args.events or (5_000 if args.quick else 1_000_000)
    runs = args.recovery_runs or (1 if args.quick else 3)
    if "recovery" in scenarios:
        loads["recovery"] = load_average()
        results["recovery"] = recovery(directory / "recovery", events, runs, backends)
    if "postgres" in scenarios:
        loads["postgres"] = load_average()
        results["postgres"] = postgres_figures(directory / "postgres", plan, backends, events, runs)
    if "steps" in scenarios:
        results["steps"] = step_figures(
            directory / "steps",
            quick=args.quick,
            loops=backends,
            memory_events=20_000 if args.quick else 1_000_000,
            original=args.original,
            node=args.node,
        )
    results["cpu_reference_us"] = {"start": reference, "end": cpu_reference()}
    results["seconds"] = round(time.perf_counter() - started, 1)
    results["targets"] = evaluate(results)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="kai-bench-", dir=args.dir))
    try:
        results = run(args, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if args.svg is not None:
        args.svg.write_text(render_svg(results), encoding="utf-8")
    if args.json:
        sys.stdout.write(json.dumps(results) + "\n")
    else:
        sys.stdout.write(table(results) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
