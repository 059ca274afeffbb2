"""What pluggy adds around the policy: wrapper nesting, the two layers of errors, lifecycle.

Later registration (or ``tryfirst``) makes a wrapper outer; the policy flushes inside its own
thunk, so a wrapper registered before it runs only after the checkpoint is durable.
"""

from __future__ import annotations

import gc
import warnings
from contextlib import aclosing
from functools import partial
from typing import TYPE_CHECKING, Final, Literal

import anyio
import pytest

from kai_session_checkpoint_policy import (
    AbortController,
    Agent,
    Finish,
    Host,
    LlmRequest,
    NoPersistenceWarning,
    PreStep,
    TextBlock,
    Tool,
    ToolError,
    ToolExecution,
    ToolResult,
    hookimpl,
    policy,
)
from kai_session_checkpoint_policy.host import UnknownProviderError

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Generator

    from kai_session_checkpoint_policy import JSON, Session, StreamChunk
    from kai_session_checkpoint_policy.hookspecs import FlushThunk, StreamThunk, ToolThunk
    from kai_session_checkpoint_policy.pytest_plugin import FlushRecorder, RecordingAdapter

pytestmark = pytest.mark.anyio


class OuterGuard:
    """An ``llm_stream`` wrapper meant to run outside the policy."""

    name = "outer-guard"

    def __init__(self, order: list[str]) -> None:
        self.order = order

    @hookimpl(wrapper=True)
    def llm_stream(self) -> Generator[None, StreamThunk, StreamThunk]:
        self.order.append("outer:build")
        downstream = yield
        self.order.append("outer:wrap")

        async def guarded() -> AsyncGenerator[StreamChunk, None]:
            self.order.append("outer:run")
            async with aclosing(downstream()) as stream:
                async for chunk in stream:
                    yield chunk

        return guarded


class FirstGuard(OuterGuard):
    """The same guard, made outer by ``tryfirst`` instead of by registering it last."""

    name = "first-guard"

    @hookimpl(wrapper=True, tryfirst=True)
    def llm_stream(self) -> Generator[None, StreamThunk, StreamThunk]:
        return (yield from super().llm_stream())


class InnerWrapper:
    """``llm_stream`` and ``tools_execute`` wrappers meant to run inside the policy.

    ``build_error`` is raised while the thunk is built, ``run_error`` while it runs.
    """

    name = "inner-wrapper"

    def __init__(
        self,
        order: list[str],
        *,
        build_error: Exception | None = None,
        run_error: Exception | None = None,
    ) -> None:
        self.order = order
        self.build_error = build_error
        self.run_error = run_error

    def _build(self) -> None:
        self.order.append("inner:build")
        if self.build_error is not None:
            raise self.build_error

    def _run(self) -> None:
        self.order.append("inner:run")
        if self.run_error is not None:
            raise self.run_error

    @hookimpl(wrapper=True)
    def llm_stream(self) -> Generator[None, StreamThunk, StreamThunk]:
        self._build()
        downstream = yield
        self.order.append("inner:wrap")

        async def inner() -> AsyncGenerator[StreamChunk, None]:
            self._run()
            async with aclosing(downstream()) as stream:
                async for chunk in stream:
                    yield chunk

        return inner

    @hookimpl(wrapper=True)
    def tools_execute(self) -> Generator[None, ToolThunk, ToolThunk]:
        self._build()
        downstream = yield
        self.order.append("inner:wrap")

        async def inner() -> ToolResult:
            self._run()
            return await downstream()

        return inner


class FlushCounter:
    """A ``session_flush`` listener that is not a persistence backend."""

    name = "flush-counter"

    def __init__(self) -> None:
        self.sessions: list[str] = []

    @hookimpl
    def session_flush(self, session: Session) -> FlushThunk:
        return partial(self._flush, session)

    async def _flush(self, session: Session) -> None:
        self.sessions.append(session.id)


