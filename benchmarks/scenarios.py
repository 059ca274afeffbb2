"""Scenarios 1-4 and 6: flush latency, concurrent checkpoints, streaming appends, policy
overhead, resuming a long session.

Each scenario runs inside one event loop (asyncio or trio, through anyio) and takes its samples
in rounds: a round first samples the raw baseline, then the scenario, so that every ratio
compares figures taken at the same time on the same file system.
"""

from __future__ import annotations

import itertools
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from kai_session_checkpoint_policy import (
    Agent,
    Finish,
    Host,
    LlmRequest,
    TextDelta,
    Tool,
    ToolExecution,
    policy,
    tool_call_block,
)
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence, encode_session_id
from kai_session_checkpoint_policy.persistence.jsonl.format import NO_CWD, log_name
from kai_session_checkpoint_policy.pytest_plugin import FlushRecorder

from ._support import CHUNK_DATA, DEFAULT_FORMAT, FORMATS, Baseline, Summary, TimedFiles, summarize
from .recovery import SESSION_ID, convert, generate_log

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Sequence
    from pathlib import Path

    from kai_session_checkpoint_policy import JSON, Session, StreamChunk
    from kai_session_checkpoint_policy.persistence import JsonlStatistics

__all__ = ["Plan", "run_all"]

clock = time.perf_counter_ns
_session_numbers = itertools.count()


@dataclass(frozen=True, slots=True)
class Plan:
    """How much to measure: rounds of samples, and the sizes of each scenario."""

    rounds: int
    per_round: int
    batch_sizes: tuple[int, ...] = (1, 10, 100)
    concurrency: tuple[int, ...] = (1, 8, 32)
    stream_events: int = 20_000
    stream_runs: int = 3
    policy_turns: int = 20
    resumed_events: int = 200_000


def _cell(
    latency: Sequence[int],
    baseline: Sequence[int],
    io: Sequence[int] = (),
    **counts: float,
) -> dict[str, object]:
    """One measured figure: its latency, the baseline of the same rounds, and their ratio.

    With *io* (the time each sample spent in ``write`` and ``fsync`` calls), also that time and
    what the sample took besides it.
    """
    measured, raw = summarize(latency), summarize(baseline)
    spent: dict[str, object] = {}
    if io:
        spent["io_us"] = summarize(io).to_json()
        spent["besides_io_us"] = summarize(
            [a - b for a, b in zip(latency, io, strict=True)]
        ).to_json()
    return {
        "latency_us": measured.to_json(),
        "baseline_us": raw.to_json(),
        **spent,
        "ratio": {
            "median": round(measured.median / raw.median, 3),
            "p90": round(measured.p90 / raw.p90, 3),
            "p99": round(measured.p99 / raw.p99, 3),
        },
        **{key: round(value, 3) for key, value in counts.items()},
    }


@asynccontextmanager
async def _jsonl_host(
    root: Path, log_format: str = DEFAULT_FORMAT
) -> AsyncIterator[tuple[Host, JsonlSessionPersistence, TimedFiles]]:
    """A host with only the JSONL backend (default settings but the format, timed files)."""
    files = TimedFiles()
    compression, pack = FORMATS[log_format]
    backend = JsonlSessionPersistence(root, compression=compression, pack_chunks=pack, files=files)
    async with Host([backend], autoload=False) as host:
        yield host, backend, files


async def _steady_session(host: Host, prefix: str) -> Session:
    """A new live session whose file already exists, so every later flush is one append.

    Each round of samples gets a fresh one (the others are detached), which bounds the events
    held in memory, and so the garbage collector's work, however many rounds are run.
    """
    for session in host.sessions.live():
        host.sessions.detach(session)
    session = host.sessions.create(f"{prefix}-{next(_session_numbers)}")
    session.append("assistant/chunk", CHUNK_DATA)
    await host.sessions.flush(session)
    return session


def _delta(after: JsonlStatistics, before: JsonlStatistics) -> tuple[int, int]:
    return after.writes - before.writes, after.fsyncs - before.fsyncs


# -- 1. flush latency after P appends ---------------------------------------------------------


