"""OpenTelemetry: the spans and metrics of checkpoints, recoveries and leases, read back from the
SDK's in-memory span exporter and metric reader; and nothing of it when it is not registered."""

from __future__ import annotations

import runpy
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the telemetry tests need the OpenTelemetry SDK")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from kai_session_checkpoint_policy import Host, TurnOutcome, policy
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence
from kai_session_checkpoint_policy.telemetry import CheckpointTelemetry

from .support.paying import paying_host
from .support.persistence_helpers import FailingFiles

pytestmark = pytest.mark.anyio

JSONL = "session-persistence-jsonl"
POSTGRES = "session-persistence-postgres"
LEASE_LOST = "kai_session_checkpoint_policy.persistence.errors.LeaseLostError"


class Telemetry:
    """A plugin whose spans and measurements go to in-memory SDK objects, and ways to read them."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.plugin = CheckpointTelemetry(
            tracer_provider=tracer_provider, meter_provider=self.meter_provider
        )

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def checkpoints(self) -> list[dict[str, Any]]:
        """The attributes of each checkpoint span, in the order they ended."""
        return [attributes_of(span) for span in self.spans() if span.name == "kai.checkpoint"]

    def points(self, name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
        """The data points of metric *name*, by their attributes: a sum's value, or a
        histogram's (count, sum)."""
        data = self.reader.get_metrics_data()
        found: dict[tuple[tuple[str, Any], ...], Any] = {}
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        key = tuple(sorted((point.attributes or {}).items()))
                        if isinstance(point, HistogramDataPoint):
                            found[key] = (point.count, point.sum)
                        else:
                            assert isinstance(point, NumberDataPoint)
                            found[key] = point.value
        return found


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    made = Telemetry()
    yield made
    made.meter_provider.shutdown()


