"""A conformance kit: the checkpoint policy's behaviour, checked against a host of your own.

Subclass :class:`HostConformance` in a test module and override the ``kai_host_factory``
fixture with a factory of your host; pytest then runs every case of the policy's specification
against it, on each event loop your ``anyio_backend`` fixture names::

    from kai_session_checkpoint_policy.conformance import HostConformance

    class TestMyHost(HostConformance):
        @pytest.fixture
        def kai_host_factory(self) -> HostFactory:
            return my_host_under_test

The factory receives the plugins the kit needs (a recording persistence backend, the policy,
and the innermost implementations of the three boundaries, which record when they run) and
opens a host with exactly those, as an async context manager yielding a
:class:`HostUnderTest`: the host itself, and the host's own objects for a session, a model
request, a tool call and a step. The kit then calls the boundary hooks through the host's
plugin manager, as the host's own runtimes do, and checks the order of what happens.

What it checks: the request, tool and step checkpoints run before the adapter, the tool body
or the step; a request without a live session, a direct call and a nested call are not
checkpointed; a failed checkpoint keeps the adapter and the body from running; a call aborted,
or cancelled, during its checkpoint is not dispatched; unregistering the policy removes all
three wrappers; other wrappers compose around and inside the policy's.

Without an override, ``kai_host_factory`` opens the package's reference host, which passes.
"""

from __future__ import annotations

from contextlib import asynccontextmanager, suppress
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import anyio
import pytest

from .hookspecs import hookimpl
from .pytest_plugin import FlushRecorder, Gate

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Sequence
    from contextlib import AbstractAsyncContextManager

    import pluggy

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
    from .results import ToolResult

__all__ = ["Boundaries", "HostConformance", "HostFactory", "HostUnderTest"]


class HostUnderTest(Protocol):
    """An open host, and how the kit gets the host's own objects."""

    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        """The host's plugin manager, with the ``kai`` hookspecs."""
        ...

    @property
    def host(self) -> HostServices[Any]:
        """What the host passes to every hook as ``host``."""
        ...

    def live_session(self, session_id: str) -> SessionLike:
        """A new live session of the host."""
        ...

    def model_request(self, session_id: str | None) -> ModelRequestLike:
        """A model request of the host for the session *session_id* (or for none)."""
        ...

    def tool_call(
        self, session: SessionLike | None, parent: ToolCallLike[Any] | None = None
    ) -> tuple[ToolCallLike[Any], Callable[[], None]]:
        """A tool call the model made in *session* (``None``: a direct call), and how to abort it.

        *parent*, when given, is the call whose body dispatches this one.
        """
        ...

    def pre_step(self, session: SessionLike) -> PreStepLike[Any]:
        """The next step of an agent of *session*."""
        ...

    def unregister(self, plugin: object) -> None:
        """Unregister *plugin* from the open host."""
        ...


HostFactory: TypeAlias = "Callable[[Sequence[object]], AbstractAsyncContextManager[HostUnderTest]]"
"""Opens a host with exactly the given plugins (besides its own innermost implementations)."""


class Boundaries:
    """The innermost implementations of the three boundaries: each records when it runs."""

    name = "kai-conformance-boundaries"

    def __init__(self, order: list[str]) -> None:
        self.order = order

    @hookimpl
    def llm_stream(self) -> StreamThunk:
        return self._stream

    async def _stream(self) -> AsyncGenerator[StreamChunk, None]:
        from .contract import Finish

        self.order.append("adapter")
        yield Finish("stop")

    @hookimpl
    def tools_execute(self) -> ToolThunk:
        return self._tool

    async def _tool(self) -> ToolResult:
        from .results import TextBlock, ToolResult

        self.order.append("tool body")
        return ToolResult((TextBlock("done"),))

    @hookimpl
    def agent_pre_step(self) -> PreStepThunk:
        return self._enter

    async def _enter(self) -> PreStepDecision:
        from .contract import PreStepDecision

        self.order.append("step")
        return PreStepDecision()