async def flush_latency(
    root: Path, baseline: Baseline, plan: Plan, log_format: str = DEFAULT_FORMAT
) -> dict[str, object]:
    """Append P events, then time ``host.sessions.flush``: one write and one fsync each."""
    figures: dict[str, object] = {}
    async with _jsonl_host(root, log_format) as (host, backend, files):
        session = await _steady_session(host, "flush")
        for size in plan.batch_sizes:
            for _ in range(plan.per_round):  # warm up: not recorded
                for _ in range(size):
                    session.append("assistant/chunk", CHUNK_DATA)
                await host.sessions.flush(session)
            latency: list[int] = []
            io: list[int] = []
            raw: list[int] = []
            writes = fsyncs = 0
            for _ in range(plan.rounds):
                session = await _steady_session(host, "flush")
                raw += baseline.sample(plan.per_round)
                before = backend.statistics()
                for _ in range(plan.per_round):
                    for _ in range(size):
                        session.append("assistant/chunk", CHUNK_DATA)
                    io_before, start = files.io_ns, clock()
                    await host.sessions.flush(session)
                    latency.append(clock() - start)
                    io.append(files.io_ns - io_before)
                round_writes, round_fsyncs = _delta(backend.statistics(), before)
                writes += round_writes
                fsyncs += round_fsyncs
            figures[f"P={size}"] = _cell(
                latency,
                raw,
                io,
                writes_per_flush=writes / len(latency),
                fsyncs_per_flush=fsyncs / len(latency),
            )
    return figures


# -- 2. concurrent tool checkpoints -------------------------------------------------------------


def _tool_call(index: int) -> dict[str, JSON]:
    return {"turn": 1, "step": 1, "callId": f"call-{index}", "name": "lookup", "arguments": "{}"}


async def _group(host: Host, session: Session, k: int, spread_ns: int) -> int:
    """K tasks checkpointing one session; return the group latency.

    The latency runs from the first release to the return of the last checkpoint; the tasks'
    own teardown afterwards is the benchmark's, not the checkpoints'.

    The tasks are started and parked first (not timed), then released. When *spread_ns* is 0
    ("burst") the K tool calls are recorded first, as the agent loop records a whole batch
    before dispatching it, and all K tasks are released in the same scheduler round. Otherwise
    ("staggered") each task records its own tool call when released, and the releases are
    spread evenly over *spread_ns*: the first starts a write, the others arrive while it is in
    flight. Releases are paced by yielding to the scheduler until each is due, since a timer
    cannot resolve microseconds; when the loop is slower than the pace, it releases one task
    per round.
    """
    gates = [anyio.Event() for _ in range(k)] if spread_ns else [anyio.Event()] * k
    parked = 0
    returned = 0  # when the last checkpoint returned

    async def checkpoint(index: int) -> None:
        nonlocal parked, returned
        parked += 1
        await gates[index].wait()
        if spread_ns:
            session.append("tool/call", _tool_call(index))
        await host.sessions.flush(session)
        returned = max(returned, clock())

    if not spread_ns:
        for index in range(k):
            session.append("tool/call", _tool_call(index))

    async with anyio.create_task_group() as group:
        for index in range(k):
            group.start_soon(checkpoint, index)
        while parked < k:
            await anyio.lowlevel.checkpoint()
        start = clock()
        for index, gate in enumerate(gates):
            due = start + index * spread_ns // k
            while clock() < due:
                await anyio.lowlevel.checkpoint()
            gate.set()
    return returned - start


async def checkpoints(root: Path, baseline: Baseline, plan: Plan) -> dict[str, object]:
    """Groups of K concurrent checkpoints of one session: latency, writes and fsyncs per group.

    ``burst``: K tool calls are recorded, then K checkpoints are released in the same scheduler
    round. ``staggered``: each checkpoint records its own tool call when released; releases are
    spread evenly over the duration of one raw write+fsync (the baseline median measured so
    far), that is while the first checkpoint's write is in flight.
    """
    figures: dict[str, object] = {}
    async with _jsonl_host(root) as (host, backend, files):
        session = await _steady_session(host, "checkpoints")
        for mode in ("burst", "staggered"):
            cells: dict[str, object] = {}
            for k in plan.concurrency:
                latency: list[int] = []
                io: list[int] = []
                raw: list[int] = []
                writes: list[int] = []
                fsyncs: list[int] = []
                for _ in range(plan.rounds):
                    session = await _steady_session(host, "checkpoints")
                    raw += baseline.sample(plan.per_round)
                    spread = int(summarize(baseline.samples, scale=1).median)
                    for _ in range(plan.per_round):
                        before, io_before = backend.statistics(), files.io_ns
                        latency.append(
                            await _group(host, session, k, 0 if mode == "burst" else spread)
                        )
                        io.append(files.io_ns - io_before)
                        group_writes, group_fsyncs = _delta(backend.statistics(), before)
                        writes.append(group_writes)
                        fsyncs.append(group_fsyncs)
                cells[f"K={k}"] = _cell(
                    latency,
                    raw,
                    io,
                    writes_per_group=sum(writes) / len(writes),
                    fsyncs_per_group=sum(fsyncs) / len(fsyncs),
                    min_writes_per_group=min(writes),
                    max_writes_per_group=max(writes),
                    min_fsyncs_per_group=min(fsyncs),
                    max_fsyncs_per_group=max(fsyncs),
                )
            figures[mode] = cells
    return figures


