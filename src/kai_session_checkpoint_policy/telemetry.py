"""OpenTelemetry for checkpoints and recoveries: a plugin that the application registers.

Install the ``otel`` extra (the OpenTelemetry API alone), configure an SDK as for any other
instrumented library, and register :class:`CheckpointTelemetry` on the host beside the policy::

    host = Host([CheckpointTelemetry()], options={"jsonl.root": root})

Nothing of this module runs, nor is it imported, unless it is registered: without it the
checkpoint path does what it always does. Registered with the API and no SDK configured, every
span and instrument is OpenTelemetry's no-op (the cost is in ``docs/benchmarks.md``).

Where the figures come from:

* the checkpoint's boundary, session and tool call: two hook wrappers around the policy's, one
  outside (``tryfirst``), which starts the span when the policy's thunk starts its flush, and
  one inside (``trylast``), whose thunk the policy calls only once the flush has returned,
  which ends it;
* what was written: the backend's :attr:`~.persistence.core.WriteBehind.observer` (set to this
  plugin while the host is open), called after each batch in the task that wrote it, so a
  checkpoint counts the batches its own flush wrote;
* leases: the PostgreSQL backend's renewals and losses, through the same observer;
* open sessions: the ``session_attach`` and ``session_detach`` hooks.

Span and attribute names are listed in ``docs/observability.md``; the GenAI semantic
conventions' names are used where they have one (``gen_ai.conversation.id``,
``gen_ai.tool.call.id``, ``gen_ai.tool.name``, ``gen_ai.request.model``), ``error.type`` for
failures, and ``kai.``-prefixed names for the rest.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final, TypeVar

try:
    from opentelemetry import metrics, trace
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "kai_session_checkpoint_policy.telemetry needs the OpenTelemetry API: install the "
        "'otel' extra of kai-session-checkpoint-policy (the package 'opentelemetry-api')"
    ) from exc

import anyio

from .hookspecs import hookimpl
from .persistence.core import WriteBehind
from .policy import session_before_request, session_before_step, session_before_tool

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Generator, Mapping

    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span, TracerProvider
    from opentelemetry.util.types import AttributeValue

    from .contract import (
        HostServices,
        ModelRequestLike,
        PreStepDecision,
        PreStepLike,
        SessionLike,
        StreamChunk,
        ToolCallLike,
    )
    from .hookspecs import PreStepThunk, StreamThunk, ToolThunk
    from .persistence.values import StoredLog
    from .results import ToolResult

__all__ = [
    "CHECKPOINT_SPAN",
    "RECOVERY_SPAN",
    "SCOPE",
    "CheckpointTelemetry",
]

SCOPE: Final = "kai_session_checkpoint_policy"
"""The instrumentation scope: the tracer's and the meter's name."""
CHECKPOINT_SPAN: Final = "kai.checkpoint"
RECOVERY_SPAN: Final = "kai.recovery"

# GenAI semantic conventions, and the general error attribute.
CONVERSATION_ID: Final = "gen_ai.conversation.id"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
TOOL_NAME: Final = "gen_ai.tool.name"
REQUEST_MODEL: Final = "gen_ai.request.model"
ERROR_TYPE: Final = "error.type"
# This package's own.
BOUNDARY: Final = "kai.checkpoint.boundary"
OUTCOME: Final = "kai.checkpoint.outcome"
EVENTS: Final = "kai.checkpoint.events"
BYTES: Final = "kai.checkpoint.bytes"
BACKEND: Final = "kai.persistence.backend"

T = TypeVar("T")

_current: ContextVar[_Checkpoint | None] = ContextVar("kai_checkpoint", default=None)
"""The checkpoint whose flush runs in this context, for the backend's observer calls."""


def _error_type(error: BaseException) -> str:
    kind = type(error)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