def make_host(recorder: FlushRecorder | None, adapter: RecordingAdapter, *plugins: object) -> Host:
    """A host with *recorder* as its backend (if any), then *plugins*, and a ``write`` tool."""
    backend = () if recorder is None else (recorder.plugin,)
    host = Host([*backend, *plugins])
    host.llm.register_adapter("mock", adapter)

    async def write(execution: ToolExecution) -> JSON:
        adapter.order.append("tool")
        return None

    host.tools.register(Tool("write", write))
    return host


async def drain(host: Host, session: Session, provider: str = "mock") -> list[StreamChunk]:
    request = LlmRequest(provider, "mock", session_id=session.id)
    async with aclosing(host.llm.stream(request)) as stream:
        return [chunk async for chunk in stream]


def top_level_call(host: Host, session: Session) -> ToolExecution:
    agent = Agent(host, session, provider="mock", model="mock")
    return ToolExecution("write-1", "write", {}, AbortController().signal, agent=agent)


@pytest.mark.parametrize("outermost", ["registered-last", "tryfirst"])
async def test_wrappers_nest_around_the_policy_in_build_and_run_order(
    outermost: str,
    kai_order: list[str],
    kai_flush_recorder: FlushRecorder,
    kai_recording_adapter: RecordingAdapter,
) -> None:
    inner = InnerWrapper(kai_order)
    if outermost == "registered-last":
        plugins: tuple[object, ...] = (inner, policy, OuterGuard(kai_order))
    else:
        plugins = (FirstGuard(kai_order), inner, policy)
    async with make_host(kai_flush_recorder, kai_recording_adapter, *plugins) as host:
        session = host.sessions.create("composed")

        thunk = host.hooks.llm_stream(LlmRequest("mock", "mock", session_id=session.id))
        assert kai_order == ["outer:build", "inner:build", "inner:wrap", "outer:wrap"]

        async with aclosing(thunk()) as stream:
            chunks = [chunk async for chunk in stream]

    assert chunks == [Finish("stop")]
    assert kai_order == [
        "outer:build",
        "inner:build",
        "inner:wrap",
        "outer:wrap",
        "outer:run",
        "flush:start",
        "flush:end",
        "inner:run",
        "adapter",
    ]


ORDER_AFTER_INNER_ERROR: Final = {
    "build": ["inner:build"],  # before the policy's wrapper runs: no flush
    "run": ["inner:build", "inner:wrap", "flush:start", "flush:end", "inner:run"],
}
"""What happens before the inner wrapper fails while building its thunk, or running it."""


def inner_wrapper_failing(
    order: list[str], stage: Literal["build", "run"], failure: Exception
) -> InnerWrapper:
    if stage == "build":
        return InnerWrapper(order, build_error=failure)
    return InnerWrapper(order, run_error=failure)


@pytest.mark.parametrize("stage", ["build", "run"])
async def test_a_stream_error_of_an_inner_wrapper_reaches_the_caller(
    stage: Literal["build", "run"],
    kai_order: list[str],
    kai_flush_recorder: FlushRecorder,
    kai_recording_adapter: RecordingAdapter,
) -> None:
    failure = RuntimeError(f"inner {stage} broke")
    inner = inner_wrapper_failing(kai_order, stage, failure)
    async with make_host(kai_flush_recorder, kai_recording_adapter, inner, policy) as host:
        session = host.sessions.create(f"{stage}-error")

        with pytest.raises(RuntimeError, match=rf"^inner {stage} broke$") as raised:
            await drain(host, session)

    assert raised.value is failure
    assert kai_order == ORDER_AFTER_INNER_ERROR[stage]
    assert kai_flush_recorder.flushes == ([] if stage == "build" else ["run-error"])


