"""The conformance kit fails a host that breaks the guarantee, and names the rule it breaks.

Each broken host is the host of ``third_party_host.py`` with one thing done wrong; the kit
drives one turn through it and fails it, the rule it breaks named first. One more variant does a
thing differently but right (its tool calls run at once), and passes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from kai_session_checkpoint_policy import eventdata
from kai_session_checkpoint_policy.conformance import ConformanceError, check_turn
from kai_session_checkpoint_policy.contract import BlockEnd

from .support.third_party_host import (
    Conversation,
    Conversations,
    Invocation,
    MiniHost,
    Prompt,
    Worker,
    factory_of,
    host_under_test,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kai_session_checkpoint_policy.events import JSONObject
    from kai_session_checkpoint_policy.hookspecs import StreamThunk, ToolThunk

pytestmark = pytest.mark.anyio


class LateToolCallHost(MiniHost):
    """Records a call's ``tool/call`` after its body has run, with its result."""

    async def call_tool(
        self, session: Conversation, turn: int, step: int, call: JSONObject
    ) -> None:
        call_id, name, arguments = str(call["id"]), str(call["name"]), str(call["arguments"])
        run: ToolThunk = self.manager.hook.tools_execute(
            execution=Invocation(Worker(session), call_id, name, arguments), host=self
        )
        result = await run()
        data = eventdata.tool_call(turn, step, call_id, name, arguments)
        started = session.record("tool/call", data)
        answer = eventdata.tool_result(turn, step, call_id, result)
        session.record("tool/result", answer, sources=[started.seq])


class Unannounced(Conversations):
    def _announce(self, session: Conversation, event: object) -> None:
        pass  # never calls session_event


class SilentHost(MiniHost):
    """Appends its events without announcing them with ``session_event``."""

    def __init__(self, plugins: Sequence[object] = ()) -> None:
        super().__init__(plugins)
        self.sessions = Unannounced(self.manager, self)


class Unflushed(Conversations):
    async def flush(self, session: Conversation) -> bool:
        return False  # never calls session_flush


class NoFlushHost(MiniHost):
    """Its ``sessions.flush`` returns at once, without calling ``session_flush``."""

    def __init__(self, plugins: Sequence[object] = ()) -> None:
        super().__init__(plugins)
        self.sessions = Unflushed(self.manager, self)


class NoPreStepHost(MiniHost):
    """Enters every step without calling ``agent_pre_step``."""

    async def enter_step(self, session: Conversation) -> bool:
        return True


class StreamOnlyHost(MiniHost):
    """Records the chunks of a response, never its ``assistant/message``."""

    async def request(
        self, session: Conversation, turn: int, step: int, text: str
    ) -> list[JSONObject]:
        prompt = Prompt(session.id, text)
        stream: StreamThunk = self.manager.hook.llm_stream(request=prompt, host=self)
        blocks: list[JSONObject] = []
        async for chunk in stream():
            data = eventdata.assistant_chunk(turn, step, chunk.to_json())
            session.record("assistant/chunk", data)
            if isinstance(chunk, BlockEnd):
                blocks.append(chunk.block)
        return blocks


class ParallelToolsHost(MiniHost):
    """Runs the tool calls of a response at once, each checkpointed on its own (not broken)."""

    def __init__(self, plugins: Sequence[object] = ()) -> None:
        super().__init__(plugins)
        self.pending: list[JSONObject] = []  # the calls of the last response, not yet started

    async def request(
        self, session: Conversation, turn: int, step: int, text: str
    ) -> list[JSONObject]:
        blocks = await super().request(session, turn, step, text)
        self.pending = [block for block in blocks if block["type"] == "tool-call"]
        return blocks

    async def call_tool(
        self, session: Conversation, turn: int, step: int, call: JSONObject
    ) -> None:
        calls, self.pending = self.pending, []  # the first call starts them all
        async with anyio.create_task_group() as group:
            for each in calls:
                group.start_soon(super().call_tool, session, turn, step, each)


def writing_a_host() -> str:
    return (Path(__file__).resolve().parent.parent / "docs" / "writing-a-host.md").read_text()