class _Checkpoint:
    """One checkpoint in flight: its span, and what its flush wrote."""

    __slots__ = (
        "attributes",
        "boundary",
        "events",
        "open",
        "session_id",
        "size",
        "span",
        "start",
        "units",
    )

    def __init__(self, boundary: str, session_id: str, span: Span) -> None:
        self.boundary = boundary
        self.session_id = session_id
        self.span = span
        self.start = time.perf_counter()
        self.open = True
        self.events = 0
        self.size: int | None = 0
        self.units: dict[str, int] = {}  # durable writes by unit: {"fsyncs": 1}
        self.attributes: dict[str, AttributeValue] = {}


class CheckpointTelemetry:
    """Spans and metrics for every checkpoint, recovery and lease of the host it is registered on.

    :param tracer_provider: Where spans go; by default OpenTelemetry's global provider.
    :param meter_provider: Where measurements go; by default the global provider.
    """

    name: Final = "session-checkpoint-telemetry"

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        version = _version()
        self._tracer = trace.get_tracer(SCOPE, version, tracer_provider)
        meter = metrics.get_meter(SCOPE, version, meter_provider)
        self._duration = meter.create_histogram(
            "kai.checkpoint.duration",
            unit="s",
            description="How long a checkpoint's flush took, by boundary and outcome.",
        )
        self._failures = meter.create_counter(
            "kai.checkpoint.failures",
            unit="{checkpoint}",
            description="Checkpoints that failed closed, by boundary and error type.",
        )
        self._batch_size = meter.create_histogram(
            "kai.persistence.batch.size",
            unit="{event}",
            description="Events per batch written durably, by backend.",
        )
        self._write_failures = meter.create_counter(
            "kai.persistence.write.failures",
            unit="{batch}",
            description="Batch writes that failed (and stayed queued), by backend and error type.",
        )
        self._renewals = meter.create_counter(
            "kai.persistence.lease.renewals",
            unit="{lease}",
            description="Session leases renewed (PostgreSQL).",
        )
        self._losses = meter.create_counter(
            "kai.persistence.lease.losses",
            unit="{lease}",
            description="Session leases found taken over by another host (PostgreSQL).",
        )
        self._open_sessions = meter.create_up_down_counter(
            "kai.sessions.open",
            unit="{session}",
            description="Sessions live on the hosts this plugin is registered on.",
        )
        self._recovery_duration = meter.create_histogram(
            "kai.recovery.duration",
            unit="s",
            description="How long loading a stored session with recovery took.",
        )
        self._cancelled = anyio.get_cancelled_exc_class
        self._observed: dict[int, WriteBehind[Any]] = {}  # by host: the backend it observes

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"

    # -- the host and its backend -----------------------------------------------------------

    def _observe(self, host: HostServices[Any]) -> None:
        backend = host.session_persistence
        if isinstance(backend, WriteBehind) and backend.observer is None:
            backend.observer = self
            self._observed[id(host)] = backend

    @hookimpl
    def host_configure(self, host: HostServices[Any]) -> None:
        self._observe(host)  # registered on an open host: its backend is there already

    @hookimpl
    def host_opened(self, host: HostServices[Any]) -> None:
        self._observe(host)

    @hookimpl
    def host_unconfigure(self, host: HostServices[Any]) -> None:
        backend = self._observed.pop(id(host), None)
        if backend is not None and backend.observer is self:
            backend.observer = None

    @hookimpl
    def session_attach(self, session: SessionLike) -> None:
        self._open_sessions.add(1)

    @hookimpl
    def session_detach(self, session: SessionLike) -> None:
        self._open_sessions.add(-1)

    # -- checkpoints --------------------------------------------------------------------------

    def _begin(
        self, boundary: str, session: SessionLike, attributes: Mapping[str, AttributeValue]
    ) -> _Checkpoint:
        session_id = session.id
        span = self._tracer.start_span(
            CHECKPOINT_SPAN,
            attributes={BOUNDARY: boundary, CONVERSATION_ID: session_id, **attributes},
        )
        return _Checkpoint(boundary, session_id, span)

    def _end(self, record: _Checkpoint, outcome: str, error: BaseException | None = None) -> None:
        if not record.open:
            return
        record.open = False
        seconds = time.perf_counter() - record.start
        span, attributes = record.span, record.attributes
        attributes[EVENTS] = record.events
        if record.size is not None and record.units:
            attributes[BYTES] = record.size
        for unit, count in record.units.items():
            attributes[f"kai.checkpoint.{unit}"] = count
        attributes[OUTCOME] = outcome
        measured: dict[str, AttributeValue] = {BOUNDARY: record.boundary, OUTCOME: outcome}
        if error is not None and outcome == "failed":
            kind = _error_type(error)
            attributes[ERROR_TYPE] = kind
            span.record_exception(error)
            span.set_status(trace.StatusCode.ERROR, str(error))
            self._failures.add(1, {BOUNDARY: record.boundary, ERROR_TYPE: kind})
        span.set_attributes(attributes)
        span.end()
        self._duration.record(seconds, measured)

    def _settle(self, record: _Checkpoint, error: BaseException) -> None:
        self._end(record, "cancelled" if isinstance(error, self._cancelled()) else "failed", error)

    def _gate(self, downstream: Callable[[], T]) -> Callable[[], T]:
        """The innermost wrapper's thunk: the policy calls it once its flush has returned, so
        it ends the checkpoint's span (the adapter's or tool's work is not part of it)."""

        def passed() -> T:
            record = _current.get()
            if record is not None:
                self._end(record, "durable")
            return downstream()

        return passed

    @hookimpl(wrapper=True, tryfirst=True, specname="llm_stream")
    def checkpoint_request(
        self, request: ModelRequestLike, host: HostServices[Any]
    ) -> Generator[None, StreamThunk, StreamThunk]:
        downstream = yield
        session = session_before_request(request, host)
        if session is None:
            return downstream
        live: SessionLike = session
        model = getattr(request, "model", None)
        attributes = {REQUEST_MODEL: model} if isinstance(model, str) else {}

        async def observed() -> AsyncGenerator[StreamChunk, None]:
            record = self._begin("request", live, attributes)
            stream = downstream()
            try:
                token = _current.set(record)
                try:
                    first = await stream.__anext__()
                except StopAsyncIteration:
                    self._end(record, "durable")
                    return
                except BaseException as error:
                    self._settle(record, error)
                    raise
                finally:
                    _current.reset(token)
                self._end(record, "durable")
                yield first
                async for chunk in stream:
                    yield chunk
            finally:
                await stream.aclose()

        return observed

    @hookimpl(wrapper=True, trylast=True, specname="llm_stream")
    def checkpointed_request(
        self, request: ModelRequestLike, host: HostServices[Any]
    ) -> Generator[None, StreamThunk, StreamThunk]:
        downstream = yield
        return self._gate(downstream)

    @hookimpl(wrapper=True, tryfirst=True, specname="tools_execute")
    def checkpoint_tool(
        self, execution: ToolCallLike[Any], host: HostServices[Any]
    ) -> Generator[None, ToolThunk, ToolThunk]:
        downstream = yield
        session = session_before_tool(execution, host)
        if session is None:
            return downstream
        live: SessionLike = session
        attributes: dict[str, AttributeValue] = {}
        for attribute, name in ((TOOL_CALL_ID, "call_id"), (TOOL_NAME, "name")):
            value = getattr(execution, name, None)
            if isinstance(value, str):
                attributes[attribute] = value

        async def observed() -> ToolResult:
            record = self._begin("tool", live, attributes)
            token = _current.set(record)
            try:
                result = await downstream()
            except BaseException as error:
                self._settle(record, error)
                raise
            finally:
                _current.reset(token)
            self._end(record, "aborted")  # if the body was not dispatched after the flush
            return result

        return observed

    @hookimpl(wrapper=True, trylast=True, specname="tools_execute")
    def checkpointed_tool(
        self, execution: ToolCallLike[Any], host: HostServices[Any]
    ) -> Generator[None, ToolThunk, ToolThunk]:
        downstream = yield
        return self._gate(downstream)

    @hookimpl(wrapper=True, tryfirst=True, specname="agent_pre_step")
    def checkpoint_step(
        self, step: PreStepLike[Any], host: HostServices[Any]
    ) -> Generator[None, PreStepThunk, PreStepThunk]:
        downstream = yield
        session = session_before_step(step, host)
        if session is None:
            return downstream
        live: SessionLike = session
        attributes: dict[str, AttributeValue] = {}
        for attribute, name in (("kai.agent.turn", "turn"), ("kai.agent.step", "step")):
            value = getattr(step, name, None)
            if isinstance(value, int):
                attributes[attribute] = value

        async def observed() -> PreStepDecision:
            record = self._begin("step", live, attributes)
            token = _current.set(record)
            try:
                return await downstream()
            except BaseException as error:
                self._settle(record, error)
                raise
            finally:
                _current.reset(token)

        return observed

    @hookimpl(wrapper=True, trylast=True, specname="agent_pre_step")
    def checkpointed_step(
        self, step: PreStepLike[Any], host: HostServices[Any]
    ) -> Generator[None, PreStepThunk, PreStepThunk]:
        downstream = yield
        return self._gate(downstream)

    # -- the backend's observer ---------------------------------------------------------------

    def batch_written(
        self,
        backend: object,
        session_id: str,
        events: int,
        size: int | None,
        seconds: float,
        error: Exception | None,
    ) -> None:
        name = str(getattr(backend, "name", type(backend).__name__))
        if error is not None:
            self._write_failures.add(1, {BACKEND: name, ERROR_TYPE: _error_type(error)})
            return
        self._batch_size.record(events, {BACKEND: name})
        record = _current.get()
        if record is None or not record.open or record.session_id != session_id:
            return
        record.events += events
        record.attributes[BACKEND] = name
        unit = str(getattr(backend, "durable_unit", "batches"))
        record.units[unit] = record.units.get(unit, 0) + 1
        record.size = None if size is None or record.size is None else record.size + size

    def recovered(
        self,
        backend: object,
        session_id: str,
        stored: StoredLog | None,
        started_ns: int,
        error: Exception | None,
    ) -> None:
        name = str(getattr(backend, "name", type(backend).__name__))
        attributes: dict[str, AttributeValue] = {CONVERSATION_ID: session_id, BACKEND: name}
        if stored is not None:
            attributes["kai.recovery.events"] = len(stored.events)
            attributes["kai.recovery.repair"] = len(stored.repair)
            attributes["kai.recovery.torn_bytes"] = stored.torn_bytes
        span = self._tracer.start_span(RECOVERY_SPAN, attributes=attributes, start_time=started_ns)
        outcome = "recovered"
        if error is not None:
            outcome = "failed"
            span.set_attribute(ERROR_TYPE, _error_type(error))
            span.record_exception(error)
            span.set_status(trace.StatusCode.ERROR, str(error))
        span.set_attribute("kai.recovery.outcome", outcome)
        ended = time.time_ns()
        span.end(end_time=ended)
        self._recovery_duration.record(
            (ended - started_ns) / 1e9, {BACKEND: name, "kai.recovery.outcome": outcome}
        )

    def leases_renewed(self, backend: object, count: int) -> None:
        self._renewals.add(count, {BACKEND: str(getattr(backend, "name", ""))})

    def lease_lost(self, backend: object, session_id: str) -> None:
        self._losses.add(1, {BACKEND: str(getattr(backend, "name", ""))})


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kai-session-checkpoint-policy")
    except PackageNotFoundError:  # pragma: no cover - a source tree that is not installed
        return "0"