# -- 3. a stream of small events, then one flush --------------------------------------------


async def stream(
    root: Path, baseline: Baseline, plan: Plan, log_format: str = DEFAULT_FORMAT
) -> dict[str, object]:
    """Append many small stream events without flushing, then flush once.

    Each append is followed by one scheduler checkpoint, as reading the next chunk from the
    network would be, so the backend's background window can write batches meanwhile. The
    append cost is timed around ``Session.append`` alone: the ``session_event`` hook and the
    backend's enqueue included. The log's size per event is taken at the end of each run.
    """
    appends: list[int] = []
    totals: list[int] = []
    flushes: list[int] = []
    raw: list[int] = []
    counts = {"writes": 0, "fsyncs": 0, "background_batches": 0, "batches": 0}
    sizes: list[float] = []
    async with _jsonl_host(root, log_format) as (host, backend, files):
        for run in range(plan.stream_runs):
            written = files.written
            session = await _steady_session(host, f"stream-{run}")
            raw += baseline.sample(plan.per_round)
            before = backend.statistics()
            start = clock()
            for _ in range(plan.stream_events):
                begin = clock()
                session.append("assistant/chunk", CHUNK_DATA)
                appends.append(clock() - begin)
                await anyio.lowlevel.checkpoint()
            middle = backend.statistics()
            begin = clock()
            await host.sessions.flush(session)
            end = clock()
            flushes.append(end - begin)
            totals.append(end - start)
            after = backend.statistics()
            writes, fsyncs = _delta(after, before)
            counts["writes"] += writes
            counts["fsyncs"] += fsyncs
            # Batches count when done, so a write still in flight is not yet "background".
            counts["background_batches"] += middle.batches - before.batches
            counts["batches"] += after.batches - before.batches
            sizes.append((files.written - written) / len(session.events))  # the whole log
    runs = plan.stream_runs
    return {
        "events": plan.stream_events,
        "runs": runs,
        "append_us": summarize(appends).to_json(),
        "total_ms": summarize(totals, scale=1e-6).to_json(),
        "final_flush": _cell(flushes, raw),
        "bytes_per_event": round(sum(sizes) / len(sizes), 1),
        **{f"{name}_per_run": count / runs for name, count in counts.items()},
    }


# -- 4. policy overhead per boundary ----------------------------------------------------------


