"""Pydantic AI: record an agent's runs in a session log, with the policy's three checkpoints.

:func:`open_session` opens a store (a directory, or a ``postgresql://`` URL), recovers the
session if the store holds it, and yields a :class:`PydanticAISession`: pass its
``capability`` to the agent and its ``message_history`` to each run::

    async with open_session("sessions", "invoice-42") as session:
        agent = Agent(model, capabilities=[session.capability])
        result = await agent.run("Pay invoice 42", message_history=session.message_history)

The integration is a host of the contract (:mod:`~kai_session_checkpoint_policy.contract`):
it opens the reference host's plugin manager and session store with the persistence backend,
the checkpoint policy and its invariant companion, and maps Pydantic AI's moments onto the
three boundary hooks, so that the policy's own wrappers decide when the log is made durable:

* each model request is a step: ``agent_pre_step`` runs before its ``step/start`` (the previous
  step's results become durable), then ``llm_stream`` before the model is called (the request's
  events become durable);
* each function tool call appends its ``tool/call``, then runs through ``tools_execute``: the
  call is durable before the tool body runs.

A checkpoint that fails raises, and what it guarded (the model, the tool body) never runs.

Every message of a run is recorded in the events the reference agent writes: ``turn/start``,
``step/start``, ``user/message``, ``request/header`` and ``request/context`` (once per opened
session), ``assistant/message`` (text, reasoning and tool-call blocks), ``tool/call``,
``tool/result``, ``step/end``, ``turn/end``. Every tool call the model asked for ends with one
``tool/result`` (but a call a run deferred, which waits for the run that answers it), so
``message_history`` never ends with a call left to run by accident: after a crash, a call
that started answers ``TOOL_OUTCOME_UNKNOWN`` (its effect may have happened), one that provably
never started ``TOOL_NOT_STARTED``, and Pydantic AI runs neither again. The model decides.

Tools that need a person's approval (``requires_approval=True``, Pydantic AI's deferred tools)
are asked about durably. A run that ends with :class:`~pydantic_ai.tools.DeferredToolRequests`
appends an ``approval/asked`` for each call awaiting approval, leaves the call unanswered in the
log (it is still to run or not), and makes both durable before the run returns, so before anyone
is asked. The run that carries the answers (``deferred_tool_results``) appends the
``approval/decided`` of a yes and makes it durable before the ``tool/call`` is appended and the
body runs; a no is recorded (``"rejected"``) with the denial Pydantic AI gives the model. After a
crash, :meth:`PydanticAISession.pending_approvals` gives the questions nobody answered, as
Pydantic AI's requests, to ask again (never taken as a yes), and
:meth:`PydanticAISession.standing_approvals` the answers given and not yet acted on, to pass to
the next run without asking twice.

A retry may name the key of the call it repeats: a tool that declares a parameter
``idempotency_key`` receives it from the model, and when it is the key of an earlier call of the
same tool in the session, :func:`current_idempotency_key` returns it (and ``tool/call`` records
it) instead of a new one. A key the session never gave that tool is sent back to the model as a
retry prompt, and the body does not run.

Runs of one session go one at a time. Pydantic AI runs on asyncio; so does this integration
(Pydantic AI does not run under trio).
"""

from __future__ import annotations

import json
import os
from contextlib import aclosing, asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, cast

from pydantic_ai import CallToolsNode, ModelRequestNode
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ModelRetry
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    RetryFeedbackPart,
    RetryPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturn,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults
from pydantic_graph import End

from .. import eventdata, invariant, policy
from ..contract import BlockEnd, BlockStart, Finish, PreStepDecision, ReasoningDelta, Usage
from ..contract import text_block as _text_block
from ..contract import tool_call_block as _tool_call_block
from ..effects import (
    IDEMPOTENCY_KEY_ARGUMENT,
    READ_ONLY,
    WORST_EFFECT,
    effect_class,
    effect_from_annotations,
    idempotency_key,
)
from ..hookspecs import hookimpl
from ..host import Host
from ..host.approvals import CallApproval, approvals_by_call, decided_data
from ..host.tools import error_message
from ..persistence import WriteBehind, open_store
from ..results import (
    TextBlock,
    ToolResult,
    aborted_before_dispatch,
    error_result,
    outcome_unknown,
)

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence

    from pydantic_ai.capabilities import (
        AgentNode,
        NodeResult,
        WrapModelRequestHandler,
        WrapNodeRunHandler,
        WrapRunHandler,
        WrapToolExecuteHandler,
    )
    from pydantic_ai.models import ModelRequestContext
    from pydantic_ai.run import AgentRunResult
    from pydantic_ai.tools import RunContext, ToolApproved, ToolDefinition, ToolDenied

    from ..contract import StreamChunk
    from ..effects import EffectClass
    from ..events import JSON, JSONObject, SessionEvent
    from ..hookspecs import PreStepThunk, StreamThunk, ToolThunk
    from ..host import Session
    from ..persistence import Store

