"""The OpenAI Agents SDK with durable checkpoints: a ``Session`` kept in a session log.

:class:`CheckpointSession` implements the SDK's ``Session`` protocol over a session log in a
store (a directory for JSONL, or a ``postgresql://`` URL), and its :attr:`~CheckpointSession.hooks`
are the ``RunHooks`` that record the run as it happens and hold the checkpoints::

    async with CheckpointSession("sessions", "invoice-1042") as session:
        result = await Runner.run(agent, "Pay invoice 1042.", session=session, hooks=session.hooks)

The integration is a host of the contract: it runs the reference host
(:class:`~kai_session_checkpoint_policy.host.Host`) with the store's backend, the checkpoint
policy and its companion, and calls the three boundary hooks at the SDK's matching moments, so
that the policy's own wrappers decide when the log is made durable:

``agent_pre_step``
    when a turn opens (the SDK saves the run's input) and before every further model request,
    before its ``step/start``;
``llm_stream``
    in ``on_llm_start``, after the request's events are appended: the SDK calls the model only
    once the hook has returned, so a failed checkpoint raises and the model is never called;
``tools_execute``
    in ``on_tool_start``, after the call's ``tool/call`` is appended: the SDK runs the body of a
    function tool only once the hook has returned. The innermost thunk of the chain only lets
    the call through; if the chain does not reach it (a failed checkpoint, an aborted call), the
    call's error result is recorded and :class:`CheckpointError` is raised, which ends the run
    before the body runs.

The run is recorded in the original harness's event format, as the reference agent writes it
(``turn/start``, ``step/start``, ``user/message``, ``request/header``, ``request/context``,
``assistant/chunk``..., ``assistant/message``, ``tool/call``, ``tool/result``, ``step/end``,
``turn/end``). Opening a stored session recovers it: a call whose ``tool/call`` is durable but
whose result is not is answered ``TOOL_OUTCOME_UNKNOWN``, one the log proves never started
``TOOL_NOT_STARTED``, and :meth:`~CheckpointSession.get_items` hands the model that answer as
the call's ``function_call_output``, so the SDK neither drops the call nor runs it again.

Tools that need a person's approval (``needs_approval``) are asked about durably. A run that
stops with approval items (``RunResult.interruptions``) saves their calls; the integration then
appends an ``approval/asked`` for each, ends the turn with the calls unanswered, and makes it
durable before the run returns. The run that goes on from the ``RunState`` appends the yes
(``approval/decided``) and makes it durable before the call's ``tool/call`` and body; a
rejection is recorded with the output the SDK gives the model. After a crash,
:meth:`CheckpointSession.pending_approvals` gives the questions nobody answered (never taken as
a yes) and :meth:`CheckpointSession.standing_approvals` the answers given that no call used.

The SDK is asyncio-based, and so is this integration: use it on asyncio only. One run at a
time per session; function tools are recorded and checkpointed, other local tool kinds
(computer, shell, apply-patch) and hosted tools are not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import AsyncExitStack, aclosing
from typing import TYPE_CHECKING, Any, Final, cast

from agents import RunHooks
from agents.exceptions import AgentsException
from agents.tool_context import ToolContext
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)

from .. import eventdata, invariant, policy
from ..contract import (
    BlockEnd,
    BlockStart,
    Finish,
    LlmRequest,
    ReasoningDelta,
    StreamChunk,
    Usage,
    text_block,
    tool_call_block,
)
from ..effects import (
    IDEMPOTENCY_KEY_ARGUMENT,
    READ_ONLY,
    WORST_EFFECT,
    effect_class,
    idempotency_key,
)
from ..host import AbortController, Agent, Host, PreStep, Tool, ToolExecution, error_message
from ..host.approvals import ApprovalQuestion, approvals_by_call
from ..persistence import DEFAULT_BATCH_WINDOW, interrupted_turn_closers, open_store
from ..results import UNKNOWN_IDEMPOTENCY_KEY, ErrorInfo, TextBlock, ToolResult, error_result

if TYPE_CHECKING:
    import os
    from collections.abc import AsyncGenerator, Iterable, Sequence
    from types import TracebackType

    from agents import Agent as SdkAgent
    from agents import ModelResponse
    from agents import Tool as SdkTool
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
    from agents.run_context import AgentHookContext, RunContextWrapper

    from ..events import JSON, JSONObject
    from ..host import Session

__all__ = [
    "PROVIDER",
    "AppendOnlyLogError",
    "CheckpointError",
    "CheckpointHooks",
    "CheckpointSession",
]

PROVIDER: Final = "openai-agents"
"""The provider the integration's requests and ``request/header`` events name."""


