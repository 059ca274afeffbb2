"""Scenario 8: what the OpenTelemetry plugin costs the checkpoint path.

The same two-step turn (five checkpoints, one tool call) on the JSONL backend, on hosts side by
side: without the plugin (as without the ``otel`` extra: nothing of it is imported), with it
and the OpenTelemetry API alone (no SDK configured, so every span and instrument is a no-op),
and, for scale, with an SDK that records every span and measurement in memory. Turns of the
hosts alternate, so that all of them meet the same machine. The figure is the process's CPU
time (user and system, worker threads included) per agent step.
"""

from __future__ import annotations

import importlib.util
import time
from typing import TYPE_CHECKING

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
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence

from ._support import summarize

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable
    from pathlib import Path

    from kai_session_checkpoint_policy import JSON, StreamChunk

    from ._support import Baseline
    from .scenarios import Plan

__all__ = ["telemetry_overhead"]

STEPS_PER_TURN = 2


async def _model(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
    """Step 1 asks for one tool call; once its result is the last message, step 2 answers."""
    last = request.messages[-1] if request.messages else {}
    source = last.get("source")
    if isinstance(source, dict) and source.get("kind") == "tool":
        yield TextDelta("It is 42.")
        yield Finish("stop")
        return
    for chunk in tool_call_block(0, "call-1", "lookup", '{"query": "answer"}'):
        yield chunk
    yield Finish("tool-calls")


async def _lookup(execution: ToolExecution) -> JSON:
    return {"answer": 42}


def _host(root: Path, *plugins: object) -> Host:
    root.mkdir(parents=True)
    host = Host([JsonlSessionPersistence(root), policy, *plugins], autoload=False)
    host.llm.register_adapter("bench", _model)
    host.tools.register(Tool("lookup", _lookup))
    return host


def _plugins(spans: list[Callable[[], int]]) -> dict[str, tuple[object, ...]]:
    """The hosts' plugins beside the backend and the policy, by the name of their figure; with
    an SDK, a way to count the spans it kept is appended to *spans*."""
    from kai_session_checkpoint_policy.telemetry import CheckpointTelemetry

    hosts: dict[str, tuple[object, ...]] = {
        "without": (),
        "api_only": (CheckpointTelemetry(),),  # the global providers: no SDK configured
    }
    if importlib.util.find_spec("opentelemetry.sdk") is not None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        spans.append(lambda: len(exporter.get_finished_spans()))
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
        hosts["sdk_in_memory"] = (
            CheckpointTelemetry(tracer_provider=tracer_provider, meter_provider=meter_provider),
        )
    return hosts


async def _turn(host: Host) -> int:
    """One turn on a new session; the CPU time it took, in nanoseconds."""
    session = host.sessions.create()
    agent = Agent(host, session, provider="bench", model="scripted")
    start = time.process_time_ns()
    outcome = await agent.run_turn("What is the answer?")
    spent = time.process_time_ns() - start
    await host.sessions.close(session)
    if outcome.reason != {"kind": "completed"}:
        raise RuntimeError(f"the benchmark turn did not complete: {outcome.reason}")
    return spent


async def telemetry_overhead(root: Path, baseline: Baseline, plan: Plan) -> dict[str, object]:
    """CPU per step without the plugin, with it on the API alone, and with an in-memory SDK."""
    if importlib.util.find_spec("opentelemetry") is None:
        return {"skipped": "the OpenTelemetry API is not installed (the 'otel' extra)"}
    spans: list[Callable[[], int]] = []
    hosts = {name: _host(root / name, *plugins) for name, plugins in _plugins(spans).items()}
    spent: dict[str, list[int]] = {name: [] for name in hosts}
    for host in hosts.values():
        await host.__aenter__()
    try:
        for host in hosts.values():  # one turn each to warm up, not counted
            await _turn(host)
        for _ in range(plan.rounds):
            baseline.sample(plan.per_round)  # the raw write and fsync, as every scenario
            for _ in range(plan.policy_turns):
                for name, host in hosts.items():
                    spent[name].append(await _turn(host))
    finally:
        for host in reversed(hosts.values()):
            await host.__aexit__(None, None, None)
    per_step = {
        name: summarize([sample / STEPS_PER_TURN for sample in samples])
        for name, samples in spent.items()
    }
    without = per_step["without"]
    figures: dict[str, object] = {
        "turns": len(spent["without"]),
        "steps_per_turn": STEPS_PER_TURN,
        "checkpoints_per_turn": 5,
    }
    for count in spans:  # the warm-up turn's spans too
        figures["sdk_spans_per_turn"] = count() / (len(spent["sdk_in_memory"]) + 1)
    for name, summary in per_step.items():
        figures[f"cpu_per_step_{name}_us"] = summary.to_json()
        if name != "without":
            figures[f"{name}_ratio"] = round(summary.median / without.median, 3)
            figures[f"{name}_mean_ratio"] = round(summary.mean / without.mean, 3)
    return figures
