"""The checkpoint policy, case by case as the original unit spec pins it (R1-R4, T1-T5, L1, L2).

Each host has a stand-in persistence backend that only makes itself the host's
``session_persistence`` (so the policy is active) and installs no flush listener; tests add a
separate flush listener to observe when flushes start and end relative to the adapter and the
tool body.
"""

from __future__ import annotations

from contextlib import aclosing
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

import anyio
import pytest

from kai_session_checkpoint_policy import (
    AbortController,
    Agent,
    Finish,
    Host,
    LlmRequest,
    PreStep,
    PreStepDecision,
    TextBlock,
    Tool,
    ToolError,
    ToolExecution,
    ToolResult,
    aborted_before_dispatch,
    hookimpl,
    policy,
)

from .support.plugins import FlushListener

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Generator

    from kai_session_checkpoint_policy import JSON, Session, StreamChunk
    from kai_session_checkpoint_policy.hookspecs import ToolThunk
    from kai_session_checkpoint_policy.persistence import StoredLog

pytestmark = pytest.mark.anyio


class StubPersistence:
    """Offers the persistence service and nothing else: no ``session_flush`` implementation."""

    name = "stub-persistence"

    async def load(self, session_id: str) -> StoredLog:
        raise NotImplementedError("not used")

    async def inspect(self, session_id: str) -> StoredLog:
        raise NotImplementedError("not used")

    def session_exists(self, session_id: str) -> bool:
        return False

    @hookimpl
    def host_configure(self, host: Host) -> None:
        host.provide_session_persistence(self)

    @hookimpl
    def host_unconfigure(self, host: Host) -> None:
        host.withdraw_session_persistence(self)