__all__ = [
    "PydanticAISession",
    "SessionCheckpoints",
    "UnrecordedToolCallError",
    "current_idempotency_key",
    "history_of",
    "open_session",
]

_BUILTINS: Final = ("kai-host-llm", "kai-host-tools", "kai-host-pre-step")
"""The reference host's own innermost implementations; this host answers the hooks itself."""

_SURFACE: Final = frozenset({"user/message", "assistant/message", "tool/result"})


_KEY: ContextVar[str | None] = ContextVar("kai_idempotency_key", default=None)


def current_idempotency_key() -> str | None:
    """The idempotency key of the tool call whose body is running, for the body to hand to a
    provider that deduplicates on it (``None`` for a read-only tool, or outside a body).

    It is derived from the session and the call's id, and recorded in the call's ``tool/call``.
    """
    return _KEY.get()


def _effect_of(tool_def: ToolDefinition | None, *, trusted: bool) -> EffectClass:
    """The class calls of *tool_def* run under: its metadata's ``effect``, else its MCP
    ``annotations`` if trusted, else the worst case."""
    metadata = (tool_def.metadata if tool_def is not None else None) or {}
    declared = metadata.get("effect")
    if declared is not None:
        return effect_class(str(declared))
    annotations = metadata.get("annotations")
    if isinstance(annotations, dict):
        return effect_from_annotations(annotations, trusted=trusted)
    return WORST_EFFECT


class UnrecordedToolCallError(RuntimeError):
    """Pydantic AI was about to run a tool call that no response of the session asked for.

    It happens when a run's ``message_history`` ends with tool calls of a response that is not
    in the session log (a history from elsewhere): such a call would run with no ``tool/call``
    to make durable first, so it is refused before its body runs.
    """


# -------------------------------------------------------------------------------------------
# Opening a session
# -------------------------------------------------------------------------------------------


@asynccontextmanager
async def open_session(
    store: str | os.PathLike[str] | Store,
    session_id: str,
    *,
    plugins: Iterable[object] = (),
    trust_annotations: bool = False,
) -> AsyncIterator[PydanticAISession]:
    """Open the session *session_id* in *store*, recovered if the store holds it.

    :param store: A directory (the JSONL backend), a ``postgresql://`` URL, or a backend made
        with :func:`~kai_session_checkpoint_policy.persistence.open_store` (for its options);
        the backend is closed with the session.
    :param session_id: The session's id: a new session if the store has none by this id.
    :param plugins: More plugins for the host (observers, further persistence participants).
    :param trust_annotations: Whether the MCP annotations Pydantic AI copies into a tool's
        metadata (``metadata["annotations"]``) may set the effect class of its calls. A tool's
        own ``metadata["effect"]`` (``"read-only"``...) is always read; a tool with neither
        runs as ``"open-world"``.

    On a clean exit the session is flushed, then released. An exception that ends the block
    leaves the session's admitted events to the backend, which writes what it can as it
    closes, and passes through.

    :raises SessionLockedError: if another process is writing the session.
    """
    registered = [_backend_of(store), policy, invariant, _Boundaries(), *plugins]
    options = {policy.REQUIRE_OPTION: True}
    async with Host(registered, autoload=False, block=_BUILTINS, options=options) as host:
        session = await host.sessions.open(session_id)
        opened = PydanticAISession(_SessionHost(host, session, trust_annotations))
        try:
            yield opened
        except BaseException:
            host.sessions.detach(session)
            raise
        await host.sessions.close(session)


