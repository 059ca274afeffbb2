"""The agent loop with the policy loaded: event order, tool concurrency, failures, cancellation.

The host comes from this package's pytest plugin (``kai_host``): a flush recorder as the
persistence backend, the policy, and a recording adapter for provider ``mock``. An event
recorder appends every event type to the same ``kai_order`` list, so one list shows events,
flushes, adapter starts and tool bodies in the order they happened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from kai_session_checkpoint_policy import (
    AbortController,
    Agent,
    Finish,
    SessionEvent,
    TextDelta,
    Tool,
    ToolExecution,
    TurnOutcome,
    hookimpl,
    tool_call_block,
)
from kai_session_checkpoint_policy.effects import idempotency_key

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from kai_session_checkpoint_policy import (
        JSON,
        Host,
        JSONObject,
        LlmRequest,
        Session,
        StreamChunk,
    )
    from kai_session_checkpoint_policy.pytest_plugin import FlushRecorder, RecordingAdapter

pytestmark = pytest.mark.anyio

CHECKPOINT = ("flush:start", "flush:end")


class EventOrder:
    """Appends the type of every appended event to the shared order list."""

    name = "event-order"

    def __init__(self, order: list[str]) -> None:
        self.order = order

    @hookimpl
    def session_event(self, event: SessionEvent) -> None:
        self.order.append(event.type)


class FailFlushesAfter:
    """Makes the flush recorder fail every flush once an event of *event_type* is appended."""

    name = "fail-flushes-after"

    def __init__(self, event_type: str, recorder: FlushRecorder, error: Exception) -> None:
        self.event_type = event_type
        self.recorder = recorder
        self.error = error

    @hookimpl
    def session_event(self, event: SessionEvent) -> None:
        if event.type == self.event_type:
            self.recorder.fail_with(self.error)


def tool(name: str, order: list[str], *, safe: bool = False) -> Tool:
    async def run(execution: ToolExecution) -> JSON:
        order.append(f"tool:{name}")
        return execution.arguments

    return Tool(name, run, concurrency_safe=safe)


def types(session: Session) -> list[str]:
    return [event.type for event in session.events]


def only(session: Session, event_type: str) -> list[SessionEvent]:
    return [event for event in session.events if event.type == event_type]


def result_text(event: SessionEvent) -> JSON:
    message = event.data["message"]
    assert isinstance(message, dict)
    content = message["content"]
    assert isinstance(content, list)
    (block,) = content
    assert isinstance(block, dict)
    return block


@pytest.fixture
def agent(kai_host: Host, kai_session: Session, kai_order: list[str]) -> Agent:
    kai_host.register(EventOrder(kai_order))
    return Agent(kai_host, kai_session, provider="mock", model="mock-1")


async def test_one_turn_with_a_tool_call_and_a_final_answer(
    agent: Agent,
    kai_host: Host,
    kai_session: Session,
    kai_order: list[str],
    kai_recording_adapter: RecordingAdapter,
    kai_flush_recorder: FlushRecorder,
) -> None:
    kai_host.tools.register(tool("echo", kai_order))
    kai_recording_adapter.script(
        TextDelta("Checking."),
        *tool_call_block(1, "call-1", "echo", '{"x": 1}'),
        Finish("tool-calls"),
    )
    kai_recording_adapter.script(TextDelta("Done."), Finish("stop"))

    outcome = await agent.run_turn("Echo one.")

    assert outcome == TurnOutcome(1, {"kind": "completed"}, "Done.")
    assert kai_order == [
        "turn/start",
        *CHECKPOINT,
        "step/start",
        "user/message",
        "request/header",
        "request/context",
        *CHECKPOINT,
        "adapter",
        *["assistant/chunk"] * 5,
        "assistant/message",
        "tool/call",
        *CHECKPOINT,
        "tool:echo",
        "tool/result",
        "step/end",
        *CHECKPOINT,
        "step/start",
        *CHECKPOINT,
        "adapter",
        *["assistant/chunk"] * 2,
        "assistant/message",
        "step/end",
        "turn/end",
    ]
    assert [event.seq for event in kai_session.events] == list(range(len(kai_session.events)))
    assert kai_flush_recorder.flushes == ["kai-session"] * 5
    (call,) = only(kai_session, "tool/call")
    assert call.data == {
        "turn": 1,
        "step": 1,
        "callId": "call-1",
        "name": "echo",
        "arguments": '{"x": 1}',
        "effect": "open-world",  # the echo tool declares nothing: the worst case
        "idempotencyKey": idempotency_key("kai-session", "call-1"),
    }
    (result,) = only(kai_session, "tool/result")
    assert result_text(result) == {
        "type": "tool-result",
        "toolCallId": "call-1",
        "isError": False,
        "content": [{"type": "text", "text": '{"x": 1}'}],
    }
    second_request = kai_recording_adapter.requests[1]
    assert [message["role"] for message in second_request.messages] == [
        "user",
        "assistant",
        "user",
    ]
    assert only(kai_session, "turn/end")[0].data == {"turn": 1, "reason": {"kind": "completed"}}


async def test_safe_tools_run_concurrently_and_results_keep_model_order(
    agent: Agent,
    kai_host: Host,
    kai_session: Session,
    kai_recording_adapter: RecordingAdapter,
) -> None:
    bodies: list[str] = []
    arrived = 0
    both_arrived = anyio.Event()
    fast_done = anyio.Event()

    async def slow(execution: ToolExecution) -> JSON:
        await arrive("slow")
        await fast_done.wait()
        bodies.append("slow:end")
        return "slow result"

    async def fast(execution: ToolExecution) -> JSON:
        await arrive("fast")
        bodies.append("fast:end")
        fast_done.set()
        return "fast result"

    async def arrive(name: str) -> None:
        nonlocal arrived
        bodies.append(f"{name}:start")
        arrived += 1
        if arrived == 2:
            both_arrived.set()
        await both_arrived.wait()

    kai_host.tools.register(Tool("slow", slow, concurrency_safe=True))
    kai_host.tools.register(Tool("fast", fast, concurrency_safe=True))
    kai_recording_adapter.script(
        *tool_call_block(0, "call-slow", "slow"),
        *tool_call_block(1, "call-fast", "fast"),
        Finish("stop"),
    )

    with anyio.fail_after(10):
        await agent.run_turn("Run both.")

    assert sorted(bodies[:2]) == ["fast:start", "slow:start"]
    assert bodies[2:] == ["fast:end", "slow:end"]
    assert [event.data["callId"] for event in only(kai_session, "tool/call")] == [
        "call-slow",
        "call-fast",
    ]
    assert [result_text(event) for event in only(kai_session, "tool/result")] == [
        {
            "type": "tool-result",
            "toolCallId": "call-slow",
            "isError": False,
            "content": [{"type": "text", "text": "slow result"}],
        },
        {
            "type": "tool-result",
            "toolCallId": "call-fast",
            "isError": False,
            "content": [{"type": "text", "text": "fast result"}],
        },
    ]
    step = types(kai_session)
    assert step[step.index("tool/call") :][:4] == [
        "tool/call",
        "tool/call",
        "tool/result",
        "tool/result",
    ]


async def test_an_exclusive_tool_runs_alone(
    agent: Agent, kai_host: Host, kai_recording_adapter: RecordingAdapter
) -> None:
    bodies: list[str] = []

    def traced(name: str, *, safe: bool) -> Tool:
        async def run(execution: ToolExecution) -> JSON:
            bodies.append(f"{execution.call_id}:start")
            await anyio.lowlevel.checkpoint()
            bodies.append(f"{execution.call_id}:end")
            return None

        return Tool(name, run, concurrency_safe=safe)

    kai_host.tools.register(traced("read", safe=True))
    kai_host.tools.register(traced("write", safe=False))
    kai_recording_adapter.script(
        *tool_call_block(0, "read-1", "read"),
        *tool_call_block(1, "read-2", "read"),
        *tool_call_block(2, "write-1", "write"),
        *tool_call_block(3, "read-3", "read"),
        Finish("stop"),
    )

    await agent.run_turn("Read, write, read.")

    assert sorted(bodies[:2]) == ["read-1:start", "read-2:start"]
    assert sorted(bodies[2:4]) == ["read-1:end", "read-2:end"]
    assert bodies[4:] == ["write-1:start", "write-1:end", "read-3:start", "read-3:end"]


async def test_a_failed_pre_step_checkpoint_ends_the_turn_before_any_request(
    agent: Agent,
    kai_session: Session,
    kai_flush_recorder: FlushRecorder,
    kai_recording_adapter: RecordingAdapter,
) -> None:
    failure = OSError("disk unavailable")
    kai_flush_recorder.fail_with(failure)

    outcome = await agent.run_turn("Hello.")

    reason: JSONObject = {
        "kind": "error",
        "error": {"message": "disk unavailable", "code": "UNKNOWN"},
    }
    assert outcome == TurnOutcome(1, reason, "", failure)
    assert outcome.error is failure
    assert types(kai_session) == ["turn/start", "turn/end"]
    assert kai_session.events[-1].data == {"turn": 1, "reason": reason}
    assert kai_recording_adapter.requests == []


async def test_a_failed_request_checkpoint_ends_the_step_and_turn_before_the_adapter(
    agent: Agent,
    kai_host: Host,
    kai_session: Session,
    kai_order: list[str],
    kai_flush_recorder: FlushRecorder,
    kai_recording_adapter: RecordingAdapter,
) -> None:
    failure = OSError("disk unavailable")
    kai_host.register(FailFlushesAfter("request/context", kai_flush_recorder, failure))

    outcome = await agent.run_turn("Hello.")

    reason: JSONObject = {
        "kind": "error",
        "error": {"message": "disk unavailable", "code": "UNKNOWN"},
    }
    assert outcome.error is failure
    assert types(kai_session) == [
        "turn/start",
        "step/start",
        "user/message",
        "request/header",
        "request/context",
        "step/end",
        "turn/end",
    ]
    assert kai_session.events[-1].data == {"turn": 1, "reason": reason}
    assert kai_recording_adapter.requests == []
    assert kai_order == [
        "turn/start",
        *CHECKPOINT,
        "step/start",
        "user/message",
        "request/header",
        "request/context",
        "flush:start",
        "flush:failed",
        "step/end",
        "turn/end",
    ]


async def test_a_failed_tool_checkpoint_becomes_an_error_result_and_the_body_never_runs(
    agent: Agent,
    kai_host: Host,
    kai_session: Session,
    kai_order: list[str],
    kai_flush_recorder: FlushRecorder,
    kai_recording_adapter: RecordingAdapter,
) -> None:
    kai_host.tools.register(tool("write", kai_order))
    kai_host.register(
        FailFlushesAfter("tool/call", kai_flush_recorder, OSError("disk unavailable"))
    )
    kai_recording_adapter.script(*tool_call_block(0, "write-1", "write"), Finish("tool-calls"))

    outcome = await agent.run_turn("Write.")

    assert "tool:write" not in kai_order
    (result,) = only(kai_session, "tool/result")
    assert result.data["turn"] == 1
    assert "error" not in result.data
    assert result_text(result) == {
        "type": "tool-result",
        "toolCallId": "write-1",
        "isError": True,
        "content": [{"type": "text", "text": "Error: disk unavailable"}],
    }
    assert types(kai_session)[-4:] == ["tool/call", "tool/result", "step/end", "turn/end"]
    assert outcome.reason == {
        "kind": "error",
        "error": {"message": "disk unavailable", "code": "UNKNOWN"},
    }
    assert kai_recording_adapter.requests[1:] == []


async def test_a_nested_dispatch_reuses_the_outer_checkpoint(
    agent: Agent,
    kai_host: Host,
    kai_order: list[str],
    kai_flush_recorder: FlushRecorder,
    kai_recording_adapter: RecordingAdapter,
) -> None:
    kai_host.tools.register(tool("echo", kai_order))

    async def run_code(execution: ToolExecution) -> JSON:
        kai_order.append("tool:run_code")
        nested = ToolExecution(
            f"{execution.call_id}:code:1",
            "echo",
            {"nested": True},
            execution.signal,
            agent=execution.agent,
            parent=execution,
        )
        result = await kai_host.tools.execute(nested)
        return result.content[0].text

    kai_host.tools.register(Tool("run_code", run_code))
    kai_recording_adapter.script(*tool_call_block(0, "code-1", "run_code"), Finish("tool-calls"))

    await agent.run_turn("Run code.")

    tool_part = kai_order[kai_order.index("tool/call") : kai_order.index("tool/result") + 1]
    assert tool_part == ["tool/call", *CHECKPOINT, "tool:run_code", "tool:echo", "tool/result"]
    assert kai_flush_recorder.flushes == ["kai-session"] * 5


async def test_an_aborted_signal_ends_the_turn_as_aborted(
    agent: Agent, kai_host: Host, kai_session: Session, kai_recording_adapter: RecordingAdapter
) -> None:
    controller = AbortController()

    async def stop(execution: ToolExecution) -> JSON:
        controller.abort("user")
        return None

    kai_host.tools.register(Tool("stop", stop))
    kai_recording_adapter.script(*tool_call_block(0, "stop-1", "stop"), Finish("tool-calls"))

    outcome = await agent.run_turn("Stop.", signal=controller.signal)

    assert outcome.reason == {"kind": "aborted", "reason": "user"}
    assert types(kai_session)[-3:] == ["tool/result", "step/end", "turn/end"]
    (result,) = only(kai_session, "tool/result")
    assert result.data["error"] == {"name": "AbortError", "code": "ABORTED"}
    assert len(kai_recording_adapter.requests) == 1


async def test_cancelling_a_turn_appends_an_aborted_turn_end_and_propagates(
    kai_host: Host, kai_session: Session
) -> None:
    dispatched = anyio.Event()

    async def hang(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        dispatched.set()
        await anyio.sleep_forever()
        yield Finish("stop")

    kai_host.llm.register_adapter("hang", hang)
    agent = Agent(kai_host, kai_session, provider="hang", model="hang")
    finished: list[TurnOutcome] = []

    async def run() -> None:
        finished.append(await agent.run_turn("Wait."))

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await dispatched.wait()
        group.cancel_scope.cancel()

    assert group.cancel_scope.cancelled_caught
    assert finished == []
    assert types(kai_session)[-3:] == ["request/context", "step/end", "turn/end"]
    assert kai_session.events[-1].data == {
        "turn": 1,
        "reason": {"kind": "aborted", "reason": "cancelled"},
    }
