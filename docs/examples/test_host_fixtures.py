"""Testing a host with the package's pytest fixtures (they come with the installed package).

python -m pytest docs/examples/test_host_fixtures.py
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from kai_session_checkpoint_policy import Agent, Finish, TextDelta, Tool, tool_call_block

if TYPE_CHECKING:
    from kai_session_checkpoint_policy import Host, Session, ToolExecution
    from kai_session_checkpoint_policy.pytest_plugin import FlushRecorder, RecordingAdapter

pytestmark = pytest.mark.anyio


# example: start
async def test_the_payment_runs_only_after_its_checkpoint(
    kai_host: Host,
    kai_session: Session,
    kai_order: list[str],
    kai_recording_adapter: RecordingAdapter,
) -> None:
    async def pay(execution: ToolExecution) -> str:
        kai_order.append("tool")
        return "paid"

    kai_host.tools.register(Tool("pay", pay))
    kai_recording_adapter.script(*tool_call_block(0, "call-1", "pay"), Finish("tool-calls"))
    kai_recording_adapter.script(TextDelta("Paid."), Finish("stop"))

    outcome = await Agent(kai_host, kai_session, provider="mock", model="m").run_turn("Pay.")

    assert outcome.reason == {"kind": "completed"}
    assert kai_order == [
        *("flush:start", "flush:end"),  # before step 1
        *("flush:start", "flush:end", "adapter"),  # before the first request
        *("flush:start", "flush:end", "tool"),  # before the tool body
        *("flush:start", "flush:end"),  # before step 2
        *("flush:start", "flush:end", "adapter"),  # before the second request
    ]


# example: end


async def test_a_failed_checkpoint_stops_the_turn_before_the_model(
    kai_host: Host,
    kai_session: Session,
    kai_order: list[str],
    kai_flush_recorder: FlushRecorder,
) -> None:
    kai_flush_recorder.fail_with(OSError("disk full"))

    outcome = await Agent(kai_host, kai_session, provider="mock", model="m").run_turn("Hi.")

    assert outcome.reason["kind"] == "error"
    assert kai_order == ["flush:start", "flush:failed"]  # the adapter never ran


async def test_the_request_waits_for_a_slow_checkpoint(
    kai_host: Host,
    kai_session: Session,
    kai_order: list[str],
    kai_flush_recorder: FlushRecorder,
) -> None:
    agent = Agent(kai_host, kai_session, provider="mock", model="m")
    async with anyio.create_task_group() as group:
        gate = kai_flush_recorder.hold()
        group.start_soon(agent.run_turn, "Hi.")
        await anyio.wait_all_tasks_blocked()
        assert kai_order == ["flush:start"]  # the turn waits inside the first checkpoint
        gate.release()
    assert kai_order[-1] == "adapter"