class _Recording:
    """Records *label* when one of its wrappers' thunks starts."""

    def __init__(self, label: str, order: list[str]) -> None:
        self.name = f"kai-conformance-{label}"
        self.label = label
        self.order = order

    def _wrap_stream(self, downstream: StreamThunk) -> StreamThunk:
        async def stream() -> AsyncGenerator[StreamChunk, None]:
            self.order.append(self.label)
            async for chunk in downstream():
                yield chunk

        return stream

    def _wrap(self, downstream: Callable[[], Any]) -> Callable[[], Any]:
        async def run() -> Any:
            self.order.append(self.label)
            return await downstream()

        return run


class _Outer(_Recording):
    """Wrappers that run before the policy's (``tryfirst``)."""

    @hookimpl(wrapper=True, tryfirst=True)
    def llm_stream(self) -> Generator[None, StreamThunk, StreamThunk]:
        return self._wrap_stream((yield))

    @hookimpl(wrapper=True, tryfirst=True)
    def tools_execute(self) -> Generator[None, ToolThunk, ToolThunk]:
        return self._wrap((yield))


class _Inner(_Recording):
    """Wrappers that run inside the policy's (``trylast``)."""

    @hookimpl(wrapper=True, trylast=True)
    def llm_stream(self) -> Generator[None, StreamThunk, StreamThunk]:
        return self._wrap_stream((yield))

    @hookimpl(wrapper=True, trylast=True)
    def tools_execute(self) -> Generator[None, ToolThunk, ToolThunk]:
        return self._wrap((yield))


@asynccontextmanager
async def reference_host(plugins: Sequence[object]) -> AsyncIterator[HostUnderTest]:
    """A :data:`HostFactory` for this package's reference host."""
    from .host import AbortController, Agent, Host, PreStep, ToolExecution

    async with Host(plugins, autoload=False) as host:

        class Reference:
            plugin_manager = host.pm
            unregister = staticmethod(host.unregister)

            def __init__(self) -> None:
                self.host = host

            def live_session(self, session_id: str) -> SessionLike:
                return host.sessions.create(session_id)

            def model_request(self, session_id: str | None) -> ModelRequestLike:
                from .contract import LlmRequest

                return LlmRequest("conformance", "model", session_id=session_id)

            def tool_call(
                self, session: SessionLike | None, parent: ToolCallLike[Any] | None = None
            ) -> tuple[ToolCallLike[Any], Callable[[], None]]:
                controller = AbortController()
                agent = None if session is None else self._agent(session)
                outer = parent if isinstance(parent, ToolExecution) else None
                execution = ToolExecution("call", "tool", {}, controller.signal, agent, outer)
                return execution, controller.abort

            def pre_step(self, session: SessionLike) -> PreStepLike[Any]:
                return PreStep(self._agent(session), 1, 1, AbortController().signal)

            def _agent(self, session: SessionLike) -> Agent:
                live = host.sessions.get(session.id)
                assert live is not None, f"session {session.id!r} is not live"
                return Agent(host, live, provider="conformance", model="model")

        yield Reference()


