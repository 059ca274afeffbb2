"""The tool runtime: registered tools, run through the ``tools_execute`` hook chain."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, TypeAlias

from ..contract import ToolSpec
from ..effects import WORST_EFFECT, effect_class, effect_from_annotations
from ..hookspecs import hookimpl
from ..results import (
    ABORTED,
    UNKNOWN_TOOL,
    ErrorInfo,
    TextBlock,
    ToolResult,
    aborted_before_dispatch,
    error_result,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from ..effects import EffectClass
    from ..events import JSON, JSONObject
    from ..hookspecs import ToolThunk
    from ._hooks import HostHooks
    from .agent import Agent
    from .signals import AbortSignal

__all__ = ["Tool", "ToolBody", "ToolExecution", "ToolRuntime", "error_message"]

ToolBody: TypeAlias = "Callable[[ToolExecution], Awaitable[JSON | ToolResult]]"


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the model may call.

    ``run`` receives the execution and returns a JSON value (shown to the model as text) or a
    complete :class:`ToolResult`. A tool is ``concurrency_safe`` when several calls of it may
    run at the same time as other safe calls. ``parameters`` is the JSON Schema of its
    arguments, as a model is told it (default: any object).

    ``effect`` is the effect class its author declares (``"read-only"``, ``"idempotent"``,
    ``"side-effecting"``, ``"open-world"``; see :mod:`~kai_session_checkpoint_policy.effects`).
    ``annotations`` are MCP-style hints a tool from elsewhere came with (``readOnlyHint``...):
    they count only if the host registers the tool with ``trust_annotations=True``, and a
    declared ``effect`` comes first. A tool with neither runs under the worst case,
    ``"open-world"``.

    :raises ValueError: if ``effect`` is not a class, or a hint is not a boolean.
    """

    name: str
    run: ToolBody
    description: str = ""
    concurrency_safe: bool = False
    parameters: JSONObject = field(default_factory=lambda: {"type": "object"}, hash=False)
    effect: EffectClass | None = None
    annotations: Mapping[str, object] | None = field(default=None, hash=False, compare=False)
    needs_approval: bool = False
    """Whether each call waits for a person's yes before its body runs (see ``approvals``)."""

    def __post_init__(self) -> None:
        if self.effect is not None:
            effect_class(self.effect)
        if self.annotations is not None:
            effect_from_annotations(self.annotations, trusted=False)

    def resolved_effect(self, *, trust_annotations: bool = False) -> EffectClass:
        """The class its calls run under: declared, else from its annotations if they are
        trusted, else the worst case."""
        if self.effect is not None:
            return self.effect
        if self.annotations is not None:
            return effect_from_annotations(self.annotations, trusted=trust_annotations)
        return WORST_EFFECT

    @property
    def spec(self) -> ToolSpec:
        """What a model is told of this tool, with the class its author declared."""
        return ToolSpec(self.name, self.description, self.parameters, self.effect)


class _Progress:
    """How far a call got; the one mutable part of an execution."""

    __slots__ = ("body_started",)

    def __init__(self) -> None:
        self.body_started = False


@dataclass(frozen=True, slots=True)
class ToolExecution:
    """One tool call on its way to a tool body.

    ``agent`` is the agent the call runs for (``None`` for a direct call) and ``parent`` the
    enclosing execution of a nested dispatch (``None`` for a call the model made).

    ``effect`` is the effect class the call runs under, and ``idempotency_key`` the key the
    body should hand to whatever deduplicates its effect (an ``Idempotency-Key`` header): the
    agent derives it from the session and the call the model first made, so a retry that
    names the key of an earlier call runs with that same key. ``None`` for a read-only call
    and a direct one.
    """

    call_id: str
    name: str
    arguments: JSON
    signal: AbortSignal
    agent: Agent | None = None
    parent: ToolExecution | None = None
    effect: EffectClass = WORST_EFFECT
    idempotency_key: str | None = None
    _progress: _Progress = field(default_factory=_Progress, init=False, repr=False, compare=False)

    @property
    def body_started(self) -> bool:
        """Whether the tool body was entered: from then on, its effect may have happened."""
        return self._progress.body_started


def error_message(exc: BaseException) -> str:
    """The text an error result shows for *exc*: its message, or its type when it has none."""
    try:
        return str(exc) or type(exc).__name__
    except Exception:
        return "<unprintable exception>"


class ToolRuntime:
    """Registered tools, and the pipeline every call goes through."""

    name = "kai-host-tools"

    def __init__(self, hooks: HostHooks) -> None:
        self._hooks = hooks
        self._tools: dict[str, Tool] = {}
        self._effects: dict[str, EffectClass] = {}

    def register(self, tool: Tool, *, trust_annotations: bool = False) -> None:
        """Register *tool*; its MCP-style annotations count only if *trust_annotations*.

        A host trusts the annotations of tools from a source it vouches for (its own MCP
        server); a server it does not control could claim a payment is read-only.

        :raises ValueError: if a tool with this name is already registered.
        """
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        self._effects[tool.name] = tool.resolved_effect(trust_annotations=trust_annotations)

    def effect_of(self, name: str) -> EffectClass:
        """The class calls of the tool *name* run under: the worst case for an unknown tool."""
        return self._effects.get(name, WORST_EFFECT)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def specs(self) -> tuple[ToolSpec, ...]:
        """What a model is told of each registered tool, in the order of :meth:`names`.

        Each spec carries the class the tool's calls run under.
        """
        return tuple(
            ToolSpec(tool.name, tool.description, tool.parameters, self._effects[tool.name])
            for tool in self._tools.values()
        )

    async def execute(self, execution: ToolExecution) -> ToolResult:
        """Run one call through the ``tools_execute`` chain and return its result.

        A call whose signal is already aborted is not dispatched. Any exception that a wrapper
        or the body raises becomes an error result; anyio cancellation propagates.
        """
        if execution.signal.aborted:
            return aborted_before_dispatch()
        try:
            return await self._hooks.tools_execute(execution)()
        except Exception as exc:
            return error_result(error_message(exc))

    @hookimpl(trylast=True)
    def tools_execute(self, execution: ToolExecution) -> ToolThunk:
        return partial(self._dispatch, execution)

    async def _dispatch(self, execution: ToolExecution) -> ToolResult:
        if execution.signal.aborted:
            return aborted_before_dispatch()
        tool = self._tools.get(execution.name)
        if tool is None:
            return error_result(
                f"unknown tool {execution.name!r}", ErrorInfo("UnknownToolError", UNKNOWN_TOOL)
            )
        return await _run_body(tool, execution)


async def _run_body(tool: Tool, execution: ToolExecution) -> ToolResult:
    execution._progress.body_started = True
    value = await tool.run(execution)
    if execution.signal.aborted:
        return error_result("tool call aborted", ErrorInfo("AbortError", ABORTED))
    if isinstance(value, ToolResult):
        return value
    return ToolResult(content=(TextBlock(value if isinstance(value, str) else json.dumps(value)),))
