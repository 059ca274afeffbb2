"""Pydantic AI deferred approvals, durable: asked before anyone is asked, a yes before the body.

A real child process (``pydantic_ai_approval_child.py``) runs the agent whose ``pay`` tool needs
approval, and is killed with SIGKILL while the person decides, or after the yes is durable and
before the call starts. The session is then opened again here: the question is pending (and
never taken as a yes), or the yes stands and is used once without asking again. Also, in one
process: a no, and a retry naming its idempotency key.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import anyio
import pytest

if tuple(sys.version_info) < (3, 11):
    pytest.skip(
        "Pydantic AI 2.68, the oldest release the integration works with, needs Python 3.11",
        allow_module_level=True,
    )

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults

from kai_session_checkpoint_policy.effects import idempotency_key
from kai_session_checkpoint_policy.integrations.pydantic_ai import (
    PydanticAISession,
    current_idempotency_key,
    open_session,
)

from ..support.markers import kill_at_marker

CHILD: Final = Path(__file__).with_name("pydantic_ai_approval_child.py")
SESSION: Final = "approvals"
PAY_ID: Final = "pay-1"
QUESTION: Final = f"approval-{PAY_ID}-6"  # asked right after the assistant/message at seq 5
ASKED: Final = {
    "id": QUESTION,
    "toolName": "pay",
    "callId": PAY_ID,
    "arguments": '{"invoice":42}',
}

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.crash,
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX"),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # Pydantic AI runs on asyncio only


def kill_child_at(tmp_path: Path, mode: str) -> None:
    (tmp_path / "marker").write_text("")
    command = [sys.executable, str(CHILD), mode, str(tmp_path / "sessions"), SESSION]
    child = subprocess.Popen(
        [*command, str(tmp_path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    kill_at_marker(child, tmp_path / "marker", mode)


def payments(tmp_path: Path) -> list[str]:
    ledger = tmp_path / "ledger"
    return ledger.read_text().splitlines() if ledger.exists() else []


def paying_agent(tmp_path: Path) -> Agent[None, str | DeferredToolRequests]:
    """The child's agent: ``pay`` needs approval; the model then reports what it returned."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [part for part in messages[-1].parts if isinstance(part, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(" / ".join(str(r.content) for r in returns))])
        return ModelResponse(parts=[ToolCallPart("pay", {"invoice": 42}, tool_call_id=PAY_ID)])

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(model), output_type=[str, DeferredToolRequests]
    )

    @agent.tool_plain(requires_approval=True, metadata={"effect": "side-effecting"})
    async def pay(invoice: int) -> str:
        async with await anyio.open_file(tmp_path / "ledger", "a") as ledger:
            await ledger.write(f"paid invoice {invoice}\n")
        return f"invoice {invoice} paid"

    return agent


async def go_on(
    session: PydanticAISession,
    agent: Agent[None, str | DeferredToolRequests],
    results: DeferredToolResults | None,
) -> str | DeferredToolRequests:
    result = await agent.run(
        message_history=session.message_history,
        deferred_tool_results=results,
        capabilities=[session.capability],
    )
    return result.output


def summary(session: PydanticAISession, start: int) -> list[tuple[str, Any]]:
    """From seq *start* on: approval events, tool calls with their approval, result texts."""
    shown: list[tuple[str, Any]] = []
    for event in session.events[start:]:
        data: Any = event.data
        if event.type.startswith("approval/"):
            shown.append((event.type, data))
        elif event.type == "tool/call":
            shown.append((event.type, (data["callId"], data.get("approvalId"))))
        elif event.type == "tool/result":
            shown.append((event.type, data["message"]["content"][0]["content"][0]["text"]))
        elif event.type == "turn/end":
            shown.append((event.type, data["reason"]["kind"]))
    return shown