class RecordingAdapter:
    """Records ``adapter`` when its stream body starts, then finishes with ``stop``."""

    def __init__(self, order: list[str]) -> None:
        self.order = order

    async def __call__(self, request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        self.order.append("adapter")
        yield Finish("stop")


@pytest.fixture
def order() -> list[str]:
    return []


@pytest.fixture
async def host(order: list[str]) -> AsyncIterator[Host]:
    async with make_host(order, with_policy=True) as host:
        yield host


def make_host(order: list[str], *, with_policy: bool, inner: tuple[object, ...] = ()) -> Host:
    plugins: list[object] = [StubPersistence(), *inner]
    if with_policy:
        plugins.append(policy)
    host = Host(plugins)
    host.llm.register_adapter("mock", RecordingAdapter(order))

    async def write(execution: ToolExecution) -> JSON:
        order.append("tool")
        return None

    host.tools.register(Tool("write", write))
    return host


def request(session_id: str | None = None) -> LlmRequest:
    return LlmRequest("mock", "mock", messages=(), session_id=session_id)


async def drain(host: Host, session_id: str | None = None) -> list[StreamChunk]:
    async with aclosing(host.llm.stream(request(session_id))) as stream:
        return [chunk async for chunk in stream]


def agent_for(host: Host, session: Session) -> Agent:
    return Agent(host, session, provider="mock", model="mock")


# Request boundary


async def test_r1_awaits_the_live_session_checkpoint_before_building_the_model_stream(
    host: Host, order: list[str]
) -> None:
    session = host.sessions.create("request-checkpoint")
    session.append("turn/start", {"turn": 1})
    gate = anyio.Event()
    host.register(FlushListener("flush", order, gate=gate))
    chunks: list[StreamChunk] = []

    async def consume() -> None:
        chunks.extend(await drain(host, session.id))

    async with anyio.create_task_group() as group:
        group.start_soon(consume)
        await anyio.wait_all_tasks_blocked()
        assert order == ["flush:start"]
        gate.set()

    assert order == ["flush:start", "flush:end", "adapter"]
    assert chunks == [Finish("stop")]


async def test_r2_delegates_a_request_without_a_session_without_checkpointing(
    host: Host, order: list[str]
) -> None:
    listener = FlushListener("flush", order)
    host.register(listener)

    assert await drain(host) == [Finish("stop")]

    assert order == ["adapter"]
    assert listener.sessions == []


async def test_r3_delegates_a_session_id_that_is_not_live_without_checkpointing(
    host: Host, order: list[str]
) -> None:
    listener = FlushListener("flush", order)
    host.register(listener)
    detached = host.sessions.create("was-live")
    host.sessions.detach(detached)

    await drain(host, "detached")
    await drain(host, "was-live")

    assert order == ["adapter", "adapter"]
    assert listener.sessions == []


async def test_r4_does_not_dispatch_the_adapter_when_the_checkpoint_fails(
    host: Host, order: list[str]
) -> None:
    session = host.sessions.create("request-rejected")
    failure = OSError("disk unavailable")
    host.register(FlushListener("flush", order, error=failure))

    with pytest.raises(OSError, match="disk unavailable") as raised:
        await drain(host, session.id)

    assert raised.value is failure
    assert order == ["flush:start", "flush:failed"]  # and no "adapter"


# Tool and step boundaries


async def execute_with_the_checkpoint_held(
    host: Host,
    order: list[str],
    session: Session,
    controller: AbortController | None = None,
) -> ToolResult:
    """Execute a top-level ``write`` call while its checkpoint is held open.

    Once the flush has started and every task is blocked, the order must show only the flush;
    then *controller*, if given, aborts the call, and the flush is let go.
    """
    gate = anyio.Event()
    host.register(FlushListener("flush", order, gate=gate))
    signal = (controller or AbortController()).signal
    execution = ToolExecution("write-1", "write", {}, signal, agent=agent_for(host, session))
    results: list[ToolResult] = []

    async def execute() -> None:
        results.append(await host.tools.execute(execution))

    async with anyio.create_task_group() as group:
        group.start_soon(execute)
        await anyio.wait_all_tasks_blocked()
        assert order == ["flush:start"]
        if controller is not None:
            controller.abort("user")
        gate.set()
    (result,) = results
    return result


async def test_t1_awaits_the_checkpoint_before_a_top_level_tool_body(
    host: Host, order: list[str]
) -> None:
    session = host.sessions.create("tool-checkpoint")

    result = await execute_with_the_checkpoint_held(host, order, session)

    assert result == ToolResult(content=(TextBlock("null"),), is_error=False)
    assert order == ["flush:start", "flush:end", "tool"]


async def test_t2_does_not_dispatch_when_the_call_is_aborted_during_the_checkpoint(
    host: Host, order: list[str]
) -> None:
    session = host.sessions.create("tool-aborted")

    result = await execute_with_the_checkpoint_held(host, order, session, AbortController())

    assert result == aborted_before_dispatch()
    assert order == ["flush:start", "flush:end"]


class InnerToolWrapper:
    """A ``tools_execute`` wrapper registered before the policy, so it runs inside it."""

    name = "inner-tool-wrapper"

    def __init__(self, order: list[str]) -> None:
        self.order = order

    @hookimpl(wrapper=True)
    def tools_execute(self) -> Generator[None, ToolThunk, ToolThunk]:
        downstream = yield

        async def inner() -> ToolResult:
            self.order.append("inner-wrapper")
            return await downstream()

        return inner


async def test_t2_the_aborted_result_does_not_reach_inner_wrappers(order: list[str]) -> None:
    async with make_host(order, with_policy=True, inner=(InnerToolWrapper(order),)) as host:
        session = host.sessions.create("tool-aborted")

        result = await execute_with_the_checkpoint_held(host, order, session, AbortController())

    assert result == aborted_before_dispatch()
    assert order == ["flush:start", "flush:end"]


async def test_t3_turns_a_failed_checkpoint_into_an_error_result_without_running_the_body(
    host: Host, order: list[str]
) -> None:
    session = host.sessions.create("tool-rejected")
    host.register(FlushListener("flush", order, error=OSError("disk unavailable")))
    execution = ToolExecution(
        "write-1", "write", {}, AbortController().signal, agent=agent_for(host, session)
    )

    result = await host.tools.execute(execution)

    assert result.is_error is True
    assert result.content == (TextBlock("Error: disk unavailable"),)
    assert result == ToolResult(
        content=(TextBlock("Error: disk unavailable"),),
        is_error=True,
        error=ToolError("disk unavailable"),
    )
    assert order == ["flush:start", "flush:failed"]  # and no "tool"


async def test_t4_reuses_the_outer_checkpoint_for_a_nested_tool_dispatch(
    host: Host, order: list[str]
) -> None:
    session = host.sessions.create("tool-nested")
    listener = FlushListener("flush", order)
    host.register(listener)
    signal = AbortController().signal
    agent = agent_for(host, session)
    outer = ToolExecution("run-1", "run_code", {}, signal, agent=agent)
    nested = ToolExecution("run-1:code:1", "write", {}, signal, agent=agent, parent=outer)

    result = await host.tools.execute(nested)

    assert result == ToolResult(content=(TextBlock("null"),))
    assert listener.sessions == []
    assert order == ["tool"]


async def test_t5_checkpoints_during_pre_step_processing(host: Host, order: list[str]) -> None:
    session = host.sessions.create("pre-step")
    listener = FlushListener("flush", order)
    host.register(listener)
    step = PreStep(agent_for(host, session), turn=1, step=1, signal=AbortController().signal)

    decision = await host.hooks.agent_pre_step(step)()

    assert decision == PreStepDecision("enter")
    assert listener.sessions == [session.id]
    assert order == ["flush:start", "flush:end"]


# Lifecycle


async def test_l1_unregistering_the_policy_removes_its_wrappers(order: list[str]) -> None:
    async with make_host(order, with_policy=False) as host:
        session = host.sessions.create("disposed-policy")
        listener = FlushListener("flush", [])
        host.register(listener)

        await drain(host, session.id)
        assert listener.sessions == []

        host.register(policy)
        await drain(host, session.id)
        assert listener.sessions == [session.id]

        host.unregister(policy)
        await drain(host, session.id)
        assert listener.sessions == [session.id]
        assert order == ["adapter", "adapter", "adapter"]


def test_l2_keeps_the_entry_point_plugin_shape() -> None:
    assert policy.name == "session-checkpoint-policy"
    assert policy.inject == ("llm", "session_persistence", "sessions", "tools")

    (entry_point,) = entry_points(group="kai", name="session-checkpoint-policy")
    assert entry_point.value == "kai_session_checkpoint_policy.policy"
    assert entry_point.load() is policy

    host = Host([policy])
    callers = host.pm.get_hookcallers(policy) or []
    assert sorted(caller.name for caller in callers) == [
        "agent_pre_step",
        "host_declare_options",
        "host_opened",
        "llm_stream",
        "tools_execute",
    ]
    boundaries = [caller for caller in callers if not caller.name.startswith("host_")]
    for caller in boundaries:
        (impl,) = (impl for impl in caller.get_hookimpls() if impl.plugin is policy)
        assert impl.wrapper is True
        assert impl.hookwrapper is False