class HostConformance:
    """The policy's specification, run against the host of the ``kai_host_factory`` fixture."""

    CHECKPOINT = ("flush:start", "flush:end")

    @pytest.fixture
    def kai_host_factory(self) -> Any:
        """Override with a factory of your host (see :data:`HostFactory`)."""
        return reference_host

    @pytest.fixture
    def kai_conformance_order(self) -> list[str]:
        return []

    @pytest.fixture
    def kai_conformance_recorder(self, kai_conformance_order: list[str]) -> FlushRecorder:
        return FlushRecorder(kai_conformance_order)

    @pytest.fixture
    async def kai_conformance_host(
        self,
        anyio_backend: object,
        kai_host_factory: Any,
        kai_conformance_order: list[str],
        kai_conformance_recorder: FlushRecorder,
    ) -> AsyncIterator[HostUnderTest]:
        from . import policy

        plugins = [kai_conformance_recorder.plugin, policy, Boundaries(kai_conformance_order)]
        async with kai_host_factory(plugins) as under_test:
            yield under_test

    # -- the request boundary ----------------------------------------------------------------

    @pytest.mark.anyio
    async def test_the_request_is_durable_before_the_adapter_runs(
        self, kai_conformance_host: HostUnderTest, kai_conformance_order: list[str]
    ) -> None:
        under_test = kai_conformance_host
        under_test.live_session("conformance")
        await _drain(under_test, under_test.model_request("conformance"))
        assert kai_conformance_order == [*self.CHECKPOINT, "adapter"]

    @pytest.mark.anyio
    async def test_a_request_without_a_live_session_is_not_checkpointed(
        self, kai_conformance_host: HostUnderTest, kai_conformance_order: list[str]
    ) -> None:
        await _drain(kai_conformance_host, kai_conformance_host.model_request(None))
        await _drain(kai_conformance_host, kai_conformance_host.model_request("not-live"))
        assert kai_conformance_order == ["adapter", "adapter"]

    @pytest.mark.anyio
    async def test_a_failed_request_checkpoint_keeps_the_adapter_from_running(
        self,
        kai_conformance_host: HostUnderTest,
        kai_conformance_order: list[str],
        kai_conformance_recorder: FlushRecorder,
    ) -> None:
        kai_conformance_host.live_session("conformance")
        kai_conformance_recorder.fail_with(OSError(28, "No space left on device"))
        request = kai_conformance_host.model_request("conformance")
        with pytest.raises(OSError, match="No space left on device"):
            await _drain(kai_conformance_host, request)
        assert kai_conformance_order == ["flush:start", "flush:failed"]

    # -- the tool boundary -------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_the_tool_call_is_durable_before_the_body_runs(
        self, kai_conformance_host: HostUnderTest, kai_conformance_order: list[str]
    ) -> None:
        session = kai_conformance_host.live_session("conformance")
        call, _abort = kai_conformance_host.tool_call(session)
        await _execute(kai_conformance_host, call)
        assert kai_conformance_order == [*self.CHECKPOINT, "tool body"]

    @pytest.mark.anyio
    async def test_direct_and_nested_calls_are_not_checkpointed(
        self, kai_conformance_host: HostUnderTest, kai_conformance_order: list[str]
    ) -> None:
        session = kai_conformance_host.live_session("conformance")
        direct, _abort = kai_conformance_host.tool_call(None)
        await _execute(kai_conformance_host, direct)
        outer, _abort = kai_conformance_host.tool_call(session)
        nested, _abort = kai_conformance_host.tool_call(session, parent=outer)
        await _execute(kai_conformance_host, nested)
        assert kai_conformance_order == ["tool body", "tool body"]

    @pytest.mark.anyio
    async def test_a_call_aborted_during_its_checkpoint_is_not_dispatched(
        self,
        kai_conformance_host: HostUnderTest,
        kai_conformance_order: list[str],
        kai_conformance_recorder: FlushRecorder,
    ) -> None:
        from .results import ABORTED_BEFORE_DISPATCH

        session = kai_conformance_host.live_session("conformance")
        call, abort = kai_conformance_host.tool_call(session)
        gate = kai_conformance_recorder.hold()
        async with anyio.create_task_group() as group:
            outcome: list[ToolResult] = []
            group.start_soon(_collect, outcome, partial(_execute, kai_conformance_host, call))
            await anyio.wait_all_tasks_blocked()
            abort()
            gate.release()
        (result,) = outcome
        assert result.error is not None
        assert result.error.info is not None
        assert result.error.info.code == ABORTED_BEFORE_DISPATCH
        assert kai_conformance_order == list(self.CHECKPOINT)

    @pytest.mark.anyio
    async def test_a_call_cancelled_during_its_checkpoint_is_not_dispatched(
        self,
        kai_conformance_host: HostUnderTest,
        kai_conformance_order: list[str],
        kai_conformance_recorder: FlushRecorder,
    ) -> None:
        session = kai_conformance_host.live_session("conformance")
        call, _abort = kai_conformance_host.tool_call(session)
        gate: Gate = kai_conformance_recorder.hold()
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(_execute, kai_conformance_host, call)
                await anyio.wait_all_tasks_blocked()
                scope.cancel()
                gate.release()
        assert scope.cancelled_caught
        assert "tool body" not in kai_conformance_order

    @pytest.mark.anyio
    async def test_a_failed_tool_checkpoint_keeps_the_body_from_running(
        self,
        kai_conformance_host: HostUnderTest,
        kai_conformance_order: list[str],
        kai_conformance_recorder: FlushRecorder,
    ) -> None:
        session = kai_conformance_host.live_session("conformance")
        call, _abort = kai_conformance_host.tool_call(session)
        kai_conformance_recorder.fail_with(OSError(5, "Input/output error"))
        with pytest.raises(OSError, match="Input/output error"):
            await _execute(kai_conformance_host, call)
        assert kai_conformance_order == ["flush:start", "flush:failed"]

    # -- the step boundary -------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_the_previous_step_is_durable_before_the_next_starts(
        self,
        kai_conformance_host: HostUnderTest,
        kai_conformance_order: list[str],
        kai_conformance_recorder: FlushRecorder,
    ) -> None:
        session = kai_conformance_host.live_session("conformance")
        await _pre_step(kai_conformance_host, kai_conformance_host.pre_step(session))
        kai_conformance_recorder.fail_with(OSError(5, "Input/output error"))
        with pytest.raises(OSError, match="Input/output error"):
            await _pre_step(kai_conformance_host, kai_conformance_host.pre_step(session))
        assert kai_conformance_order == [*self.CHECKPOINT, "step", "flush:start", "flush:failed"]

    # -- plugins -----------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_unregistering_the_policy_removes_all_three_checkpoints(
        self, kai_conformance_host: HostUnderTest, kai_conformance_order: list[str]
    ) -> None:
        from . import policy

        under_test = kai_conformance_host
        session = under_test.live_session("conformance")
        under_test.unregister(policy)
        await _drain(under_test, under_test.model_request("conformance"))
        call, _abort = under_test.tool_call(session)
        await _execute(under_test, call)
        await _pre_step(under_test, under_test.pre_step(session))
        assert kai_conformance_order == ["adapter", "tool body", "step"]

    @pytest.mark.anyio
    async def test_other_wrappers_compose_around_and_inside_the_checkpoint(
        self, kai_conformance_host: HostUnderTest, kai_conformance_order: list[str]
    ) -> None:
        under_test = kai_conformance_host
        manager = under_test.plugin_manager
        outer, inner = (
            _Outer("outer", kai_conformance_order),
            _Inner("inner", kai_conformance_order),
        )
        for wrapper in (outer, inner):
            manager.register(wrapper, name=wrapper.name)
        session = under_test.live_session("conformance")
        try:
            await _drain(under_test, under_test.model_request("conformance"))
            call, _abort = under_test.tool_call(session)
            await _execute(under_test, call)
        finally:
            for wrapper in (outer, inner):
                with suppress(ValueError):
                    manager.unregister(wrapper)
        each = ["outer", *self.CHECKPOINT, "inner"]
        assert kai_conformance_order == [*each, "adapter", *each, "tool body"]


async def _drain(under_test: HostUnderTest, request: ModelRequestLike) -> None:
    thunk = under_test.plugin_manager.hook.llm_stream(request=request, host=under_test.host)
    async for _chunk in thunk():
        pass


async def _execute(under_test: HostUnderTest, call: ToolCallLike[Any]) -> ToolResult:
    thunk = under_test.plugin_manager.hook.tools_execute(execution=call, host=under_test.host)
    result: ToolResult = await thunk()
    return result


async def _pre_step(under_test: HostUnderTest, step: PreStepLike[Any]) -> PreStepDecision:
    thunk = under_test.plugin_manager.hook.agent_pre_step(step=step, host=under_test.host)
    decision: PreStepDecision = await thunk()
    return decision


async def _collect(outcome: list[ToolResult], run: Callable[[], Any]) -> None:
    outcome.append(await run())