class CheckpointError(AgentsException):
    """A checkpoint did not let the model request or the tool body run; the run ends.

    The failure that stopped it (the backend's error) is the ``__cause__``. An SDK exception,
    so that the SDK passes it through as it is instead of wrapping it.
    """


class AppendOnlyLogError(RuntimeError):
    """A session log is append-only: items cannot be removed from it."""


class CheckpointHooks(RunHooks[Any]):
    """The run hooks of a :class:`CheckpointSession`; pass them as ``Runner.run(..., hooks=)``."""

    def __init__(self, session: CheckpointSession) -> None:
        self._session = session

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],
        agent: SdkAgent[Any],
        system_prompt: str | None,
        input_items: list[TResponseInputItem],
    ) -> None:
        await self._session._before_request(agent)

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: SdkAgent[Any], response: ModelResponse
    ) -> None:
        self._session._record_response(response)

    async def on_tool_start(
        self, context: RunContextWrapper[Any], agent: SdkAgent[Any], tool: SdkTool
    ) -> None:
        if isinstance(context, ToolContext):
            await self._session._before_tool(context)

    async def on_tool_end(
        self, context: RunContextWrapper[Any], agent: SdkAgent[Any], tool: SdkTool, result: object
    ) -> None:
        if isinstance(context, ToolContext):
            self._session._record_result(context.tool_call_id, result)

    async def on_agent_end(
        self, context: AgentHookContext[Any], agent: SdkAgent[Any], output: Any
    ) -> None:
        self._session._end_turn()