def _backend_of(store: object) -> WriteBehind[Any]:
    if isinstance(store, (str, os.PathLike)):
        return open_store(store)
    if isinstance(store, WriteBehind):
        return store
    raise TypeError(
        "the store must be a directory, a postgresql:// URL or a persistence backend, "
        f"not {store!r}"
    )


class PydanticAISession:
    """An open session: the capability that records runs in it, and its history so far."""

    def __init__(self, recorder: _SessionHost) -> None:
        self._recorder = recorder
        self.capability: Final = SessionCheckpoints(recorder=recorder)
        """Pass it to the agent: ``Agent(model, capabilities=[session.capability])``."""

    @property
    def session_id(self) -> str:
        return self._recorder.session.id

    @property
    def events(self) -> tuple[SessionEvent, ...]:
        """The session's log so far, what is not yet durable included."""
        return tuple(self._recorder.session.events)

    @property
    def message_history(self) -> list[ModelMessage]:
        """The session's messages as Pydantic AI's, for a run's ``message_history``.

        Built from the log each time it is read: after a crash, it holds the recovery's results,
        so it never ends with a tool call left to run, but for the calls a run deferred (they
        wait for the answers of ``deferred_tool_results``). A result that failed in a known way (the
        recovery's ``TOOL_OUTCOME_UNKNOWN`` and ``TOOL_NOT_STARTED`` among them) is a failed tool
        return whose content begins with its code in brackets, and whose ``metadata`` holds
        ``{"error": {"name": ..., "code": ...}}``.
        """
        return history_of(self._recorder.session.events)

    def pending_approvals(self) -> DeferredToolRequests | None:
        """The calls whose approval was asked and never answered, as Pydantic AI's requests
        (``None`` if there are none).

        After a crash or a stop while a person was deciding, ask again and pass the answers to
        the next run as ``deferred_tool_results``, with ``message_history``: nothing here is
        ever taken as a yes.
        """
        waiting = [
            ToolCallPart(
                asked.question.tool_name,
                asked.question.arguments or None,
                tool_call_id=asked.call_id,
            )
            for asked in approvals_by_call(self._recorder.session.events).values()
            if asked.pending
        ]
        return DeferredToolRequests(approvals=waiting) if waiting else None

    def standing_approvals(self) -> DeferredToolResults | None:
        """The answers a person gave that no call has acted on yet (a crash came between), as
        the ``deferred_tool_results`` of the next run: pass them, and nobody is asked twice
        (``None`` if there are none)."""
        given: dict[str, bool | ToolApproved | ToolDenied] = {
            asked.call_id: asked.outcome == "allowed-once"
            for asked in approvals_by_call(self._recorder.session.events).values()
            if asked.standing
        }
        return DeferredToolResults(approvals=given) if given else None


@dataclass
class SessionCheckpoints(AbstractCapability[Any]):
    """The Pydantic AI capability that records runs in a session and checkpoints them.

    Made by :func:`open_session`, for the session it opened.
    """

    recorder: _SessionHost = field(repr=False)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # bound to an open session: not made from a spec

    async def wrap_run(
        self, ctx: RunContext[Any], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        return await self.recorder.run(handler)

    async def wrap_node_run(
        self,
        ctx: RunContext[Any],
        *,
        node: AgentNode[Any],
        handler: WrapNodeRunHandler[Any],
    ) -> NodeResult[Any]:
        return await self.recorder.node(ctx, node, handler)

    async def wrap_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        return await self.recorder.model_request(ctx, request_context, handler)

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        handler: WrapToolExecuteHandler,
    ) -> Any:
        return await self.recorder.tool_execute(
            call, args, handler, tool_def, approved=ctx.tool_call_approved
        )


# -------------------------------------------------------------------------------------------
# The host side: what crosses the three boundaries
# -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Agent:
    """The agent of a session, as the policy reads it (``AgentLike``)."""

    session: Session


@dataclass(frozen=True, slots=True)
class _NotAborted:
    """A run is stopped by cancelling it; a call is never aborted by a signal here."""

    aborted: bool = False


@dataclass(frozen=True, slots=True)
class _Request:
    """A model request (``ModelRequestLike``), carrying the call of Pydantic AI's model."""

    session_id: str
    model: StreamThunk


