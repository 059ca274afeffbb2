"""The checkpoint policy: make the session log durable where losing it makes recovery unsafe.

Three boundaries, each a hook wrapper that flushes the session before the downstream thunk runs:

* ``llm_stream``: before a model adapter receives a request, so the request is on disk;
* ``tools_execute``: before a top-level tool body may cause a side effect, so its ``tool/call``
  is on disk; if the call was aborted while flushing, the body is not dispatched;
* ``agent_pre_step``: before each step, so the previous response and its tool results are on
  disk before the next request is derived from them.

A failed flush is fail-closed: the adapter or tool body never runs. A flush is also a cancel
point: a caller cancelled while it waited never reaches the adapter or the tool body, whatever
the host's flush does. The policy is stateless and does nothing unless the host offers every
service named in :data:`inject`.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import TYPE_CHECKING, Final

from .cancellation import checkpoint_if_cancelled
from .hookspecs import hookimpl
from .results import aborted_before_dispatch

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Generator

    from .hookspecs import HostServices, PreStepThunk, StreamThunk, ToolThunk
    from .host.agent import PreStep, PreStepDecision
    from .host.llm import LlmRequest, StreamChunk
    from .host.tools import ToolExecution
    from .results import ToolResult

name: Final = "session-checkpoint-policy"
inject: Final = ("llm", "session_persistence", "sessions", "tools")


def _active(host: HostServices) -> bool:
    return all(getattr(host, service, None) is not None for service in inject)


@hookimpl(wrapper=True)
def llm_stream(
    request: LlmRequest, host: HostServices
) -> Generator[None, StreamThunk, StreamThunk]:
    downstream = yield
    if not _active(host) or request.session_id is None:
        return downstream
    session = host.sessions.get(request.session_id)
    if session is None:
        return downstream

    async def checkpointed() -> AsyncGenerator[StreamChunk, None]:
        await host.sessions.flush(session)
        await checkpoint_if_cancelled()
        async with aclosing(downstream()) as stream:
            async for chunk in stream:
                yield chunk

    return checkpointed


@hookimpl(wrapper=True)
def tools_execute(
    execution: ToolExecution, host: HostServices
) -> Generator[None, ToolThunk, ToolThunk]:
    downstream = yield
    agent = execution.agent
    if not _active(host) or agent is None or execution.parent is not None:
        return downstream

    async def checkpointed() -> ToolResult:
        await host.sessions.flush(agent.session)
        await checkpoint_if_cancelled()
        if execution.signal.aborted:
            return aborted_before_dispatch()
        return await downstream()

    return checkpointed


@hookimpl(wrapper=True)
def agent_pre_step(
    step: PreStep, host: HostServices
) -> Generator[None, PreStepThunk, PreStepThunk]:
    downstream = yield
    if not _active(host):
        return downstream

    async def checkpointed() -> PreStepDecision:
        await host.sessions.flush(step.agent.session)
        await checkpoint_if_cancelled()
        return await downstream()

    return checkpointed