class CheckpointSession:
    """An SDK ``Session`` kept in a session log, with the checkpoint policy at its boundaries.

    :param store: A directory (the JSONL backend) or a ``postgresql://`` URL.
    :param session_id: The session: resumed, with recovery, if the store has it; else created.
    :param batch_window: How long the backend lets an event wait for a background batch.
    :param plugins: More plugins for the host (observers, further persistence participants).
    :param effects: The effect class of each tool, by name (``{"pay": "side-effecting"}``); a
        tool not named runs as ``"open-world"``. Each ``tool/call`` records the class and, but
        for a read-only tool, the idempotency key of the call (:meth:`idempotency_key`), so that
        an unknown outcome after a crash says what a retry risks.

    Use it inside ``async with``, and pass :attr:`hooks` to every run that uses it: the hooks
    record the model's responses and the tool calls, and hold the checkpoints. A run without
    them is refused when it saves its first response. asyncio only.
    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        store: str | os.PathLike[str],
        session_id: str,
        *,
        batch_window: float = DEFAULT_BATCH_WINDOW,
        plugins: Iterable[object] = (),
        effects: Mapping[str, str] | None = None,
    ) -> None:
        self._effects = {name: effect_class(value) for name, value in (effects or {}).items()}
        self.session_id = session_id
        self.store = store
        self.hooks: Final = CheckpointHooks(self)
        self._backend = open_store(store, batch_window=batch_window)
        self._plugins = list(plugins)
        self._stack: AsyncExitStack | None = None
        self._host: Host | None = None
        self._live: Session | None = None
        self._agent: Agent | None = None
        self._signal = AbortController().signal
        self._route: tuple[str, tuple[str, ...]] | None = None  # announced by this opening
        self._has_header = False  # the log has a request/header
        self._inputs = 0  # the input messages of the open turn
        self._turn: int | None = None  # the open turn
        self._step = 0
        self._step_open = False
        self._requested = False  # the open step's request passed its checkpoint
        self._waiting_request: SdkAgent[Any] | None = None  # announced before the input came
        self._responded = False  # the hooks recorded a response in the open or last turn
        self._run_started = False  # get_items was called since the last turn began
        self._call_seqs: dict[str, int] = {}  # the seq of each tool/call of the open turn
        self._approving: set[str] = set()  # the tools that may need approval, as last seen
        self._approval_turn = False  # the open turn answers calls of an earlier turn's response
        self._named_keys: dict[str, str] = {}  # the key a retry named, by its call id

    # -- lifetime ----------------------------------------------------------------------------

    async def __aenter__(self) -> CheckpointSession:
        if self._stack is not None:
            raise RuntimeError("a CheckpointSession can be opened only once")
        stack = self._stack = AsyncExitStack()
        try:
            host = await stack.enter_async_context(
                Host([self._backend, policy, invariant, *self._plugins], autoload=False)
            )
            host.llm.register_adapter(PROVIDER, _dispatch)
            live = await host.sessions.open(self.session_id)
            stack.push_async_callback(host.sessions.close, live)
        except BaseException:
            await stack.aclose()
            raise
        self._host, self._live = host, live
        self._agent = Agent(host, live, provider=PROVIDER, model="")
        self._has_header = bool(live.events.select({"request/header"}))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        self._host = self._live = self._agent = None
        if stack is not None:
            await stack.__aexit__(exc_type, exc, traceback)

    @property
    def log(self) -> Session:
        """The live session: its ``events`` are the log, as appended so far."""
        if self._live is None:
            raise RuntimeError(
                f"session {self.session_id!r} is not open: use it inside 'async with'"
            )
        return self._live

    # -- the Session protocol ----------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The transcript as SDK input items: the latest *limit* of them, or all.

        A turn a previous run left open (it raised) is closed first, as recovery would close
        it. A call answered by recovery has its ``function_call_output``, whose text begins
        with the code (``TOOL_OUTCOME_UNKNOWN: ...``).
        """
        session = self.log
        if self._turn is not None:
            answered = not any(
                closer.type == "tool/result" for closer in interrupted_turn_closers(session.events)
            )
            if self._approval_turn and answered:
                self._end_turn()  # its approved calls ran: the model is asked in a turn of its own
            else:
                self._close_open_turn()
        self._run_started = True
        items = _transcript(session.events)
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Record the run's input as ``user/message`` events, then make the log durable.

        The input opens a turn (``turn/start``, the pre-step checkpoint, ``step/start``). The
        model's items and the tools' outputs were recorded by the hooks as they happened; they
        are not recorded again.
        """
        session = self.log
        await self._record_approvals([_mapping(item) for item in items])
        inputs = [item for item in map(_mapping, items) if _is_input_message(item)]
        if len(inputs) < len(items) and not self._responded:
            raise RuntimeError(
                f"session {self.session_id!r} was given a model's items that its hooks did not "
                "record: pass the session's hooks to the run, "
                "Runner.run(agent, input, session=session, hooks=session.hooks)"
            )
        if inputs:
            if self._turn is None:
                await self._open_turn()
            turn = self._require_turn()
            for item in inputs:
                role, text = str(item.get("role")), _input_text(item.get("content"))
                self._inputs += 1
                message_id = f"user-{turn}" if self._inputs == 1 else f"user-{turn}-{self._inputs}"
                source = "prompt" if role == "user" else role
                message = eventdata.user_message(message_id, text, source)
                session.append("user/message", message)
            if self._waiting_request is not None:
                await self._checkpoint_request(self._waiting_request)
        await self._require_host().sessions.flush(session)

    async def pop_item(self) -> TResponseInputItem | None:
        """Not supported: :raises AppendOnlyLogError:."""
        raise AppendOnlyLogError(
            f"session {self.session_id!r} is an append-only log: its items cannot be popped"
        )

    async def clear_session(self) -> None:
        """Not supported: :raises AppendOnlyLogError:."""
        raise AppendOnlyLogError(
            f"session {self.session_id!r} is an append-only log: it cannot be cleared; "
            "start a session with a new id instead"
        )

    # -- approvals ---------------------------------------------------------------------------

    def pending_approvals(self) -> list[ApprovalQuestion]:
        """The questions asked and never answered, oldest first: after a crash or a stop while
        a person was deciding, ask them again (none is ever taken as a yes)."""
        return [
            asked.question for asked in approvals_by_call(self.log.events).values() if asked.pending
        ]

    def standing_approvals(self) -> dict[str, bool]:
        """The answers given that no call has acted on yet (a crash came between), by call id:
        approve or reject those calls in the ``RunState`` without asking again."""
        return {
            call_id: asked.outcome == "allowed-once"
            for call_id, asked in approvals_by_call(self.log.events).items()
            if asked.standing
        }

    async def _record_approvals(self, items: list[Mapping[str, Any]]) -> None:
        """Record what the items the SDK saves say of approvals: calls it saved without running
        them (the run stops for approval) are asked about and their turn ends; an output it
        saves for a call still waiting is a rejection."""
        approvals = approvals_by_call(self.log.events)
        waiting = [
            item
            for item in items
            if item.get("type") == "function_call"
            and item.get("name") in self._approving
            and str(item.get("call_id")) not in self._call_seqs
            and self._turn is not None
        ]
        for item in waiting:
            call_id = str(item.get("call_id"))
            if call_id in approvals and approvals[call_id].pending:
                continue
            question = {
                "id": f"approval-{call_id}-{len(self.log.events)}",
                "toolName": str(item.get("name")),
                "callId": call_id,
                "arguments": str(item.get("arguments", "")),
            }
            self.log.append("approval/asked", question)
        if waiting:
            self._end_turn()  # the calls stay unanswered: the run that goes on answers them
            return
        for item in items:
            asked = approvals.get(str(item.get("call_id")))
            if item.get("type") != "function_call_output" or asked is None:
                continue
            if asked.answered or asked.call_id in self._call_seqs:
                continue
            if self._turn is None:
                await self._open_approval_turn()
            if not (asked.standing and asked.outcome == "rejected"):
                decided = {"id": asked.question.id, "outcome": "rejected"}
                self.log.append("approval/decided", decided)
            output = item.get("output")
            text = output if isinstance(output, str) else json.dumps(output)
            self._append_result(asked.call_id, error_result(text))

    async def _open_approval_turn(self) -> None:
        """Open the turn of a run that goes on from a ``RunState``: it answers the calls an
        earlier turn's response asked for, which the SDK saves again with their outputs."""
        await self._open_turn()
        self._responded = self._approval_turn = True

    async def _approval_of(self, call_id: str) -> str | None:
        """The decision the approved call *call_id* runs under: the yes that stands for it,
        else the yes given now, appended and made durable before its ``tool/call``."""
        asked = approvals_by_call(self.log.events).get(call_id)
        if asked is None:
            return None
        if not (asked.standing and asked.outcome == "allowed-once"):
            decided = {"id": asked.question.id, "outcome": "allowed-once"}
            self.log.append("approval/decided", decided)
            await self._require_host().sessions.flush(self.log)  # the yes, before the call
        return asked.question.id

    # -- what the hooks do -------------------------------------------------------------------

    async def _before_request(self, agent: SdkAgent[Any]) -> None:
        self._approving = {
            tool.name for tool in agent.tools if getattr(tool, "needs_approval", False) is not False
        }
        if self._turn is None:
            if not self._run_started:
                raise CheckpointError(
                    f"session {self.session_id!r}: a model request of a run that does not use "
                    "the session; pass it with its hooks, Runner.run(agent, input, "
                    "session=session, hooks=session.hooks)"
                )
            # A streamed run saves its input after announcing the request, before sending it.
            await self._open_turn()
            self._waiting_request = agent
            return
        if self._requested:  # the next request of the turn: a step of its own
            self._end_step()
            await self._enter_step(self._step + 1)
        await self._checkpoint_request(agent)

    async def _checkpoint_request(self, agent: SdkAgent[Any]) -> None:
        session, host = self.log, self._require_host()
        self._waiting_request = None
        model = _model_name(agent)
        tools = tuple(sorted(tool.name for tool in agent.tools))
        if self._route != (model, tools):
            header = eventdata.request_header(PROVIDER, model, tools, resumed=self._has_header)
            self._has_header = True
            session.append("request/header", header)
            session.append("request/context", eventdata.request_context(PROVIDER, model))
            self._route = (model, tools)
        request = LlmRequest(PROVIDER, model, tools=tools, session_id=session.id)
        try:
            async with aclosing(host.llm.stream(request)) as stream:
                async for _chunk in stream:
                    pass
        except Exception as exc:
            raise CheckpointError(
                f"session {self.session_id!r}: the checkpoint before the model request failed, "
                f"so the model was not called: {error_message(exc)}"
            ) from exc
        self._requested = True

    def _record_response(self, response: ModelResponse) -> None:
        session = self.log
        turn = self._require_turn()
        step = self._step
        chunks: list[StreamChunk] = []
        asks, index = False, 0
        for item in response.output:
            if isinstance(item, ResponseOutputMessage):
                for part in item.content:
                    text = part.text if isinstance(part, ResponseOutputText) else part.refusal
                    chunks += text_block(index, text)
                    index += 1
            elif isinstance(item, ResponseFunctionToolCall):
                chunks += tool_call_block(index, item.call_id, item.name, item.arguments)
                asks, index = True, index + 1
            elif isinstance(item, ResponseReasoningItem) and item.summary:
                text = "\n".join(summary.text for summary in item.summary)
                chunks += (
                    BlockStart(index, "reasoning"),
                    ReasoningDelta(text, index),
                    BlockEnd(index, {"type": "reasoning", "text": text}),
                )
                index += 1
        usage: JSONObject | None = None
        if response.usage.requests or response.usage.total_tokens:
            usage = {
                "inputTokens": response.usage.input_tokens,
                "outputTokens": response.usage.output_tokens,
                "totalTokens": response.usage.total_tokens,
            }
            chunks.append(Usage(usage))
        chunks.append(Finish("tool-calls" if asks else "stop"))
        seqs = [
            session.append(
                "assistant/chunk", eventdata.assistant_chunk(turn, step, chunk.to_json())
            ).seq
            for chunk in chunks
        ]
        content: list[JSON] = [chunk.block for chunk in chunks if isinstance(chunk, BlockEnd)]
        model = self._route[0] if self._route is not None else ""
        message = eventdata.assistant_message(
            turn, step, content, provider=PROVIDER, model=model, usage=usage
        )
        session.append("assistant/message", message, source_event_seqs=seqs)
        self._responded = True

    def idempotency_key(self, tool_call_id: str) -> str:
        """The idempotency key of the call *tool_call_id* of this session, as its ``tool/call``
        records it: a tool body hands it (from ``ToolContext.tool_call_id``) to a provider that
        deduplicates on it. For a retry that named the key of an earlier call (a tool
        parameter ``idempotency_key``), that key."""
        named = self._named_keys.get(tool_call_id)
        return named if named is not None else idempotency_key(self.session_id, tool_call_id)

    def _named_key(self, name: str, arguments: str) -> str | None:
        """The key a retry's *arguments* name (``idempotency_key``), if it is the key of an
        earlier call of the tool *name* in this session.

        :raises ValueError: naming the key, if it is not.
        """
        parsed = _parse(arguments)
        named = parsed.get(IDEMPOTENCY_KEY_ARGUMENT) if isinstance(parsed, dict) else None
        if named is None:
            return None
        issued = any(
            event.data.get("idempotencyKey") == named and event.data.get("name") == name
            for event in self.log.events.select({"tool/call"})
        )
        if not (isinstance(named, str) and issued):
            raise ValueError(
                f"{IDEMPOTENCY_KEY_ARGUMENT} {named!r} is not the key of an earlier call of "
                f"{name!r} in this session; leave it out for a new call"
            )
        return named

    async def _before_tool(self, context: ToolContext[Any]) -> None:
        session, host = self.log, self._require_host()
        call_id, name, arguments = context.tool_call_id, context.tool_name, context.tool_arguments
        waited = call_id in approvals_by_call(session.events)
        if waited and self._turn is None:  # a run going on from a RunState, for its approvals
            await self._open_approval_turn()
        turn = self._require_turn()
        approval_id = await self._approval_of(call_id) if waited else None
        effect = self._effects.get(name, WORST_EFFECT)
        try:
            named = None if effect == READ_ONLY else self._named_key(name, arguments)
        except ValueError as exc:
            refusal = error_result(
                str(exc), ErrorInfo("IdempotencyKeyError", UNKNOWN_IDEMPOTENCY_KEY)
            )
            self._append_result(call_id, refusal)
            raise CheckpointError(
                f"session {self.session_id!r}: tool call {call_id!r} ({name}) was not "
                f"dispatched, its body did not run: {exc}"
            ) from exc
        if named is not None:
            self._named_keys[call_id] = named
        key = None if effect == READ_ONLY else self.idempotency_key(call_id)
        data = eventdata.tool_call(
            turn,
            self._step,
            call_id,
            name,
            arguments,
            effect=effect,
            idempotency_key=key,
            approval_id=approval_id,
        )
        self._call_seqs[call_id] = session.append("tool/call", data).seq
        if host.tools.get(name) is None:
            host.tools.register(Tool(name, _let_through))
        assert self._agent is not None
        execution = ToolExecution(
            call_id,
            name,
            _parse(arguments),
            self._signal,
            self._agent,
            effect=effect,
            idempotency_key=key,
        )
        failure: Exception | None = None
        try:
            result = await host.hooks.tools_execute(execution)()
        except Exception as exc:
            failure, result = exc, error_result(error_message(exc))
        if execution.body_started:
            return  # the chain let the call through: the SDK runs the body now
        self._append_result(call_id, result)
        raise CheckpointError(
            f"session {self.session_id!r}: tool call {call_id!r} ({name}) was not dispatched, "
            f"its body did not run: {_text(result)}"
        ) from failure

    def _record_result(self, call_id: str, output: object) -> None:
        if call_id not in self._call_seqs or self._turn is None:
            return
        text = output if isinstance(output, str) else str(output)
        self._append_result(call_id, ToolResult((TextBlock(text),)))

    def _end_turn(self) -> None:
        if self._turn is None:
            return
        self._end_step()
        completed: JSONObject = {"kind": "completed"}
        self.log.append("turn/end", eventdata.turn_end(self._turn, completed))
        self._turn = None

    # -- turns and steps ---------------------------------------------------------------------

    async def _open_turn(self) -> None:
        session = self.log
        turn = 1 + len(session.events.select({"turn/start"}))
        session.append("turn/start", eventdata.turn_start(turn))
        self._turn, self._step, self._step_open, self._requested = turn, 0, False, False
        self._responded, self._run_started, self._call_seqs = False, False, {}
        self._inputs, self._approval_turn = 0, False
        await self._enter_step(1)

    async def _enter_step(self, step: int) -> None:
        host, session = self._require_host(), self.log
        assert self._agent is not None
        turn = self._require_turn()
        decide = host.hooks.agent_pre_step(PreStep(self._agent, turn, step, self._signal))
        try:
            decision = await decide()
        except Exception as exc:
            raise CheckpointError(
                f"session {self.session_id!r}: the checkpoint before step {step} of turn {turn} "
                f"failed: {error_message(exc)}"
            ) from exc
        if decision.kind == "reject":
            blocked: JSONObject = {"kind": "blocked", "reason": decision.reason}
            session.append("turn/end", eventdata.turn_end(turn, blocked))
            self._turn = None
            raise CheckpointError(
                f"session {self.session_id!r}: step {step} of turn {turn} was rejected: "
                f"{decision.reason}"
            )
        session.append("step/start", eventdata.step_data(turn, step))
        self._step, self._step_open, self._requested = step, True, False

    def _end_step(self) -> None:
        if self._step_open and self._turn is not None:
            self.log.append("step/end", eventdata.step_data(self._turn, self._step))
            self._step_open = False

    def _close_open_turn(self) -> None:
        """Close the turn a failed run left open, with the events recovery would add."""
        session = self.log
        for closer in interrupted_turn_closers(session.events):
            session.append(closer.type, closer.data, source_event_seqs=closer.source_event_seqs)
        self._turn, self._step_open, self._waiting_request = None, False, None

    def _append_result(self, call_id: str, result: ToolResult) -> None:
        turn = self._require_turn()
        seq = self._call_seqs.get(call_id)
        self.log.append(
            "tool/result",
            eventdata.tool_result(turn, self._step, call_id, result),
            source_event_seqs=None if seq is None else (seq,),
        )

    def _require_turn(self) -> int:
        if self._turn is None:
            raise RuntimeError(f"session {self.session_id!r} has no open turn")
        return self._turn

    def _require_host(self) -> Host:
        if self._host is None:
            raise RuntimeError(
                f"session {self.session_id!r} is not open: use it inside 'async with'"
            )
        return self._host