@pytest.mark.parametrize("answer", [True, False])
async def test_a_sigkill_while_the_person_decides_leaves_the_question_pending(
    tmp_path: Path, answer: bool
) -> None:
    kill_child_at(tmp_path, "asked")

    async with open_session(tmp_path / "sessions", SESSION) as session:
        # Durable before the run returned: the question, and the call still unanswered.
        assert summary(session, 0) == [("approval/asked", ASKED), ("turn/end", "completed")]
        pending = session.pending_approvals()
        assert pending == DeferredToolRequests(
            approvals=[ToolCallPart("pay", '{"invoice":42}', tool_call_id=PAY_ID)]
        )
        assert session.standing_approvals() is None

        agent = paying_agent(tmp_path)
        # Run on without an answer: nothing runs, and the same question stays pending.
        assert await go_on(session, agent, None) == pending
        assert session.pending_approvals() == pending
        assert payments(tmp_path) == []

        output = await go_on(session, agent, pending.build_results(approvals={PAY_ID: answer}))

        outcome = "allowed-once" if answer else "rejected"
        text = "invoice 42 paid" if answer else "The tool call was denied."
        assert output == text
        assert summary(session, 0) == [
            ("approval/asked", ASKED),
            ("turn/end", "completed"),
            ("turn/end", "completed"),  # the run without an answer: it asked nothing new
            ("approval/decided", {"id": QUESTION, "outcome": outcome}),
            *([("tool/call", (PAY_ID, QUESTION))] if answer else []),
            ("tool/result", text if answer else f"Error: {text}"),
            ("turn/end", "completed"),
        ]
        assert (session.pending_approvals(), session.standing_approvals()) == (None, None)
    assert payments(tmp_path) == (["paid invoice 42"] if answer else [])


async def test_a_sigkill_after_the_durable_yes_uses_it_once_without_asking_again(
    tmp_path: Path,
) -> None:
    kill_child_at(tmp_path, "decided")
    assert payments(tmp_path) == []

    async with open_session(tmp_path / "sessions", SESSION) as session:
        decided = ("approval/decided", {"id": QUESTION, "outcome": "allowed-once"})
        assert summary(session, 0) == [
            ("approval/asked", ASKED),
            ("turn/end", "completed"),
            decided,
            ("turn/end", "interrupted"),  # recovery: no call had started
        ]
        assert session.pending_approvals() is None
        standing = session.standing_approvals()
        assert standing == DeferredToolResults(approvals={PAY_ID: True})

        assert await go_on(session, paying_agent(tmp_path), standing) == "invoice 42 paid"

        assert summary(session, 0)[4:] == [
            ("tool/call", (PAY_ID, QUESTION)),  # under the yes given before the crash
            ("tool/result", "invoice 42 paid"),
            ("turn/end", "completed"),
        ]
        assert (session.pending_approvals(), session.standing_approvals()) == (None, None)
    assert payments(tmp_path) == ["paid invoice 42"]


async def test_a_retry_names_the_key_of_the_call_it_repeats(tmp_path: Path) -> None:
    keys: list[str | None] = []
    asked_with: list[str | None] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        count = sum(isinstance(message, ModelResponse) for message in messages)
        first = idempotency_key(SESSION, "charge-1")
        arguments: list[dict[str, Any]] = [
            {"amount": 5},
            {"amount": 5, "idempotency_key": first},
            {"amount": 5, "idempotency_key": "kai-idem-made-up"},
        ]
        if count < len(arguments):
            asked_with.append(arguments[count].get("idempotency_key"))
            call = ToolCallPart("charge", arguments[count], tool_call_id=f"charge-{count + 1}")
            return ModelResponse(parts=[call])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model))

    @agent.tool_plain(metadata={"effect": "idempotent"}, retries=1)
    async def charge(amount: int, idempotency_key: str | None = None) -> str:
        keys.append(current_idempotency_key())
        return f"charged {amount}"

    async with open_session(tmp_path / "sessions", SESSION) as session:
        await agent.run("charge 5", capabilities=[session.capability])
        recorded = [
            (event.data["callId"], event.data["idempotencyKey"])
            for event in session.events
            if event.type == "tool/call"
        ]
        results: list[str] = [
            str(summary_text) for kind, summary_text in summary(session, 0) if kind == "tool/result"
        ]
    first = idempotency_key(SESSION, "charge-1")
    assert keys == [first, first]  # the retry ran with the first call's key
    assert recorded == [("charge-1", first), ("charge-2", first)]
    assert results[:2] == ["charged 5", "charged 5"]
    assert "'kai-idem-made-up' is not the key of an earlier call of 'charge'" in results[2]