@dataclass(frozen=True, slots=True)
class _Execution:
    """A tool call (``ToolCallLike``), carrying the call of Pydantic AI's tool execution."""

    agent: _Agent
    call_id: str
    name: str
    body: ToolThunk
    parent: None = None
    signal: _NotAborted = field(default_factory=_NotAborted)


@dataclass(frozen=True, slots=True)
class _Step:
    """The step an agent is about to enter (``PreStepLike``)."""

    agent: _Agent
    turn: int
    step: int


class _Boundaries:
    """The innermost implementations of the three boundaries: Pydantic AI's own calls."""

    name = "pydantic-ai-boundaries"

    @hookimpl
    def llm_stream(self, request: _Request) -> StreamThunk:
        return request.model

    @hookimpl
    def tools_execute(self, execution: _Execution) -> ToolThunk:
        return execution.body

    @hookimpl
    def agent_pre_step(self) -> PreStepThunk:
        return _enter


async def _enter() -> PreStepDecision:
    return PreStepDecision()


class _Call:
    """One tool call of the open step, until its ``tool/result``."""

    __slots__ = ("call_id", "call_seq", "effect", "error", "finished", "key", "name", "started")

    def __init__(self, call_id: str, name: str) -> None:
        self.call_id, self.name = call_id, name
        self.effect: EffectClass | None = None  # the class it runs under, once started
        self.key: str | None = None  # and its idempotency key
        self.call_seq: int | None = None  # the seq of its tool/call
        self.started = False  # the tool body was entered
        self.finished = False  # and returned
        self.error: Exception | None = None  # or raised


@dataclass
class _Turn:
    """What one run has recorded so far."""

    number: int
    step: int = 0
    step_open: bool = False
    resuming: bool = False  # the first request is the history's last one, sent again
    response: ModelResponse | None = None  # the open step's response
    calls: dict[str, _Call] = field(default_factory=dict)  # its calls, in the model's order
    messages: Sequence[ModelMessage] = ()  # the run's history, as last seen
    deferred: set[str] = field(default_factory=set)  # calls left for a later run to answer
    asking: list[ToolCallPart] = field(default_factory=list)  # of them, those to approve
    carried: set[str] = field(default_factory=set)  # calls of an earlier run, answered in this