def attributes_of(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def key(**attributes: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((name.replace("__", "."), value) for name, value in attributes.items()))


def log_size(root: Path) -> int:
    (log,) = [path for path in root.rglob("session.jsonl*") if path.is_file()]
    return log.stat().st_size


async def test_a_turn_with_a_tool_call_has_a_span_per_checkpoint_and_their_metrics(
    tmp_path: Path, telemetry: Telemetry
) -> None:
    backend = JsonlSessionPersistence(tmp_path)
    async with paying_host([backend, policy, telemetry.plugin], lambda: None) as paying:
        session = paying.host.sessions.create("s-1")
        outcome = await paying.turn(session)
        durable = backend.durable_count("s-1")
        written = log_size(tmp_path)
        open_before = telemetry.points("kai.sessions.open")
        batches = telemetry.points("kai.persistence.batch.size")
        await paying.host.sessions.close(session)
        open_after = telemetry.points("kai.sessions.open")
    assert outcome.reason == {"kind": "completed"}
    assert paying.bodies == ["pay-1"]

    spans = telemetry.spans()
    assert [span.name for span in spans] == ["kai.checkpoint"] * 5
    assert all(span.status.status_code is StatusCode.UNSET for span in spans)
    checkpoints = telemetry.checkpoints()
    sizes = [attributes.pop("kai.checkpoint.bytes") for attributes in checkpoints]
    common = {
        "gen_ai.conversation.id": "s-1",
        "kai.persistence.backend": JSONL,
        "kai.checkpoint.fsyncs": 1,
        "kai.checkpoint.outcome": "durable",
    }
    assert checkpoints == [
        # step 1, before its request; the events of the turn's start
        {**common, "kai.checkpoint.boundary": "step", "kai.agent.turn": 1, "kai.agent.step": 1}
        | {"kai.checkpoint.events": 1},
        {**common, "kai.checkpoint.boundary": "request", "gen_ai.request.model": "m"}
        | {"kai.checkpoint.events": 4},
        # the model asked for pay-1: its call is durable before the body runs
        {**common, "kai.checkpoint.boundary": "tool"}
        | {"gen_ai.tool.call.id": "pay-1", "gen_ai.tool.name": "pay"}
        | {"kai.checkpoint.events": 6},
        {**common, "kai.checkpoint.boundary": "step", "kai.agent.turn": 1, "kai.agent.step": 2}
        | {"kai.checkpoint.events": 2},
        {**common, "kai.checkpoint.boundary": "request", "gen_ai.request.model": "m"}
        | {"kai.checkpoint.events": 1},
    ]
    assert sum(checkpoint["kai.checkpoint.events"] for checkpoint in checkpoints) == durable
    # The bytes each checkpoint's flush added to the log (the first one its header too).
    assert all(size > 0 for size in sizes)
    assert sum(sizes) == written

    durations = telemetry.points("kai.checkpoint.duration")
    assert {attributes: point[0] for attributes, point in durations.items()} == {
        key(kai__checkpoint__boundary="step", kai__checkpoint__outcome="durable"): 2,
        key(kai__checkpoint__boundary="request", kai__checkpoint__outcome="durable"): 2,
        key(kai__checkpoint__boundary="tool", kai__checkpoint__outcome="durable"): 1,
    }
    assert all(0 < total < 5 for _count, total in durations.values())
    assert batches == {key(kai__persistence__backend=JSONL): (5, durable)}
    assert telemetry.points("kai.checkpoint.failures") == {}
    assert open_before == {(): 1}
    assert open_after == {(): 0}


async def test_a_failed_flush_is_a_failed_span_and_a_failure_of_its_kind(
    tmp_path: Path, telemetry: Telemetry
) -> None:
    files = FailingFiles()
    backend = JsonlSessionPersistence(tmp_path, files=files)

    def break_the_disk() -> None:
        files.fail["fsync"] = 1

    async with paying_host([backend, policy, telemetry.plugin], break_the_disk) as paying:
        session = paying.host.sessions.create("s-2")
        await paying.turn(session)
    assert paying.bodies == []  # fail-closed: the tool body never ran

    tool = [
        span
        for span in telemetry.spans()
        if attributes_of(span)["kai.checkpoint.boundary"] == "tool"
    ]
    assert len(tool) == 1
    assert tool[0].status.status_code is StatusCode.ERROR
    assert tool[0].status.description == "[Errno 5] injected fsync failure"
    assert [event.name for event in tool[0].events] == ["exception"]
    assert attributes_of(tool[0]) == {
        "kai.checkpoint.boundary": "tool",
        "gen_ai.conversation.id": "s-2",
        "gen_ai.tool.call.id": "pay-1",
        "gen_ai.tool.name": "pay",
        "kai.checkpoint.events": 0,  # its batch failed, and went back to the queue
        "kai.checkpoint.outcome": "failed",
        "error.type": "OSError",
    }
    outcomes = [checkpoint["kai.checkpoint.outcome"] for checkpoint in telemetry.checkpoints()]
    assert outcomes == ["durable", "durable", "failed", "durable", "durable"]
    assert telemetry.points("kai.checkpoint.failures") == {
        key(kai__checkpoint__boundary="tool", error__type="OSError"): 1
    }
    assert telemetry.points("kai.persistence.write.failures") == {
        key(kai__persistence__backend=JSONL, error__type="OSError"): 1
    }
    durations = telemetry.points("kai.checkpoint.duration")
    assert (
        durations[key(kai__checkpoint__boundary="tool", kai__checkpoint__outcome="failed")][0] == 1
    )


async def test_a_recovery_is_a_span_with_its_repair(tmp_path: Path, telemetry: Telemetry) -> None:
    async with Host([JsonlSessionPersistence(tmp_path)]) as host:
        session = host.sessions.create("s-3")
        session.append("turn/start", {"turn": 1})
        session.append("step/start", {"turn": 1, "step": 1})
        await host.sessions.flush(session)  # and the host goes, the turn open
    before = time.time_ns()
    async with Host([JsonlSessionPersistence(tmp_path), telemetry.plugin]) as host:
        resumed = await host.sessions.resume("s-3")
    (span,) = telemetry.spans()
    assert span.name == "kai.recovery"
    assert attributes_of(span) == {
        "gen_ai.conversation.id": "s-3",
        "kai.persistence.backend": JSONL,
        "kai.recovery.events": len(resumed.events),
        "kai.recovery.repair": 2,  # step/end and turn/end
        "kai.recovery.torn_bytes": 0,
        "kai.recovery.outcome": "recovered",
    }
    assert [item.type for item in resumed.events[-2:]] == ["step/end", "turn/end"]
    assert span.start_time is not None
    assert span.end_time is not None
    assert before <= span.start_time <= span.end_time <= time.time_ns()
    ((attributes, (count, _total)),) = telemetry.points("kai.recovery.duration").items()
    assert (attributes, count) == (
        key(kai__persistence__backend=JSONL, kai__recovery__outcome="recovered"),
        1,
    )


async def test_a_lost_lease_is_counted_and_fails_the_next_checkpoint(
    postgres_dsn: str, telemetry: Telemetry
) -> None:
    pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg")
    import psycopg

    from kai_session_checkpoint_policy.persistence import (
        LeaseLostError,
        PostgresSessionPersistence,
    )

    backend = PostgresSessionPersistence(
        postgres_dsn, owner="host-a", lease_ttl=0.6, batch_window=60, pool_timeout=2.0
    )
    lost = key(kai__persistence__backend=POSTGRES)

    def renewals() -> int:
        return int(telemetry.points("kai.persistence.lease.renewals").get(lost, 0))

    class Heard:
        """The telemetry's place as the backend's observer: passes every call on to it, then
        marks that the backend did something, which wakes a test waiting :meth:`until` a state
        (a marker, where a test would otherwise poll)."""

        def __init__(self, observer: Any) -> None:
            self.observer = observer
            self._marks = 0
            self._marked = threading.Condition()

        def __getattr__(self, name: str) -> Callable[..., None]:
            heard = getattr(self.observer, name)

            def mark(*args: Any) -> None:
                heard(*args)
                with self._marked:  # the backend calls from its task or a worker thread
                    self._marks += 1
                    self._marked.notify_all()

            return mark

        async def until(self, condition: Callable[[], bool], what: str) -> None:
            """Wait (at most 10 s) until *condition* holds, checked again after each call."""
            deadline = time.monotonic() + 10
            while True:
                with self._marked:
                    seen = self._marks
                if condition():  # checked on the loop's thread, after the call that marked
                    return

                def marked(seen: int = seen) -> bool:
                    left = deadline - time.monotonic()
                    with self._marked:
                        return self._marked.wait_for(lambda: self._marks > seen, max(left, 0))

                assert await anyio.to_thread.run_sync(marked), f"never reached: {what}"

    outcomes: list[TurnOutcome] = []

    async def lose_the_lease_and_run_a_turn() -> None:
        async with paying_host([backend, policy, telemetry.plugin], lambda: None) as paying:
            heard = Heard(backend.observer)
            backend.observer = heard
            until = heard.until
            session = paying.host.sessions.create("leased")
            session.append("turn/start", {"turn": 1})
            await paying.host.sessions.flush(session)
            await until(lambda: renewals() >= 1, "a renewal")
            with psycopg.connect(postgres_dsn, autocommit=True) as admin:
                # Another host takes the session over.
                admin.execute(
                    "UPDATE kai_sessions.leases SET owner = 'host-b', epoch = 2, "
                    "expires_at = clock_timestamp() + interval '1 minute'"
                )
            await until(lambda: backend.statistics().leases == 0, "the loss noticed")
            backend.observer = heard.observer  # the telemetry's own again, which it lets go
            assert telemetry.points("kai.persistence.lease.losses") == {lost: 1}
            outcomes.append(await paying.turn(session))
            bodies.extend(paying.bodies)

    bodies: list[str] = []
    try:
        # Closing fails too: the events of the failed turn can be written no more.
        with pytest.raises(LeaseLostError):
            await lose_the_lease_and_run_a_turn()
    finally:
        backend.store.close()
    (outcome,) = outcomes
    assert outcome.reason["kind"] == "error"
    assert bodies == []
    assert telemetry.points("kai.persistence.lease.losses") == {lost: 1}
    checkpoints = telemetry.checkpoints()
    assert checkpoints == [
        {
            "kai.checkpoint.boundary": "step",
            "gen_ai.conversation.id": "leased",
            "kai.agent.turn": 2,
            "kai.agent.step": 1,
            "kai.checkpoint.events": 0,
            "kai.checkpoint.outcome": "failed",
            "error.type": LEASE_LOST,
        }
    ]
    assert telemetry.points("kai.checkpoint.failures") == {
        key(kai__checkpoint__boundary="step", error__type=LEASE_LOST): 1
    }


def test_without_the_plugin_nothing_of_opentelemetry_is_imported_or_called(
    tmp_path: Path,
) -> None:
    script = textwrap.dedent(
        f"""
        import sys, anyio
        from kai_session_checkpoint_policy import Host, TurnOutcome, policy
        from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence

        async def main():
            backend = JsonlSessionPersistence({str(tmp_path)!r})
            async with Host([backend, policy], autoload=False) as host:
                session = host.sessions.create("plain")
                session.append("turn/start", {{"turn": 1}})
                await host.sessions.flush(session)
                assert backend.observer is None
            loaded = sorted(
                name for name in sys.modules
                if name.startswith("opentelemetry") or name.endswith(".telemetry")
            )
            print(loaded)

        anyio.run(main)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert run.stdout == "[]\n"


def test_the_example_on_the_observability_page_prints_what_the_page_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = Path(__file__).resolve().parent.parent / "docs"
    main = runpy.run_path(str(docs / "examples" / "telemetry.py"))["main"]
    anyio.run(main, str(tmp_path), InMemorySpanExporter())
    page = (docs / "observability.md").read_text()
    (shown,) = [block.split("```")[0] for block in page.split("```text\n")[1:]]
    assert capsys.readouterr().out == shown


async def test_the_backend_is_observed_only_while_the_plugin_is_registered(
    tmp_path: Path, telemetry: Telemetry
) -> None:
    backend = JsonlSessionPersistence(tmp_path)
    async with Host([backend, policy], autoload=False) as host:
        observers = [backend.observer]
        host.register(telemetry.plugin)  # on an open host: configured at once
        observers.append(backend.observer)
        host.unregister(telemetry.plugin)
        observers.append(backend.observer)
        assert observers == [None, telemetry.plugin, None]
        session = host.sessions.create("unobserved")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
    assert telemetry.spans() == []
    assert telemetry.points("kai.persistence.batch.size") == {}