# -- the host's innermost implementations ------------------------------------------------------


async def _dispatch(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
    """The innermost model adapter: the chain reached it, so the SDK may call its model."""
    nothing: tuple[StreamChunk, ...] = ()
    for chunk in nothing:
        yield chunk


_LET_THROUGH: Final = ToolResult((TextBlock("dispatched"),))


async def _let_through(execution: ToolExecution) -> ToolResult:
    """The innermost tool body: the chain reached it, so the SDK may run the real body."""
    return _LET_THROUGH


# -- reading the log and the SDK's items -------------------------------------------------------


def _transcript(events: Iterable[Any]) -> list[TResponseInputItem]:
    """The surface events of a log as SDK input items, in order."""
    items: list[dict[str, Any]] = []
    for event in events:
        if event.type == "user/message":
            data = event.data
            source = data.get("source")
            kind = source.get("kind") if isinstance(source, dict) else None
            role = kind if kind in ("system", "developer") else "user"
            text = "\n".join(eventdata.texts_of(data.get("content")))
            items.append({"role": role, "content": text})
        elif event.type == "assistant/message":
            content = eventdata.message_of(event.type, event.data).get("content")
            for block in content if isinstance(content, list) else []:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "text":
                    items.append({"role": "assistant", "content": str(block.get("text", ""))})
                elif block.get("type") == "tool-call":
                    items.append(
                        {
                            "type": "function_call",
                            "call_id": str(block.get("id")),
                            "name": str(block.get("name")),
                            "arguments": str(block.get("arguments", "")),
                        }
                    )
        elif event.type == "tool/result":
            call_id = eventdata.result_call_id(event.data)
            if call_id is None:
                continue
            message = eventdata.message_of(event.type, event.data)
            text = "\n".join(eventdata.texts_of(message.get("content")))
            error = eventdata.error_of(event.data)
            output = text if error is None else f"{error['code']}: {text}"
            items.append({"type": "function_call_output", "call_id": call_id, "output": output})
    return cast("list[TResponseInputItem]", items)


def _mapping(item: object) -> Mapping[str, Any]:
    return item if isinstance(item, Mapping) else {}


def _is_input_message(item: Mapping[str, Any]) -> bool:
    """Whether *item* is a message of the run's input (a user's, or the system's)."""
    return item.get("type", "message") == "message" and item.get("role") in (
        "user",
        "system",
        "developer",
    )


def _input_text(content: object) -> str:
    """The text of an input message's content: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    parts: Sequence[object] = content if isinstance(content, list) else []
    return "\n".join(
        str(part.get("text", ""))
        for part in parts
        if isinstance(part, Mapping) and isinstance(part.get("text"), str)
    )


def _model_name(agent: SdkAgent[Any]) -> str:
    model = agent.model
    if isinstance(model, str):
        return model
    if model is None:
        return "default"
    name = getattr(model, "model", None)
    return name if isinstance(name, str) else type(model).__name__


def _parse(arguments: str) -> JSON:
    if not arguments.strip():
        return {}
    try:
        parsed: JSON = json.loads(arguments)
    except ValueError:
        return arguments
    return parsed


def _text(result: ToolResult) -> str:
    return "\n".join(block.text for block in result.content)
