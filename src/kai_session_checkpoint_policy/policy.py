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
service named in :data:`inject`; a host that opens without them is told so (a warning, or an
error with the host option ``checkpoint.require_persistence``).

The policy reads only what :mod:`~kai_session_checkpoint_policy.contract` declares, so any host
that implements the contract can load it.
"""

from __future__ import annotations

import os
import sys
import warnings
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, Final, TypeVar

import pluggy

from .cancellation import checkpoint_if_cancelled
from .hookspecs import hookimpl
from .results import aborted_before_dispatch

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Generator, Mapping

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

__all__ = [
    "REQUIRE_OPTION",
    "NoPersistenceError",
    "NoPersistenceWarning",
    "inject",
    "name",
    "session_before_request",
    "session_before_step",
    "session_before_tool",
]

name: Final = "session-checkpoint-policy"
inject: Final = ("llm", "session_persistence", "sessions", "tools")
REQUIRE_OPTION: Final = "checkpoint.require_persistence"
"""Host option: when true, opening a host without the services the policy needs is an error."""

S = TypeVar("S", bound="SessionLike")


class NoPersistenceWarning(UserWarning):
    """The policy is loaded on a host that cannot make anything durable: it does nothing."""


class NoPersistenceError(RuntimeError):
    """As :class:`NoPersistenceWarning`, on a host that asked for durability to be required."""


def _missing(host: HostServices[Any]) -> list[str]:
    return [service for service in inject if getattr(host, service, None) is None]


def _application_level() -> int:
    """The ``stacklevel`` of the application's line that opened the host (``async with
    Host(...)``): the first caller outside this package and pluggy."""
    inside = (os.path.dirname(__file__) + os.sep, os.path.dirname(pluggy.__file__) + os.sep)
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


@hookimpl
def host_declare_options() -> Mapping[str, str]:
    return {REQUIRE_OPTION: "refuse to open a host whose checkpoints cannot make anything durable"}


@hookimpl
def host_opened(host: HostServices[Any]) -> None:
    missing = _missing(host)
    if not missing:
        return
    problem = (
        f"the {name} plugin is loaded, but the host offers no {' and no '.join(missing)}: "
        "its checkpoints will make nothing durable, and a crash can lose what a tool did"
    )
    options: Mapping[str, object] = getattr(host, "options", None) or {}
    if options.get(REQUIRE_OPTION):
        raise NoPersistenceError(f"{problem} (host option {REQUIRE_OPTION!r} is set)")
    warnings.warn(
        f"{problem}; load a persistence backend (with the host option 'jsonl.root', for the "
        f"JSONL one), or set the host option {REQUIRE_OPTION!r} to make this an error",
        NoPersistenceWarning,
        stacklevel=_application_level(),
    )


def session_before_request(request: ModelRequestLike, host: HostServices[S]) -> S | None:
    """The session the policy makes durable before *request* reaches the model, if any: the
    live session the request names."""
    if _missing(host) or request.session_id is None:
        return None
    return host.sessions.get(request.session_id)


def session_before_tool(execution: ToolCallLike[S], host: HostServices[S]) -> S | None:
    """The session the policy makes durable before the body of *execution* runs, if any: its
    agent's, unless the call is nested in another."""
    agent = execution.agent
    if _missing(host) or agent is None or execution.parent is not None:
        return None
    return agent.session


def session_before_step(step: PreStepLike[S], host: HostServices[S]) -> S | None:
    """The session the policy makes durable before *step* starts, if any: its agent's."""
    return None if _missing(host) else step.agent.session


@hookimpl(wrapper=True)
def llm_stream(
    request: ModelRequestLike, host: HostServices[S]
) -> Generator[None, StreamThunk, StreamThunk]:
    downstream = yield
    session = session_before_request(request, host)
    if session is None:
        return downstream
    live: S = session

    async def checkpointed() -> AsyncGenerator[StreamChunk, None]:
        await host.sessions.flush(live)
        await checkpoint_if_cancelled()
        async with aclosing(downstream()) as stream:
            async for chunk in stream:
                yield chunk

    return checkpointed


@hookimpl(wrapper=True)
def tools_execute(
    execution: ToolCallLike[S], host: HostServices[S]
) -> Generator[None, ToolThunk, ToolThunk]:
    downstream = yield
    session = session_before_tool(execution, host)
    if session is None:
        return downstream
    live: S = session

    async def checkpointed() -> ToolResult:
        await host.sessions.flush(live)
        await checkpoint_if_cancelled()
        if execution.signal.aborted:
            return aborted_before_dispatch()
        return await downstream()

    return checkpointed


@hookimpl(wrapper=True)
def agent_pre_step(
    step: PreStepLike[S], host: HostServices[S]
) -> Generator[None, PreStepThunk, PreStepThunk]:
    downstream = yield
    session = session_before_step(step, host)
    if session is None:
        return downstream
    live: S = session

    async def checkpointed() -> PreStepDecision:
        await host.sessions.flush(live)
        await checkpoint_if_cancelled()
        return await downstream()

    return checkpointed
