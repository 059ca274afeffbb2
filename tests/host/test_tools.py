"""The tool runtime: results, error results, abort signals and anyio cancellation."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from kai_session_checkpoint_policy import (
    AbortController,
    Agent,
    ErrorInfo,
    TextBlock,
    Tool,
    ToolError,
    ToolExecution,
    ToolResult,
    aborted_before_dispatch,
    error_result,
    hookimpl,
)
from kai_session_checkpoint_policy.host import error_message

if TYPE_CHECKING:
    from collections.abc import Generator

    from kai_session_checkpoint_policy import JSON, Host, Session
    from kai_session_checkpoint_policy.hookspecs import ToolThunk
    from kai_session_checkpoint_policy.pytest_plugin import FlushRecorder

pytestmark = pytest.mark.anyio


class BrokenWrapper:
    """A ``tools_execute`` wrapper whose thunk raises."""

    name = "broken-wrapper"

    @hookimpl(wrapper=True)
    def tools_execute(self) -> Generator[None, ToolThunk, ToolThunk]:
        yield

        async def broken() -> ToolResult:
            raise RuntimeError("wrapper broke")

        return broken


def call(
    name: str, *, agent: Agent | None = None, controller: AbortController | None = None
) -> ToolExecution:
    signal = (controller or AbortController()).signal
    return ToolExecution(f"{name}-1", name, {"value": 1}, signal, agent=agent)


def returning(name: str, value: JSON | ToolResult) -> Tool:
    async def run(execution: ToolExecution) -> JSON | ToolResult:
        return value

    return Tool(name, run)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("plain text", "plain text"),
        ({"b": [1, 2]}, '{"b": [1, 2]}'),
        (None, "null"),
        (3, "3"),
    ],
)
async def test_a_json_value_is_shown_as_text(kai_host: Host, value: JSON, text: str) -> None:
    kai_host.tools.register(returning("value", value))

    assert await kai_host.tools.execute(call("value")) == ToolResult(content=(TextBlock(text),))


async def test_a_complete_result_is_returned_as_is(kai_host: Host) -> None:
    own = ToolResult(content=(TextBlock("a"), TextBlock("b")), is_error=True)
    kai_host.tools.register(returning("own", own))

    assert await kai_host.tools.execute(call("own")) is own


async def test_a_raising_body_becomes_an_error_result(kai_host: Host) -> None:
    async def boom(execution: ToolExecution) -> JSON:
        raise ValueError("boom")

    kai_host.tools.register(Tool("boom", boom))

    assert await kai_host.tools.execute(call("boom")) == ToolResult(
        content=(TextBlock("Error: boom"),), is_error=True, error=ToolError("boom")
    )


async def test_a_raising_wrapper_becomes_an_error_result(kai_host: Host) -> None:
    kai_host.register(BrokenWrapper())
    kai_host.tools.register(returning("value", 1))

    assert await kai_host.tools.execute(call("value")) == ToolResult(
        content=(TextBlock("Error: wrapper broke"),),
        is_error=True,
        error=ToolError("wrapper broke"),
    )


async def test_an_unknown_tool_is_an_error_result_after_the_checkpoint(
    kai_host: Host, kai_session: Session, kai_flush_recorder: FlushRecorder
) -> None:
    agent = Agent(kai_host, kai_session, provider="mock", model="mock")

    result = await kai_host.tools.execute(call("nope", agent=agent))

    assert result == error_result(
        "unknown tool 'nope'", ErrorInfo("UnknownToolError", "UNKNOWN_TOOL")
    )
    assert kai_flush_recorder.flushes == ["kai-session"]


async def test_a_direct_call_without_an_agent_is_not_checkpointed(
    kai_host: Host, kai_flush_recorder: FlushRecorder
) -> None:
    kai_host.tools.register(returning("value", 1))

    assert await kai_host.tools.execute(call("value")) == ToolResult(content=(TextBlock("1"),))
    assert kai_flush_recorder.flushes == []


async def test_an_already_aborted_call_is_not_dispatched_nor_checkpointed(
    kai_host: Host, kai_session: Session, kai_flush_recorder: FlushRecorder
) -> None:
    ran: list[str] = []

    async def body(execution: ToolExecution) -> JSON:
        ran.append(execution.call_id)
        return None

    kai_host.tools.register(Tool("body", body))
    controller = AbortController()
    controller.abort("user")
    agent = Agent(kai_host, kai_session, provider="mock", model="mock")

    result = await kai_host.tools.execute(call("body", agent=agent, controller=controller))

    assert result == aborted_before_dispatch()
    assert result == ToolResult(
        content=(TextBlock("Error: tool call aborted before dispatch"),),
        is_error=True,
        error=ToolError(
            "tool call aborted before dispatch", ErrorInfo("AbortError", "ABORTED_BEFORE_DISPATCH")
        ),
    )
    assert ran == []
    assert kai_flush_recorder.flushes == []


async def test_a_success_after_an_abort_becomes_the_aborted_result(kai_host: Host) -> None:
    controller = AbortController()

    async def body(execution: ToolExecution) -> JSON:
        controller.abort("user")
        return "done anyway"

    kai_host.tools.register(Tool("body", body))

    result = await kai_host.tools.execute(call("body", controller=controller))

    assert result == error_result("tool call aborted", ErrorInfo("AbortError", "ABORTED"))


async def test_anyio_cancellation_propagates_instead_of_becoming_a_result(kai_host: Host) -> None:
    started = anyio.Event()

    async def hang(execution: ToolExecution) -> JSON:
        started.set()
        await anyio.sleep_forever()
        return None

    kai_host.tools.register(Tool("hang", hang))
    results: list[ToolResult] = []

    async def execute() -> None:
        results.append(await kai_host.tools.execute(call("hang")))

    async with anyio.create_task_group() as group:
        group.start_soon(execute)
        await started.wait()
        group.cancel_scope.cancel()

    assert group.cancel_scope.cancelled_caught
    assert results == []


async def test_tool_names_are_unique(kai_host: Host) -> None:
    kai_host.tools.register(returning("value", 1))

    with pytest.raises(ValueError, match=r"^tool 'value' is already registered$"):
        kai_host.tools.register(returning("value", 2))
    assert kai_host.tools.names() == ("value",)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (RuntimeError("disk unavailable"), "disk unavailable"),
        (KeyError(), "KeyError"),
        (Unprintable(), "<unprintable exception>"),
    ],
)
def test_error_message(exc: Exception, message: str) -> None:
    assert error_message(exc) == message
