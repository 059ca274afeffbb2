"""Agents SDK approval items, durable: asked before the run returns, a yes before the call.

A real child process (``openai_agents_approval_child.py``) runs an agent whose ``pay`` tool
needs approval, with the SDK's own scripted model, and is killed with SIGKILL while the person
decides, or after the yes is durable and before the call starts. The session is opened again
here and the run goes on from the ``RunState`` the child saved: a pending question is answered
anew (never taken as a yes), and a yes given before the crash is used once without asking.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest
from agents import Agent, Runner, RunState, function_tool, set_tracing_disabled
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext

from kai_session_checkpoint_policy.effects import idempotency_key
from kai_session_checkpoint_policy.host.approvals import ApprovalQuestion
from kai_session_checkpoint_policy.integrations.openai_agents import (
    CheckpointError,
    CheckpointSession,
)

from ..support.markers import kill_at_marker
from .openai_agents_approval_child import CALL, paying_agent

CHILD: Final = Path(__file__).with_name("openai_agents_approval_child.py")
SESSION: Final = "approvals"
QUESTION: Final = f"approval-{CALL}-11"  # asked right after the assistant/message at seq 10
ASKED: Final = {
    "id": QUESTION,
    "toolName": "pay",
    "callId": CALL,
    "arguments": '{"invoice":"1042"}',
}

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.crash,
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX"),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the SDK runs on asyncio only


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


def summary(session: CheckpointSession) -> list[tuple[str, Any]]:
    """Approval events, tool calls with their approval, result texts, turn ends."""
    shown: list[tuple[str, Any]] = []
    for event in session.log.events:
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


async def go_on(tmp_path: Path, session: CheckpointSession, answers: dict[str, bool]) -> str:
    """Go on from the run state the child saved, with *answers* by call id."""
    set_tracing_disabled(True)
    agent = paying_agent(tmp_path)
    state = await RunState.from_string(agent, (tmp_path / "state.json").read_text())
    for item in state.get_interruptions():
        call_id = getattr(item.raw_item, "call_id", None)
        (state.approve if answers[str(call_id)] else state.reject)(item)
    result = await Runner.run(agent, state, session=session, hooks=session.hooks)
    return str(result.final_output)


@pytest.mark.parametrize("answer", [True, False])
async def test_a_sigkill_while_the_person_decides_leaves_the_question_pending(
    tmp_path: Path, answer: bool
) -> None:
    kill_child_at(tmp_path, "asked")

    async with CheckpointSession(tmp_path / "sessions", SESSION) as session:
        # Durable before the run returned: the question, the call unanswered, the turn ended.
        assert summary(session) == [("approval/asked", ASKED), ("turn/end", "completed")]
        question = ApprovalQuestion(QUESTION, CALL, "pay", '{"invoice":"1042"}')
        assert session.pending_approvals() == [question]
        assert session.standing_approvals() == {}

        assert await go_on(tmp_path, session, {CALL: answer}) == "done"

        outcome = "allowed-once" if answer else "rejected"
        assert summary(session)[2:4] == [
            ("approval/decided", {"id": QUESTION, "outcome": outcome}),
            ("tool/call", (CALL, QUESTION))
            if answer
            else ("tool/result", "Error: Tool execution was not approved."),  # the SDK's words
        ]
        assert (session.pending_approvals(), session.standing_approvals()) == ([], {})
    assert payments(tmp_path) == (["paid invoice 1042"] if answer else [])


async def test_a_sigkill_after_the_durable_yes_uses_it_once_without_asking_again(
    tmp_path: Path,
) -> None:
    kill_child_at(tmp_path, "decided")
    assert payments(tmp_path) == []

    async with CheckpointSession(tmp_path / "sessions", SESSION) as session:
        decided = ("approval/decided", {"id": QUESTION, "outcome": "allowed-once"})
        assert summary(session) == [
            ("approval/asked", ASKED),
            ("turn/end", "completed"),
            decided,  # durable; the tool/call after it was not
            ("turn/end", "interrupted"),
        ]
        assert session.pending_approvals() == []
        standing = session.standing_approvals()
        assert standing == {CALL: True}

        assert await go_on(tmp_path, session, standing) == "done"

        shown = summary(session)
        assert shown[4:6] == [
            ("tool/call", (CALL, QUESTION)),  # under the yes given before the crash
            ("tool/result", "invoice 1042 paid"),
        ]
        assert [kind for kind, _ in shown].count("approval/decided") == 1
        assert (session.pending_approvals(), session.standing_approvals()) == ([], {})
    assert payments(tmp_path) == ["paid invoice 1042"]


# -- a retry names its key ----------------------------------------------------------------------


def charging_agent(keys: list[str], session: CheckpointSession, named: str) -> Agent[Any]:
    """Asks for ``charge-1``, then its retry ``charge-2`` naming *named*, then answers."""

    @function_tool
    async def charge(
        context: ToolContext[Any], amount: int, idempotency_key: str | None = None
    ) -> str:
        """Charge an amount; name the key of the call this one repeats, if it is a retry."""
        keys.append(session.idempotency_key(context.tool_call_id))
        return f"charged {amount}"

    steps = [
        ModelStep([function_call("charge", {"amount": 5}, call_id="charge-1")]),
        ModelStep(
            [function_call("charge", {"amount": 5, "idempotency_key": named}, call_id="charge-2")]
        ),
        ModelStep([assistant_message("done")]),
    ]
    return Agent(name="charger", model=ScriptedModel(steps), tools=[charge])


async def test_a_retry_that_names_the_first_calls_key_runs_with_it(tmp_path: Path) -> None:
    set_tracing_disabled(True)
    keys: list[str] = []
    first = idempotency_key(SESSION, "charge-1")
    effects = {"charge": "idempotent"}
    async with CheckpointSession(tmp_path, SESSION, effects=effects) as session:
        agent = charging_agent(keys, session, first)
        result = await Runner.run(agent, "charge 5", session=session, hooks=session.hooks)
        recorded = [
            (event.data["callId"], event.data["idempotencyKey"])
            for event in session.log.events
            if event.type == "tool/call"
        ]
    assert result.final_output == "done"
    assert keys == [first, first]
    assert recorded == [("charge-1", first), ("charge-2", first)]


async def test_a_key_the_session_never_gave_is_refused_before_the_body(tmp_path: Path) -> None:
    set_tracing_disabled(True)
    keys: list[str] = []
    async with CheckpointSession(tmp_path, SESSION, effects={"charge": "idempotent"}) as session:
        agent = charging_agent(keys, session, "kai-idem-made-up")
        with pytest.raises(CheckpointError) as refused:
            await Runner.run(agent, "charge 5", session=session, hooks=session.hooks)
        (last,) = [event for event in session.log.events if event.type == "tool/result"][-1:]
    assert keys == [idempotency_key(SESSION, "charge-1")]  # the retry's body never ran
    assert str(refused.value) == (
        "session 'approvals': tool call 'charge-2' (charge) was not dispatched, its body did not "
        "run: idempotency_key 'kai-idem-made-up' is not the key of an earlier call of 'charge' "
        "in this session; leave it out for a new call"
    )
    assert last.data["error"] == {
        "name": "IdempotencyKeyError",
        "code": "UNKNOWN_IDEMPOTENCY_KEY",
    }