async def _scripted_model(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
    """Step 1 asks for one tool call; once the transcript ends with its result, answer."""
    last = request.messages[-1] if request.messages else {}
    source = last.get("source")
    if isinstance(source, dict) and source.get("kind") == "tool":
        yield TextDelta("The answer is 42.")
        yield Finish("stop")
        return
    yield TextDelta("Let me look that up.")
    for chunk in tool_call_block(1, "call-1", "lookup", '{"query": "answer"}'):
        yield chunk
    yield Finish("tool-calls")


async def _lookup(execution: ToolExecution) -> JSON:
    return {"answer": 42}


BOUNDARIES_PER_TURN = 5
"""Two pre-steps, two model requests and one tool call."""


def _policy_host(with_policy: bool) -> tuple[Host, FlushRecorder]:
    """A host whose persistence is the pytest plugin's in-memory flush recorder."""
    stub = FlushRecorder()
    plugins: list[object] = [stub.plugin]
    if with_policy:
        plugins.insert(0, policy)
    host = Host(plugins, autoload=False)
    host.llm.register_adapter("bench", _scripted_model)
    host.tools.register(Tool("lookup", _lookup))
    return host, stub


async def _turn(host: Host) -> int:
    session = host.sessions.create()
    agent = Agent(host, session, provider="bench", model="scripted")
    start = clock()
    outcome = await agent.run_turn("What is the answer?")
    elapsed = clock() - start
    host.sessions.detach(session)
    if outcome.reason != {"kind": "completed"}:
        raise RuntimeError(f"the benchmark turn did not complete: {outcome.reason}")
    return elapsed


async def policy_overhead(baseline: Baseline, plan: Plan) -> dict[str, object]:
    """A two-step turn (5 boundaries) with the policy and the stub, and with the stub alone."""
    with_host, with_stub = _policy_host(True)
    without_host, without_stub = _policy_host(False)
    timed: dict[bool, list[int]] = {True: [], False: []}
    raw: list[int] = []
    async with with_host, without_host:
        for _ in range(plan.rounds):
            raw += baseline.sample(plan.per_round)
            for _ in range(plan.policy_turns):
                timed[True].append(await _turn(with_host))
                timed[False].append(await _turn(without_host))
    turns = len(timed[True])
    if len(with_stub.flushes) != BOUNDARIES_PER_TURN * turns or without_stub.flushes:
        raise RuntimeError("the policy did not checkpoint every boundary exactly once")
    with_policy, without_policy = summarize(timed[True]), summarize(timed[False])
    return {
        "turns": turns,
        "boundaries_per_turn": BOUNDARIES_PER_TURN,
        "flushes_per_turn": len(with_stub.flushes) / turns,
        "turn_with_policy_us": with_policy.to_json(),
        "turn_without_policy_us": without_policy.to_json(),
        "overhead_per_boundary_us": round(
            (with_policy.median - without_policy.median) / BOUNDARIES_PER_TURN, 3
        ),
        "overhead_per_boundary_mean_us": round(
            (with_policy.mean - without_policy.mean) / BOUNDARIES_PER_TURN, 3
        ),
        "baseline_us": summarize(raw).to_json(),
    }


# -- 5. resuming a long session, then one turn on it ----------------------------------------


async def resume(root: Path, baseline: Baseline, plan: Plan) -> dict[str, object]:
    """Resume a stored session of ``plan.resumed_events`` events (in the default format, its
    last turn open), flush after each of a few appends, then run one two-step turn on it.

    The first flush after the load is the one that used to read the whole log again; the
    raw baseline is sampled as many times as the flushes that follow it.
    """
    directory = root / NO_CWD / encode_session_id(SESSION_ID)
    directory.mkdir(parents=True)
    pristine = root / "pristine.jsonl"
    generate_log(pristine, plan.resumed_events)
    log = convert(pristine, DEFAULT_FORMAT)
    log.rename(directory / log_name(FORMATS[DEFAULT_FORMAT][0]))
    pristine.unlink()
    compression, pack = FORMATS[DEFAULT_FORMAT]
    backend = JsonlSessionPersistence(root, compression=compression, pack_chunks=pack)
    host = Host([backend, policy], autoload=False)
    host.llm.register_adapter("bench", _scripted_model)
    host.tools.register(Tool("lookup", _lookup))
    flushes: list[int] = []
    async with host:
        start = clock()
        session = await host.sessions.resume(SESSION_ID)
        loaded = clock() - start
        for _ in range(plan.per_round + 1):
            session.append("assistant/chunk", CHUNK_DATA)
            begin = clock()
            await host.sessions.flush(session)
            flushes.append(clock() - begin)
        agent = Agent(host, session, provider="bench", model="scripted")
        begin = clock()
        outcome = await agent.run_turn("What is the answer?")
        turn = clock() - begin
    if outcome.reason != {"kind": "completed"}:
        raise RuntimeError(f"the benchmark turn did not complete: {outcome.reason}")
    first, others = flushes[0], flushes[1:]
    raw = baseline.sample(plan.per_round)
    return {
        "events": plan.resumed_events,
        "raw_baseline_us": summarize(raw).to_json(),
        "load_ms": round(loaded / 1e6, 1),
        "first_flush_us": round(first / 1e3, 1),
        "other_flushes_us": summarize(others).to_json(),
        "first_flush_versus_slowest_other": round(first / max(others), 3),
        "turn_ms": round(turn / 1e6, 2),
    }


# -- all of them, on one event loop --------------------------------------------------------------


async def run_all(root: Path, plan: Plan, scenarios: Sequence[str]) -> dict[str, object]:
    """Run the selected scenarios in *root* on the current event loop."""
    baseline = Baseline(root)
    results: dict[str, object] = {}
    try:
        baseline.sample(plan.per_round)  # warm the file and the disk queue
        baseline.samples.clear()
        formats: dict[str, dict[str, object]] = {name: {} for name in FORMATS}
        if "flush" in scenarios:
            for number, name in enumerate(FORMATS):
                flush = await flush_latency(root / f"flush-{number}", baseline, plan, name)
                formats[name]["flush"] = flush
            results["flush"] = formats[DEFAULT_FORMAT]["flush"]
        if "checkpoints" in scenarios:
            results["checkpoints"] = await checkpoints(root / "checkpoints", baseline, plan)
        if "stream" in scenarios:
            for number, name in enumerate(FORMATS):
                formats[name]["stream"] = await stream(
                    root / f"stream-{number}", baseline, plan, name
                )
            results["stream"] = formats[DEFAULT_FORMAT]["stream"]
        if "flush" in scenarios or "stream" in scenarios:
            results["formats"] = formats
        if "policy" in scenarios:
            results["policy"] = await policy_overhead(baseline, plan)
        if "resume" in scenarios:
            results["resume"] = await resume(root / "resume", baseline, plan)
        if "telemetry" in scenarios:
            from .telemetry import telemetry_overhead

            results["telemetry"] = await telemetry_overhead(root / "telemetry", baseline, plan)
        summary: Summary = summarize(baseline.samples)
        results["baseline_us"] = summary.to_json()
    finally:
        baseline.close()
    return results