@pytest.mark.parametrize("stage", ["build", "run"])
async def test_a_tool_error_of_an_inner_wrapper_becomes_an_error_result(
    stage: Literal["build", "run"],
    kai_order: list[str],
    kai_flush_recorder: FlushRecorder,
    kai_recording_adapter: RecordingAdapter,
) -> None:
    inner = inner_wrapper_failing(kai_order, stage, RuntimeError(f"inner {stage} broke"))
    async with make_host(kai_flush_recorder, kai_recording_adapter, inner, policy) as host:
        session = host.sessions.create(f"tool-{stage}-error")

        result = await host.tools.execute(top_level_call(host, session))

    assert result == ToolResult(
        content=(TextBlock(f"Error: inner {stage} broke"),),
        is_error=True,
        error=ToolError(f"inner {stage} broke"),
    )
    assert kai_order == ORDER_AFTER_INNER_ERROR[stage]
    assert kai_flush_recorder.flushes == ([] if stage == "build" else ["tool-run-error"])


async def test_an_unknown_provider_is_a_build_error_of_the_innermost_plugin(
    kai_flush_recorder: FlushRecorder, kai_recording_adapter: RecordingAdapter
) -> None:
    async with make_host(kai_flush_recorder, kai_recording_adapter, policy) as host:
        session = host.sessions.create("unknown-provider")

        with pytest.raises(UnknownProviderError, match=r"^no model adapter for provider 'nope'$"):
            await drain(host, session, provider="nope")

    assert kai_flush_recorder.flushes == []


async def test_thunks_that_are_never_called_leave_no_warning_and_no_flush(
    kai_flush_recorder: FlushRecorder, kai_recording_adapter: RecordingAdapter
) -> None:
    async with make_host(kai_flush_recorder, kai_recording_adapter, policy) as host:
        session = host.sessions.create("never-called")
        agent = Agent(host, session, provider="mock", model="mock")
        signal = AbortController().signal
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            host.hooks.llm_stream(LlmRequest("mock", "mock", session_id=session.id))
            host.hooks.llm_stream(LlmRequest("mock", "mock", session_id=session.id))()
            host.hooks.tools_execute(top_level_call(host, session))
            host.hooks.agent_pre_step(PreStep(agent, turn=1, step=1, signal=signal))
            gc.collect()
            await anyio.lowlevel.checkpoint()
            gc.collect()

    assert [str(warning.message) for warning in caught] == []
    assert kai_flush_recorder.flushes == []
    assert kai_recording_adapter.order == []


async def test_unregistering_the_policy_removes_all_three_wrappers(
    kai_flush_recorder: FlushRecorder, kai_recording_adapter: RecordingAdapter
) -> None:
    async with make_host(kai_flush_recorder, kai_recording_adapter, policy) as host:
        session = host.sessions.create("unregistered")
        agent = Agent(host, session, provider="mock", model="mock")
        step = PreStep(agent, turn=1, step=1, signal=AbortController().signal)

        async def cross_every_boundary() -> None:
            await drain(host, session)
            await host.tools.execute(top_level_call(host, session))
            await host.hooks.agent_pre_step(step)()

        await cross_every_boundary()
        assert kai_flush_recorder.flushes == ["unregistered"] * 3

        host.unregister(policy)
        assert host.pm.get_hookcallers(policy) is None
        await cross_every_boundary()

    assert kai_flush_recorder.flushes == ["unregistered"] * 3
    assert kai_recording_adapter.order == [
        *("flush:start", "flush:end", "adapter"),
        *("flush:start", "flush:end", "tool"),
        *("flush:start", "flush:end"),
        *("adapter", "tool"),
    ]


async def test_a_host_without_a_persistence_backend_never_checkpoints(
    kai_recording_adapter: RecordingAdapter,
) -> None:
    counter = FlushCounter()
    with pytest.warns(NoPersistenceWarning, match="offers no session_persistence"):  # noqa: PT031
        async with make_host(None, kai_recording_adapter, counter, policy) as host:
            assert host.session_persistence is None
            session = host.sessions.create("no-backend")
            agent = Agent(host, session, provider="mock", model="mock")

            await drain(host, session)
            await host.tools.execute(top_level_call(host, session))
            await host.hooks.agent_pre_step(PreStep(agent, 1, 1, AbortController().signal))()
            assert counter.sessions == []

            assert await host.sessions.flush(session) is True
            assert counter.sessions == ["no-backend"]
    assert kai_recording_adapter.order == ["adapter", "tool"]
