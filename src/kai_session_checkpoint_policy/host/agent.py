"""The agent loop: turns of steps, each step one model request and the tool calls it asks for.

One turn appends, in order::

    turn/start
      (agent_pre_step) step/start [user/message] [request/header request/context]
      (llm_stream) assistant/chunk... assistant/message
      tool/call (tools_execute)...  tool/result...  step/end
      ... one step more after every step that ran tool calls ...
    turn/end

Calls to tools marked ``concurrency_safe`` that follow each other run at the same time; results
are appended in the order the model asked for them.

Each ``tool/call`` records the effect class the call runs under and, for a class other than
``read-only``, its idempotency key: derived from the session and the call id, unless the
model's arguments name (as ``idempotency_key``) the key of an earlier call of the same tool in
this session, a retry, which then runs with that key. The argument is taken out of the
arguments the body receives; a key this session never gave that tool is refused with an error
result (``UNKNOWN_IDEMPOTENCY_KEY``), and the body does not run.

The loop does not flush at the end of a turn: a host that reads the log after a turn flushes
the session itself.
"""

from __future__ import annotations

import json
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import anyio

from .. import eventdata
from ..cancellation import current_asyncio_task
from ..contract import (
    BlockEnd,
    BlockStart,
    Finish,
    LlmRequest,
    PreStepDecision,
    ReasoningDelta,
    StreamChunk,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from ..effects import IDEMPOTENCY_KEY_ARGUMENT, READ_ONLY, idempotency_key
from ..events import SURFACE_EVENT_TYPES
from ..hookspecs import hookimpl
from ..results import (
    APPROVAL_REJECTED,
    APPROVAL_UNAVAILABLE,
    UNKNOWN_IDEMPOTENCY_KEY,
    ErrorInfo,
    aborted_before_dispatch,
    error_result,
    outcome_unknown,
)
from .approvals import ApprovalLedger, ApprovalQuestion, asked_data, decided_data
from .signals import AbortController, AbortSignal
from .tools import ToolExecution, error_message

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..events import JSON, JSONObject
    from ..hookspecs import PreStepThunk
    from ..results import ToolResult
    from ._host import Host
    from .approvals import ApprovalOutcome, Approver
    from .sessions import Session

__all__ = ["Agent", "DefaultPreStep", "PreStep", "ToolCall", "TurnOutcome"]


@dataclass(frozen=True, slots=True)
class PreStep:
    """The step an agent is about to enter."""

    agent: Agent
    turn: int
    step: int
    signal: AbortSignal


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the model asked for: a ``tool-call`` block of its message."""

    id: str
    name: str
    arguments: str
    """The raw JSON text the model produced."""


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    """How a turn ended: the ``turn/end`` reason, the last assistant text, and any error."""

    turn: int
    reason: JSONObject
    text: str
    error: Exception | None = None


class DefaultPreStep:
    """The innermost ``agent_pre_step``: always enter."""

    name = "kai-host-pre-step"

    @hookimpl(trylast=True)
    def agent_pre_step(self) -> PreStepThunk:
        return _enter


async def _enter() -> PreStepDecision:
    return PreStepDecision()


class Agent:
    """Runs turns for one live session with one model route and the host's tools."""

    def __init__(
        self,
        host: Host,
        session: Session,
        *,
        provider: str,
        model: str,
        max_steps: int = 16,
        max_parallel_tools: int = 10,
        approver: Approver | None = None,
    ) -> None:
        if max_steps < 1 or max_parallel_tools < 1:
            raise ValueError("max_steps and max_parallel_tools must be at least 1")
        self.host = host
        self.session = session
        self.provider = provider
        self.model = model
        self.max_steps = max_steps
        self.max_parallel_tools = max_parallel_tools
        self.approver = approver
        """Asks a person to approve a call of a tool that needs it; without one, none runs."""
        self._announced_route = False
        self._known = _Known()

    def pending_approvals(self) -> list[ApprovalQuestion]:
        """The approval questions of this session asked and never answered, oldest first.

        After a crash or a stop while a person was being asked, a host shows these again; none
        is ever taken as a yes. The person is asked again when the model asks for the call again.
        """
        return self._known.caught_up(self.session).approvals.pending()

    async def run_turn(self, text: str, *, signal: AbortSignal | None = None) -> TurnOutcome:
        """Run one turn for the user's *text* and return how it ended.

        An exception in a boundary (a failed checkpoint, a failing adapter) ends the turn with
        reason ``error``; anyio cancellation ends it as ``aborted`` and propagates.
        """
        signal = AbortController().signal if signal is None else signal
        # Tool calls may run in tasks of their own: they hear of a cancel() of this one at once.
        tool_signal = signal._following(current_asyncio_task())
        session = self.session
        turn = 1 + self._known.caught_up(session).turns
        session.append("turn/start", eventdata.turn_start(turn))
        reason: JSONObject = {"kind": "error", "error": {"message": "turn did not finish"}}
        outcome_text, error = "", None
        try:
            for step in range(1, self.max_steps + 1):
                decision = await self.host.hooks.agent_pre_step(PreStep(self, turn, step, signal))()
                if decision.kind == "reject":
                    reason = {"kind": "blocked", "reason": decision.reason}
                    break
                session.append("step/start", eventdata.step_data(turn, step))
                calls = _StepCalls(session, turn, step)
                try:
                    if step == 1:
                        message = eventdata.user_message(f"user-{turn}", text)
                        session.append("user/message", message)
                    outcome_text, requested = await self._request(turn, step, calls)
                    await self._run_tools(requested, tool_signal, calls)
                finally:
                    calls.close()
                    session.append("step/end", eventdata.step_data(turn, step))
                if signal.aborted:
                    reason = {"kind": "aborted", "reason": signal.reason}
                    break
                if not requested:
                    reason = {"kind": "completed"}
                    break
            else:
                reason = {"kind": "max-steps", "steps": self.max_steps}
        except Exception as exc:
            error = exc
            reason = {"kind": "error", "error": {"message": error_message(exc), "code": "UNKNOWN"}}
        except BaseException:
            reason = {"kind": "aborted", "reason": "cancelled"}
            raise
        finally:
            session.append("turn/end", eventdata.turn_end(turn, reason))
        return TurnOutcome(turn, reason, outcome_text, error)

    async def _request(
        self, turn: int, step: int, step_calls: _StepCalls
    ) -> tuple[str, list[ToolCall]]:
        session = self.session
        known = self._known.caught_up(session)
        if not self._announced_route:
            tools = self.host.tools.names()
            header = eventdata.request_header(
                self.provider, self.model, tools, resumed=known.has_header
            )
            session.append("request/header", header)
            session.append("request/context", eventdata.request_context(self.provider, self.model))
            self._announced_route = True
        request = LlmRequest(
            self.provider,
            self.model,
            messages=tuple(known.caught_up(session).messages),
            tools=self.host.tools.names(),
            session_id=session.id,
            tool_specs=self.host.tools.specs(),
        )
        response = _Response()
        chunks: list[int] = []  # the seqs of the response's chunks, which its message cites
        async with aclosing(self.host.llm.stream(request)) as stream:
            async for chunk in stream:
                data = eventdata.assistant_chunk(turn, step, chunk.to_json())
                chunks.append(session.append("assistant/chunk", data).seq)
                if response.add(chunk):
                    break
        message = eventdata.assistant_message(
            turn,
            step,
            response.content(),
            provider=self.provider,
            model=self.model,
            usage=response.usage,
        )
        session.append("assistant/message", message, source_event_seqs=chunks)
        calls = response.tool_calls()
        step_calls.asked(calls)
        return response.text(), calls

    async def _run_tools(
        self, requested: list[ToolCall], signal: AbortSignal, step_calls: _StepCalls
    ) -> None:
        for batch in self._batches(requested):
            executions: list[ToolExecution] = []
            for call in batch:
                execution, refusal = self._execution(call, signal)
                approval_id = None
                tool = self.host.tools.get(call.name)
                if refusal is None and tool is not None and tool.needs_approval:
                    approval_id, refusal = await self._approve(call)
                step_calls.started(call, execution, approval_id)
                if refusal is None:
                    executions.append(execution)
                else:
                    step_calls.finished(execution, refusal)
            if executions:
                await self._execute_all(executions, step_calls)
            step_calls.answer_finished()

    def _execution(
        self, call: ToolCall, signal: AbortSignal
    ) -> tuple[ToolExecution, ToolResult | None]:
        """The execution of *call*, with its class and key; and its refusal, if its key is bad."""
        effect = self.host.tools.effect_of(call.name)
        arguments = _parse_arguments(call.arguments)
        named: object = None
        if isinstance(arguments, dict) and IDEMPOTENCY_KEY_ARGUMENT in arguments:
            named = arguments.pop(IDEMPOTENCY_KEY_ARGUMENT)
        key = None if effect == READ_ONLY else idempotency_key(self.session.id, call.id)
        refusal = None
        if named is not None and effect != READ_ONLY:
            issued = self._known.caught_up(self.session).keys
            if isinstance(named, str) and issued.get(named) == call.name:
                key = named
            else:
                refusal = error_result(
                    f"{IDEMPOTENCY_KEY_ARGUMENT} {named!r} is not the key of an earlier call "
                    f"of {call.name!r} in this session; leave it out for a new call",
                    ErrorInfo("IdempotencyKeyError", UNKNOWN_IDEMPOTENCY_KEY),
                )
        execution = ToolExecution(
            call.id, call.name, arguments, signal, self, effect=effect, idempotency_key=key
        )
        return execution, refusal

    async def _approve(self, call: ToolCall) -> tuple[str, ToolResult | None]:
        """Ask a person about *call*, durably, unless an unused answer for it stands; return the
        id of the decision, and the refusal if it is not a yes."""
        session = self.session
        ledger = self._known.caught_up(session).approvals
        standing = ledger.standing(call.name, call.arguments)
        if standing is not None:
            return standing[0], _refusal(standing[1])
        before = ledger.pending_for(call.name, call.arguments)
        question = ApprovalQuestion(
            f"approval-{call.id}-{len(session.events)}",
            call.id,
            call.name,
            call.arguments,
            "" if before is None else f"asked again after a restart (first as {before.id})",
            None if before is None else before.id,
        )
        session.append("approval/asked", asked_data(question))
        await self.host.sessions.flush(session)  # durable before the person is asked
        outcome: ApprovalOutcome = "unavailable"
        try:
            if self.approver is not None:
                outcome = "allowed-once" if await self.approver(question) else "rejected"
        except Exception:
            outcome = "unavailable"
        except BaseException:
            session.append("approval/decided", decided_data(question.id, "cancelled"))
            raise
        session.append("approval/decided", decided_data(question.id, outcome))
        if outcome == "allowed-once":
            await self.host.sessions.flush(session)  # a yes is durable before the body runs
        return question.id, _refusal(outcome)

    def _batches(self, calls: list[ToolCall]) -> list[list[ToolCall]]:
        """Runs of concurrency-safe calls, and every other call alone, in model order."""
        batches: list[list[ToolCall]] = []
        previous_safe = False
        for call in calls:
            tool = self.host.tools.get(call.name)
            safe = tool is not None and tool.concurrency_safe
            if safe and previous_safe:
                batches[-1].append(call)
            else:
                batches.append([call])
            previous_safe = safe
        return batches

    async def _execute_all(self, executions: list[ToolExecution], step_calls: _StepCalls) -> None:
        tools = self.host.tools
        if len(executions) == 1:
            step_calls.finished(executions[0], await tools.execute(executions[0]))
            return
        limiter = anyio.CapacityLimiter(self.max_parallel_tools)

        async def run(execution: ToolExecution) -> None:
            async with limiter:
                step_calls.finished(execution, await tools.execute(execution))

        async with anyio.create_task_group() as group:
            for execution in executions:
                group.start_soon(run, execution)


class _StepCalls:
    """The tool calls the model asked for in one step, until each has its ``tool/result``.

    Results are appended in the order the model asked for the calls. A step that ends before
    every call is answered (cancelled, failed) is closed by :meth:`close`: each call that
    finished gets its result, and every other one an error result: ``ABORTED_BEFORE_DISPATCH``
    if its body never started, ``TOOL_OUTCOME_UNKNOWN`` if it did (its effect may have
    happened). So every call ends with exactly one ``tool/result``, on every path.
    """

    __slots__ = ("_call_seqs", "_executions", "_open", "_results", "_session", "_step", "_turn")

    def __init__(self, session: Session, turn: int, step: int) -> None:
        self._session = session
        self._turn = turn
        self._step = step
        self._open: list[str] = []  # unanswered call ids, in model order
        self._executions: dict[str, ToolExecution] = {}  # calls with a tool/call
        self._call_seqs: dict[str, int] = {}  # the seq of each call's tool/call
        self._results: dict[str, ToolResult] = {}  # calls that finished, not yet answered

    def asked(self, calls: Iterable[ToolCall]) -> None:
        self._open += (call.id for call in calls)

    def started(
        self, call: ToolCall, execution: ToolExecution, approval_id: str | None = None
    ) -> ToolExecution:
        """Append the ``tool/call`` of *call*, about to be dispatched as *execution*."""
        data = eventdata.tool_call(
            self._turn,
            self._step,
            call.id,
            call.name,
            call.arguments,
            effect=execution.effect,
            idempotency_key=execution.idempotency_key,
            approval_id=approval_id,
        )
        self._call_seqs[call.id] = self._session.append("tool/call", data).seq
        self._executions[execution.call_id] = execution
        return execution

    def finished(self, execution: ToolExecution, result: ToolResult) -> None:
        self._results[execution.call_id] = result

    def answer_finished(self) -> None:
        """Append the results of the calls that finished, up to the first that did not."""
        while self._open and self._open[0] in self._results:
            self._answer(self._open[0], self._results.pop(self._open[0]))

    def close(self) -> None:
        """Answer every call still open: its result, or the error result of where it stopped."""
        for call_id in tuple(self._open):
            result = self._results.pop(call_id, None)
            if result is None:
                execution = self._executions.get(call_id)
                if execution is not None and execution.body_started:
                    result = outcome_unknown(execution.effect, execution.idempotency_key)
                else:
                    result = aborted_before_dispatch()
            self._answer(call_id, result)

    def _answer(self, call_id: str, result: ToolResult) -> None:
        """Append the ``tool/result`` of *call_id*, citing its ``tool/call`` if it has one."""
        self._open.remove(call_id)
        call_seq = self._call_seqs.get(call_id)
        self._session.append(
            "tool/result",
            eventdata.tool_result(self._turn, self._step, call_id, result),
            source_event_seqs=None if call_seq is None else (call_seq,),
        )


class _Response:
    """The message a response stream makes, block by block.

    A block's ``block-end`` is authoritative; a block that never ended (the stream stopped
    early) is made of its deltas. Blocks keep the order in which they started.
    """

    __slots__ = ("_blocks", "_deltas", "_order", "usage")

    def __init__(self) -> None:
        self._order: list[int] = []
        self._blocks: dict[int, JSONObject] = {}
        self._deltas: dict[int, tuple[str, list[str], str, str]] = {}  # kind, texts, id, name
        self.usage: JSONObject | None = None

    def _start(self, index: int, kind: str, call_id: str = "", name: str = "") -> None:
        if index not in self._deltas:
            self._order.append(index)
            self._deltas[index] = (kind, [], call_id, name)

    def add(self, chunk: StreamChunk) -> bool:
        """Take *chunk* into the message; return whether the response is finished."""
        if isinstance(chunk, BlockStart):
            self._start(chunk.index, chunk.block_type)
        elif isinstance(chunk, (TextDelta, ReasoningDelta)):
            self._start(chunk.index, "text" if isinstance(chunk, TextDelta) else "reasoning")
            self._deltas[chunk.index][1].append(chunk.text)
        elif isinstance(chunk, ToolCallDelta):
            self._start(chunk.index, "tool-call")
            texts, name = self._deltas[chunk.index][1], self._deltas[chunk.index][3]
            texts.append(chunk.arguments_delta)
            self._deltas[chunk.index] = ("tool-call", texts, chunk.id, chunk.name or name)
        elif isinstance(chunk, BlockEnd):
            self._start(chunk.index, str(chunk.block.get("type")))
            self._blocks[chunk.index] = chunk.block
        elif isinstance(chunk, Usage):
            self.usage = chunk.usage
        elif isinstance(chunk, Finish):
            return True
        return False

    def content(self) -> list[JSON]:
        content: list[JSON] = []
        for index in self._order:
            block = self._blocks.get(index)
            if block is None:
                kind, texts, call_id, name = self._deltas[index]
                if kind == "tool-call":
                    if not (call_id and name):
                        continue  # a call whose id or name never came cannot be answered
                    block = {"type": kind, "id": call_id, "name": name, "arguments": "".join(texts)}
                elif texts:
                    block = {"type": kind, "text": "".join(texts)}
                else:
                    continue
            content.append(block)
        return content

    def text(self) -> str:
        return "".join(
            str(block["text"])
            for block in self.content()
            if isinstance(block, dict) and block.get("type") == "text"
        )

    def tool_calls(self) -> list[ToolCall]:
        return [
            ToolCall(str(block.get("id")), str(block.get("name")), str(block.get("arguments", "")))
            for block in self.content()
            if isinstance(block, dict) and block.get("type") == "tool-call"
        ]


_APPROVALS: Final = frozenset({"approval/asked", "approval/decided", "tool/call"})
_TRACKED: Final = SURFACE_EVENT_TYPES | _APPROVALS | {"turn/start", "request/header"}


class _Known:
    """What an agent knows of its session's log, read once: each request is derived from it
    and the events appended since, never from the whole log again."""

    __slots__ = ("approvals", "has_header", "keys", "messages", "seen", "turns")

    def __init__(self) -> None:
        self.seen = 0  # events read so far
        self.turns = 0
        self.has_header = False
        self.messages: list[JSONObject] = []  # what a model sees: the transcript
        self.keys: dict[str, str] = {}  # every idempotency key a tool/call recorded -> its tool
        self.approvals = ApprovalLedger()

    def caught_up(self, session: Session) -> _Known:
        events = session.events
        for event in events.select(_TRACKED, self.seen):
            if event.type == "turn/start":
                self.turns += 1
            elif event.type == "request/header":
                self.has_header = True
            elif event.type in _APPROVALS:
                self.approvals.take(event.type, event.data)
                key, name = event.data.get("idempotencyKey"), event.data.get("name")
                if event.type == "tool/call" and isinstance(key, str) and isinstance(name, str):
                    self.keys.setdefault(key, name)
            else:  # every user, assistant and tool-result message, in order
                self.messages.append(eventdata.message_of(event.type, event.data))
        self.seen = len(events)
        return self


def _refusal(outcome: ApprovalOutcome) -> ToolResult | None:
    """The result of a call whose approval came out as *outcome*; ``None`` for a yes."""
    if outcome == "allowed-once":
        return None
    if outcome == "rejected":
        return error_result(
            "the person asked to approve this call said no; it did not run",
            ErrorInfo("ApprovalRejectedError", APPROVAL_REJECTED),
        )
    return error_result(
        "nobody could be asked to approve this call; it did not run",
        ErrorInfo("ApprovalUnavailableError", APPROVAL_UNAVAILABLE),
    )


def _parse_arguments(raw: str) -> JSON:
    """Arguments as the tool receives them: parsed JSON, ``{}`` when empty, else the raw text."""
    if not raw.strip():
        return {}
    try:
        parsed: JSON = json.loads(raw)
    except ValueError:
        return raw
    return parsed