async def broken_rules(host_type: type[MiniHost], root: Path) -> ConformanceError:
    with pytest.raises(ConformanceError) as caught:
        await check_turn(factory_of(host_type), root)
    return caught.value


async def test_the_host_that_follows_the_recipe_passes(tmp_path: Path) -> None:
    script = await check_turn(host_under_test, tmp_path)
    assert (script.requests, script.steps, script.bodies) == (2, 2, ["c1", "c2"])
    assert script.violations == []
    types = [event.type for event in script.announced]
    assert types[:4] == ["turn/start", "step/start", "user/message", "assistant/chunk"]
    assert types[-2:] == ["step/end", "turn/end"]


async def test_a_host_that_runs_its_calls_at_once_passes(tmp_path: Path) -> None:
    """A sibling's ``tool/result``, appended while the kit reads the store at a tool body's
    start, is not due at that body."""
    script = await check_turn(factory_of(ParallelToolsHost), tmp_path)
    assert sorted(script.bodies) == ["c1", "c2"]
    results = [event for event in script.announced if event.type == "tool/result"]
    assert len(results) == 2


async def test_a_tool_call_recorded_after_the_body_fails_the_tool_call_rule(
    tmp_path: Path,
) -> None:
    error = await broken_rules(LateToolCallHost, tmp_path)
    first = error.violations[0]
    assert first.rule == "tool-call"
    assert first.message.startswith(
        "the tool/call of call 'c1' was not durable when the tool body started: it had not "
        "been appended (or not announced with session_event) by then"
    )
    assert str(error).splitlines()[0] == str(first)
    assert f"```text\n{first}\n```" in writing_a_host()  # the page quotes it
    assert error.rules == ("tool-call", "outcome-unknown")
    assert (
        "a crash while the tool body of call 'c1' runs would be recovered as TOOL_NOT_STARTED "
        "(the model would be told it had no effect and may be retried), not "
        "TOOL_OUTCOME_UNKNOWN"
    ) in str(error)


async def test_a_host_that_never_calls_session_event_fails_the_announce_rule(
    tmp_path: Path,
) -> None:
    error = await broken_rules(SilentHost, tmp_path)
    assert error.violations[0].rule == "announced"
    assert error.violations[0].message == (
        "the host announced no event of session 'conformance' with the session_event hook "
        "before the model adapter's stream was pulled (model request 1): a backend writes "
        "only the appends it hears of"
    )
    assert {"request", "tool-call", "outcome-unknown", "step-results"} <= set(error.rules)


async def test_a_flush_that_does_nothing_fails_at_the_first_boundary(tmp_path: Path) -> None:
    error = await broken_rules(NoFlushHost, tmp_path)
    first = error.violations[0]
    assert first.rule == "durable-log"
    assert first.message.startswith(
        "the session log was not durable when the agent_pre_step hook let step 1 begin: the "
        "backend held 0 events, and seqs 0-0 (turn/start) announced before were not among "
        "them: it was announced (seq 0), but the session_flush hook was not called for the "
        "session after that"
    )
    assert error.rules[:3] == ("durable-log", "request", "tool-call")


async def test_a_host_that_skips_the_pre_step_hook_fails_the_pre_step_rule(
    tmp_path: Path,
) -> None:
    error = await broken_rules(NoPreStepHost, tmp_path)
    assert str(error).splitlines() == [
        "model request 1 was sent without the agent_pre_step hook deciding on its step first "
        "(the hook ran 0 times): call it before every step [pre-step: the agent_pre_step hook "
        "decides on every step before the step's model request]",
        "then: model request 2 was sent without the agent_pre_step hook deciding on its step "
        "first (the hook ran 0 times): call it before every step [pre-step]",
    ]


async def test_a_log_without_the_assistant_message_fails_the_recovery_rule(
    tmp_path: Path,
) -> None:
    error = await broken_rules(StreamOnlyHost, tmp_path)
    assert error.rules == ("outcome-unknown",)
    assert error.violations[0].message.startswith(
        "a crash while the tool body of call 'c1' runs would be recovered as nothing (the call "
        "would vanish from the model's context), not TOOL_OUTCOME_UNKNOWN"
    )