class _SessionHost:
    """Records the runs of one live session, and calls the boundary hooks of its host."""

    def __init__(self, host: Host, session: Session, trust_annotations: bool = False) -> None:
        self.trust_annotations = trust_annotations
        self.host = host
        self.hooks = host.pm.hook
        self.session = session
        self.agent = _Agent(session)
        self.turn: _Turn | None = None
        self.announced = False  # request/header written by this opening

    def _current(self) -> _Turn:
        if self.turn is None:
            raise RuntimeError(
                f"session {self.session.id!r}: a model request or tool call outside a run"
            )
        return self.turn

    async def run(self, handler: WrapRunHandler) -> AgentRunResult[Any]:
        if self.turn is not None:
            raise RuntimeError(
                f"session {self.session.id!r} already has a run in progress: "
                "the runs of one session go one at a time"
            )
        session = self.session
        number = 1 + len(session.events.select({"turn/start"}))
        turn = self.turn = _Turn(number)
        session.append("turn/start", eventdata.turn_start(number))
        reason: JSONObject = {"kind": "aborted", "reason": "cancelled"}
        try:
            result = await handler()
            turn.messages = result.all_messages()
            _defer(turn, result.output)
            reason = {"kind": "completed"}
        except Exception as exc:
            reason = {"kind": "error", "error": {"message": error_message(exc), "code": "UNKNOWN"}}
            raise
        finally:
            self.turn = None
            self._close_step(turn, _parts_after(turn.messages, turn.response))
            session.append("turn/end", eventdata.turn_end(number, reason))
        await self.host.sessions.flush(session)  # the run's end is durable once it returns
        return result

    async def node(
        self, ctx: RunContext[Any], node: AgentNode[Any], handler: WrapNodeRunHandler[Any]
    ) -> NodeResult[Any]:
        turn = self._current()
        if isinstance(node, ModelRequestNode) and turn.step == 0:
            turn.resuming = bool(getattr(node, "is_resuming_without_prompt", False))
        if isinstance(node, CallToolsNode) and not turn.step_open:
            await self._carry_over(turn, node.model_response)
        result = await handler(node)
        if isinstance(result, End):
            _defer(turn, getattr(result.data, "output", None))
        if isinstance(node, CallToolsNode):
            # The step ends with its tool calls: answer each before the next step's checkpoint.
            turn.messages = ctx.messages
            if isinstance(result, ModelRequestNode):
                self._close_step(turn, result.request.parts)
            else:
                self._close_step(turn, _parts_after(ctx.messages, turn.response))
        return result

    async def model_request(
        self,
        ctx: RunContext[Any],
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        turn = self._current()
        turn.messages = ctx.messages
        last = request_context.messages[-1] if request_context.messages else None
        request = last if isinstance(last, ModelRequest) else None
        self._close_step(turn, () if request is None else request.parts)
        session = self.session
        step = await self._open_step(turn)
        if request is not None and not (step == 1 and turn.resuming):
            self._record_request(turn, request)
        model = request_context.model
        provider, model_name = model.system, model.model_name
        if not self.announced:
            tools = [tool.name for tool in request_context.model_request_parameters.function_tools]
            resumed = bool(session.events.select({"request/header"}))
            header = eventdata.request_header(provider, model_name, tools, resumed=resumed)
            session.append("request/header", header)
            session.append("request/context", eventdata.request_context(provider, model_name))
            self.announced = True

        responses: list[ModelResponse] = []

        async def call_model() -> AsyncGenerator[StreamChunk, None]:
            response = await handler(request_context)
            responses.append(response)
            for chunk in _chunks(response):
                yield chunk

        stream = cast(
            "StreamThunk",
            self.hooks.llm_stream(request=_Request(session.id, call_model), host=self.host),
        )
        content: list[JSON] = []
        usage: JSONObject | None = None
        async with aclosing(stream()) as chunks:
            async for chunk in chunks:
                if isinstance(chunk, BlockEnd):
                    content.append(chunk.block)
                elif isinstance(chunk, Usage):
                    usage = chunk.usage
        (response,) = responses
        message = eventdata.assistant_message(
            turn.number,
            step,
            content,
            provider=response.provider_name or provider,
            model=response.model_name or model_name,
            usage=usage,
        )
        session.append("assistant/message", message)
        turn.response = response
        for call in response.tool_calls:
            turn.calls[call.tool_call_id] = _Call(call.tool_call_id, call.tool_name)
        return response

    async def _carry_over(self, turn: _Turn, response: ModelResponse) -> None:
        """Open a step for the calls of an earlier run that this one answers (the run resumes
        with ``deferred_tool_results``): the calls of *response* that a response in the log
        asked for and that have no result there. Calls of a history from elsewhere stay
        unrecorded, and are refused when they are about to run."""
        asked: set[str] = set()
        for event in self.session.events.select({"assistant/message", "tool/result"}):
            if event.type == "assistant/message":
                asked.update(eventdata.tool_call_ids(event.data))
            else:
                asked.discard(eventdata.result_call_id(event.data) or "")
        carried = [call for call in response.tool_calls if call.tool_call_id in asked]
        if not carried:
            return
        await self._open_step(turn)
        turn.response = response
        for call in carried:
            turn.calls[call.tool_call_id] = _Call(call.tool_call_id, call.tool_name)
            turn.carried.add(call.tool_call_id)

    async def _open_step(self, turn: _Turn) -> int:
        """Run the pre-step checkpoint, then append the next ``step/start``; return its step."""
        turn.step += 1
        step = turn.step
        decide = cast(
            "PreStepThunk",
            self.host.pm.hook.agent_pre_step(
                step=_Step(self.agent, turn.number, step), host=self.host
            ),
        )
        decision = await decide()
        if decision.kind == "reject":
            raise RuntimeError(f"the step was rejected: {decision.reason}")
        self.session.append("step/start", eventdata.step_data(turn.number, step))
        turn.step_open = True
        return step

    def _record_request(self, turn: _Turn, request: ModelRequest) -> None:
        """Append the messages of *request* that are not already in the log."""
        texts = [text for part in request.parts for text in _prompt_texts(part)]
        if texts:
            suffix = "" if turn.step == 1 else f"-{turn.step}"
            data = _user_message(f"user-{turn.number}{suffix}", texts, "prompt")
            self.session.append("user/message", data)
        feedback = [_feedback_text(part) for part in request.parts]
        if any(text is not None for text in feedback):
            texts = [text for text in feedback if text is not None]
            data = _user_message(f"retry-{turn.number}-{turn.step}", texts, "retry")
            self.session.append("user/message", data)

    async def tool_execute(
        self,
        call: ToolCallPart,
        args: dict[str, Any],
        handler: WrapToolExecuteHandler,
        tool_def: ToolDefinition | None = None,
        *,
        approved: bool = False,
    ) -> Any:
        turn = self._current()
        record = turn.calls.get(call.tool_call_id) if turn.step_open else None
        if record is None or record.call_seq is not None:
            raise UnrecordedToolCallError(
                f"session {self.session.id!r}: tool call {call.tool_call_id!r} "
                f"({call.tool_name}) was not asked for by a response recorded in this session; "
                "run the agent with the session's message_history"
            )
        effect = _effect_of(tool_def, trusted=self.trust_annotations)
        key = None if effect == READ_ONLY else idempotency_key(self.session.id, call.tool_call_id)
        named = args.get(IDEMPOTENCY_KEY_ARGUMENT)
        if named is not None and effect != READ_ONLY:
            if not self._issued(named, call.tool_name):
                raise ModelRetry(
                    f"{IDEMPOTENCY_KEY_ARGUMENT} {named!r} is not the key of an earlier call of "
                    f"{call.tool_name!r} in this session; leave it out for a new call"
                )
            key = named
        record.effect, record.key = effect, key
        approval_id = await self._approval_for(call.tool_call_id) if approved else None
        data = eventdata.tool_call(
            turn.number,
            turn.step,
            call.tool_call_id,
            call.tool_name,
            call.args_as_json_str(),
            effect=effect,
            idempotency_key=key,
            approval_id=approval_id,
        )
        record.call_seq = self.session.append("tool/call", data).seq
        values: list[Any] = []

        async def body() -> ToolResult:
            record.started = True
            token = _KEY.set(key)
            try:
                value = await handler(args)
            finally:
                _KEY.reset(token)
            record.finished = True
            values.append(value)
            return ToolResult((TextBlock(_return_text(call, value)),))

        execution = _Execution(self.agent, call.tool_call_id, call.tool_name, body)
        thunk = cast(
            "ToolThunk", self.host.pm.hook.tools_execute(execution=execution, host=self.host)
        )
        try:
            result = await thunk()
        except Exception as exc:
            record.error = exc
            raise
        self._answer(turn, record, result)
        if not values:  # the policy answered for the call: its body was not dispatched
            return "".join(block.text for block in result.content)
        return values[0]

    def _issued(self, key: object, tool_name: str) -> bool:
        """Whether *key* is the idempotency key of an earlier call of *tool_name* here."""
        return isinstance(key, str) and any(
            event.data.get("idempotencyKey") == key and event.data.get("name") == tool_name
            for event in self.session.events.select({"tool/call"})
        )

    async def _approval_for(self, call_id: str) -> str | None:
        """The decision an approved call runs under: the yes that stands for it, else the yes
        given now, appended and made durable before its ``tool/call`` (fail-closed)."""
        asked = approvals_by_call(self.session.events).get(call_id)
        if asked is None:
            return None  # approved without a question recorded here (from another history)
        if not (asked.standing and asked.outcome == "allowed-once"):
            self.session.append("approval/decided", decided_data(asked.question.id, "allowed-once"))
            await self.host.sessions.flush(self.session)  # the yes, before the call starts
        return asked.question.id

    def _answer(self, turn: _Turn, record: _Call, result: ToolResult) -> None:
        """Append the ``tool/result`` of *record*, citing its ``tool/call`` if it has one."""
        turn.calls.pop(record.call_id, None)
        data = eventdata.tool_result(turn.number, turn.step, record.call_id, result)
        sources = None if record.call_seq is None else (record.call_seq,)
        self.session.append("tool/result", data, source_event_seqs=sources)

    def _close_step(self, turn: _Turn, parts: Iterable[ModelRequestPart]) -> None:
        """Answer every call of the open step still unanswered, then end the step.

        A call is answered by the result Pydantic AI gave it (found among *parts*), else by how
        far it got: an error if its body raised, ``TOOL_OUTCOME_UNKNOWN`` if its body started and
        never returned, ``ABORTED_BEFORE_DISPATCH`` if it never reached its body.
        """
        if not turn.step_open:
            return
        given = {
            part.tool_call_id: part
            for part in parts
            if isinstance(part, (ToolReturnPart, RetryPromptPart))
        }
        approvals = approvals_by_call(self.session.events) if turn.asking or turn.carried else {}
        for record in list(turn.calls.values()):
            part = given.get(record.call_id)
            waiting = record.call_id in turn.deferred or record.call_id in turn.carried
            if part is None and waiting and not record.started and record.error is None:
                turn.calls.pop(record.call_id)  # still to run, or not: a later run answers it
                self._ask(turn, record.call_id, approvals)
                continue
            asked = approvals.get(record.call_id)
            denied = isinstance(part, ToolReturnPart) and part.outcome == "denied"
            if denied and asked and not (asked.standing and asked.outcome == "rejected"):
                decided = decided_data(asked.question.id, "rejected")
                self.session.append("approval/decided", decided)
            if part is not None:
                result = _result_of(part)
            elif record.error is not None:
                result = error_result(error_message(record.error))
            elif record.started:
                result = outcome_unknown(record.effect, record.key)
            else:
                result = aborted_before_dispatch()
            self._answer(turn, record, result)
        turn.step_open, turn.response = False, None
        self.session.append("step/end", eventdata.step_data(turn.number, turn.step))

    def _ask(self, turn: _Turn, call_id: str, approvals: dict[str, CallApproval]) -> None:
        """Append the ``approval/asked`` of a call this run left waiting for approval, unless
        its question is already pending."""
        call = next((call for call in turn.asking if call.tool_call_id == call_id), None)
        earlier = approvals.get(call_id)
        if call is None or (earlier is not None and earlier.pending):
            return
        question_id = f"approval-{call_id}-{len(self.session.events)}"
        data: JSONObject = {
            "id": question_id,
            "toolName": call.tool_name,
            "callId": call_id,
            "arguments": call.args_as_json_str(),
        }
        self.session.append("approval/asked", data)


def _defer(turn: _Turn, output: object) -> None:
    """Leave the calls a run's *output* defers (``DeferredToolRequests``) to a later run."""
    if isinstance(output, DeferredToolRequests):
        turn.deferred = {call.tool_call_id for call in (*output.approvals, *output.calls)}
        turn.asking = list(output.approvals)


# -------------------------------------------------------------------------------------------
# Between Pydantic AI's messages and the log's
# -------------------------------------------------------------------------------------------


def _chunks(response: ModelResponse) -> list[StreamChunk]:
    """The response as the stream chunks of the contract: its blocks, usage, and finish."""
    chunks: list[StreamChunk] = []
    index = 0
    for part in response.parts:
        if isinstance(part, TextPart):
            chunks += _text_block(index, part.content)
        elif isinstance(part, ThinkingPart):
            block: JSONObject = {"type": "reasoning", "text": part.content}
            chunks += (
                BlockStart(index, "reasoning"),
                ReasoningDelta(part.content, index),
                BlockEnd(index, block),
            )
        elif isinstance(part, ToolCallPart):
            chunks += _tool_call_block(
                index, part.tool_call_id, part.tool_name, part.args_as_json_str()
            )
        else:
            continue  # provider-run tools and files stay in Pydantic AI's own history only
        index += 1
    usage = response.usage
    chunks.append(Usage({"inputTokens": usage.input_tokens, "outputTokens": usage.output_tokens}))
    chunks.append(Finish("tool-calls" if response.tool_calls else "stop"))
    return chunks


def _prompt_texts(part: ModelRequestPart) -> list[str]:
    """The texts of a user prompt part; a prompt of anything but text is refused."""
    if not isinstance(part, UserPromptPart):
        return []
    if isinstance(part.content, str):
        return [part.content]
    texts: list[str] = []
    for item in part.content:
        if not isinstance(item, str):
            raise TypeError(
                f"the session log records text prompts only, not {type(item).__name__} content"
            )
        texts.append(item)
    return texts


def _feedback_text(part: ModelRequestPart) -> str | None:
    """The text of Pydantic AI's feedback on a response it could not use, if *part* is that."""
    if isinstance(part, RetryFeedbackPart) or (
        isinstance(part, RetryPromptPart) and part.tool_name is None
    ):
        content = part.content
        return content if isinstance(content, str) else json.dumps(content, default=str)
    return None


def _user_message(message_id: str, texts: list[str], kind: str) -> eventdata.UserMessage:
    return {
        "id": message_id,
        "role": "user",
        "content": [{"type": "text", "text": text} for text in texts],
        "source": {"kind": kind},
    }


def _return_text(call: ToolCallPart, value: object) -> str:
    """What the model reads of a tool's return value, as Pydantic AI renders it."""
    if isinstance(value, ToolReturn):
        value = value.return_value
    part = ToolReturnPart(tool_name=call.tool_name, content=value, tool_call_id=call.tool_call_id)
    return part.model_response_str()


def _result_of(part: ToolReturnPart | RetryPromptPart) -> ToolResult:
    """The result a tool return or retry part of Pydantic AI gives its call."""
    if isinstance(part, RetryPromptPart):
        return error_result(part.model_response())
    text = part.model_response_str(wrap_if_error=False)
    if part.outcome == "success":
        return ToolResult((TextBlock(text),))
    return error_result(text)


def _parts_after(
    messages: Sequence[ModelMessage], response: ModelResponse | None
) -> list[ModelRequestPart]:
    """The parts of the requests that follow *response* in *messages* (all, if it is not there)."""
    start = next((index + 1 for index, message in enumerate(messages) if message is response), 0)
    return [
        part
        for message in messages[start:]
        if isinstance(message, ModelRequest)
        for part in message.parts
    ]


def history_of(events: Iterable[SessionEvent]) -> list[ModelMessage]:
    """The messages of a session log, as Pydantic AI's ``message_history``.

    ``user/message`` events are user prompts, ``assistant/message`` events responses (text,
    reasoning and tool calls), ``tool/result`` events tool returns (failed ones for an error
    result) in the request that follows their response.
    """
    messages: list[ModelMessage] = []
    parts: list[ModelRequestPart] = []
    names: dict[str, str] = {}
    for event in events:
        if event.type not in _SURFACE:
            continue
        data = event.data
        message = eventdata.message_of(event.type, data)
        if event.type == "user/message":
            texts = eventdata.texts_of(message.get("content"))
            parts.append(UserPromptPart(texts[0] if len(texts) == 1 else texts))
        elif event.type == "assistant/message":
            if parts:
                messages.append(ModelRequest(parts=parts))
                parts = []
            messages.append(_response_of(message, names))
        else:
            call_id = eventdata.result_call_id(data)
            if call_id is not None:
                parts.append(_tool_return_of(call_id, names.get(call_id, ""), message, data))
    if parts:
        messages.append(ModelRequest(parts=parts))
    return messages


def _response_of(message: JSONObject, names: dict[str, str]) -> ModelResponse:
    content = message.get("content")
    response_parts: list[TextPart | ThinkingPart | ToolCallPart] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        kind, text = block.get("type"), block.get("text")
        if kind == "text" and isinstance(text, str):
            response_parts.append(TextPart(text))
        elif kind == "reasoning" and isinstance(text, str):
            response_parts.append(ThinkingPart(text))
        elif kind == "tool-call":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("arguments")
            if isinstance(call_id, str) and isinstance(name, str):
                names[call_id] = name
                raw = arguments if isinstance(arguments, str) and arguments.strip() else None
                response_parts.append(ToolCallPart(name, raw, tool_call_id=call_id))
    source = message.get("source")
    model = source.get("model") if isinstance(source, dict) else None
    return ModelResponse(parts=response_parts, model_name=model if isinstance(model, str) else None)


def _tool_return_of(
    call_id: str, name: str, message: JSONObject, data: JSONObject
) -> ToolReturnPart:
    content = message.get("content")
    blocks = content if isinstance(content, list) else []
    text = "".join(eventdata.texts_of(blocks))
    failed = any(isinstance(block, dict) and block.get("isError") is True for block in blocks)
    error = eventdata.error_of(data)
    if error is not None:
        text = f"[{error['code']}] {text}"
    return ToolReturnPart(
        tool_name=name,
        content=text,
        tool_call_id=call_id,
        outcome="failed" if failed else "success",
        metadata=None if error is None else {"error": dict(error)},
    )
