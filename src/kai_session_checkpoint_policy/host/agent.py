"""The agent loop: turns of steps, each step one model request and the tool calls it asks for.

One turn appends, in order::

    turn/start
      (agent_pre_step) step/start [user/message] [request/header request/context]
      (llm_stream) assistant/chunk... assistant/message
      tool/call (tools_execute)...  tool/result...  step/end
      ... one step more after every step that ran tool calls ...
    turn/end

Calls to tools marked ``concurrency_safe`` that follow each other run at the same time; results
are appended in the order the model asked for them. The loop does not flush at the end of a
turn: a host that reads the log after a turn flushes the session itself.
"""

from __future__ import annotations

import json
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import anyio

from ..events import tool_result_data
from ..hookspecs import hookimpl
from .llm import Finish, LlmRequest, TextDelta, ToolCallRequest
from .signals import AbortController, AbortSignal
from .tools import ToolExecution, error_message

if TYPE_CHECKING:
    from ..events import JSON, JSONObject
    from ..hookspecs import PreStepThunk
    from ..results import ToolResult
    from ._host import Host
    from .sessions import Session

__all__ = ["Agent", "DefaultPreStep", "PreStep", "PreStepDecision", "TurnOutcome"]


@dataclass(frozen=True, slots=True)
class PreStep:
    """The step an agent is about to enter."""

    agent: Agent
    turn: int
    step: int
    signal: AbortSignal


@dataclass(frozen=True, slots=True)
class PreStepDecision:
    """Whether to enter the step; a rejection ends the turn as ``blocked``."""

    kind: Literal["enter", "reject"] = "enter"
    reason: str = ""


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
    ) -> None:
        if max_steps < 1 or max_parallel_tools < 1:
            raise ValueError("max_steps and max_parallel_tools must be at least 1")
        self.host = host
        self.session = session
        self.provider = provider
        self.model = model
        self.max_steps = max_steps
        self.max_parallel_tools = max_parallel_tools
        self._announced_route = False

    async def run_turn(self, text: str, *, signal: AbortSignal | None = None) -> TurnOutcome:
        """Run one turn for the user's *text* and return how it ended.

        An exception in a boundary (a failed checkpoint, a failing adapter) ends the turn with
        reason ``error``; anyio cancellation ends it as ``aborted`` and propagates.
        """
        signal = AbortController().signal if signal is None else signal
        session = self.session
        turn = 1 + sum(event.type == "turn/start" for event in session.events)
        session.append("turn/start", {"turn": turn})
        reason: JSONObject = {"kind": "error", "error": {"message": "turn did not finish"}}
        outcome_text, error = "", None
        try:
            for step in range(1, self.max_steps + 1):
                decision = await self.host.hooks.agent_pre_step(PreStep(self, turn, step, signal))()
                if decision.kind == "reject":
                    reason = {"kind": "blocked", "reason": decision.reason}
                    break
                session.append("step/start", {"turn": turn, "step": step})
                try:
                    if step == 1:
                        session.append("user/message", _user_message(turn, text))
                    outcome_text, calls = await self._request(turn, step)
                    await self._run_tools(turn, step, calls, signal)
                finally:
                    session.append("step/end", {"turn": turn, "step": step})
                if signal.aborted:
                    reason = {"kind": "aborted", "reason": signal.reason}
                    break
                if not calls:
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
            session.append("turn/end", {"turn": turn, "reason": reason})
        return TurnOutcome(turn, reason, outcome_text, error)

    async def _request(self, turn: int, step: int) -> tuple[str, list[ToolCallRequest]]:
        session = self.session
        if not self._announced_route:
            has_header = any(event.type == "request/header" for event in session.events)
            route = {"provider": self.provider, "model": self.model}
            header = {"config": route, "tools": list(self.host.tools.names())}
            session.append(
                "request/header",
                {"header": header, "reason": "resume" if has_header else "initial"},
            )
            session.append("request/context", route)
            self._announced_route = True
        request = LlmRequest(
            self.provider,
            self.model,
            messages=_transcript(session),
            tools=self.host.tools.names(),
            session_id=session.id,
        )
        text: list[str] = []
        calls: list[ToolCallRequest] = []
        async with aclosing(self.host.llm.stream(request)) as stream:
            async for chunk in stream:
                session.append(
                    "assistant/chunk", {"turn": turn, "step": step, "chunk": chunk.to_json()}
                )
                if isinstance(chunk, TextDelta):
                    text.append(chunk.text)
                elif isinstance(chunk, ToolCallRequest):
                    calls.append(chunk)
                elif isinstance(chunk, Finish):
                    break
        content: list[JSON] = [{"type": "text", "text": "".join(text)}] if text else []
        content += [call.to_json() for call in calls]
        message = {
            "id": f"assistant-{turn}-{step}",
            "role": "assistant",
            "content": content,
            "source": {"kind": "model", "provider": self.provider, "model": self.model},
        }
        session.append("assistant/message", {"turn": turn, "step": step, "message": message})
        return "".join(text), calls

    async def _run_tools(
        self, turn: int, step: int, calls: list[ToolCallRequest], signal: AbortSignal
    ) -> None:
        for batch in self._batches(calls):
            executions = []
            for call in batch:
                self.session.append(
                    "tool/call",
                    {
                        "turn": turn,
                        "step": step,
                        "callId": call.id,
                        "name": call.name,
                        "arguments": call.arguments,
                    },
                )
                executions.append(
                    ToolExecution(
                        call.id, call.name, _parse_arguments(call.arguments), signal, self
                    )
                )
            results = await self._execute_all(executions)
            for execution, result in zip(executions, results, strict=False):
                self.session.append(
                    "tool/result", tool_result_data(turn, step, execution.call_id, result)
                )

    def _batches(self, calls: list[ToolCallRequest]) -> list[list[ToolCallRequest]]:
        """Runs of concurrency-safe calls, and every other call alone, in model order."""
        batches: list[list[ToolCallRequest]] = []
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

    async def _execute_all(self, executions: list[ToolExecution]) -> list[ToolResult]:
        tools = self.host.tools
        if len(executions) == 1:
            return [await tools.execute(executions[0])]
        results: dict[int, ToolResult] = {}
        limiter = anyio.CapacityLimiter(self.max_parallel_tools)

        async def run(index: int) -> None:
            async with limiter:
                results[index] = await tools.execute(executions[index])

        async with anyio.create_task_group() as group:
            for index in range(len(executions)):
                group.start_soon(run, index)
        return [results[index] for index in range(len(executions))]


def _user_message(turn: int, text: str) -> JSONObject:
    return {
        "id": f"user-{turn}",
        "role": "user",
        "content": [{"type": "text", "text": text}],
        "source": {"kind": "prompt"},
    }


def _transcript(session: Session) -> tuple[JSONObject, ...]:
    """The messages a model sees: every user, assistant and tool-result message, in order."""
    messages: list[JSONObject] = []
    for event in session.events:
        if event.type == "user/message":
            messages.append(event.data)
        elif event.type in ("assistant/message", "tool/result"):
            message = event.data["message"]
            assert isinstance(message, dict)
            messages.append(message)
    return tuple(messages)


def _parse_arguments(raw: str) -> JSON:
    """Arguments as the tool receives them: parsed JSON, ``{}`` when empty, else the raw text."""
    if not raw.strip():
        return {}
    try:
        parsed: JSON = json.loads(raw)
    except ValueError:
        return raw
    return parsed
