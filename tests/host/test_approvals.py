"""Durable approvals: a turn waiting for a person's yes is killed or stopped, then resumed.

``tests/support/approval_child.py`` runs the turn in a real child process: it is killed with
SIGKILL while the person is being asked, stopped with SIGINT there, or killed after the yes is
durable and before the call starts. The session is then recovered and resumed here, where the
model asks for the same payment again: a pending question is asked again (never taken as a
yes), and a yes given before the crash is used without asking twice, once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import pytest

from kai_session_checkpoint_policy import (
    Agent,
    Finish,
    Host,
    TextDelta,
    hookimpl,
    invariant,
    policy,
    tool_call_block,
)
from kai_session_checkpoint_policy.host.approvals import ApprovalQuestion
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence

from ..support.approval_child import ARGUMENTS, PROVIDER, TOOL, make_pay_tool
from ..support.markers import MARKER_TIMEOUT, kill_at_marker, reap, wait_for_marker

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from kai_session_checkpoint_policy import JSONObject, LlmRequest, Session, StreamChunk
    from kai_session_checkpoint_policy.hookspecs import FlushThunk

pytestmark = [
    pytest.mark.crash,
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL and SIGINT are POSIX"),
]

CHILD: Final = Path(__file__).parents[1] / "support" / "approval_child.py"
SESSION: Final = "approvals"
FIRST_ASK: Final = "approval-call-1-10"  # asked right after the assistant/message at seq 9


def start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[bytes], Path]:
    marker = tmp_path / "marker"
    marker.write_text("")
    command = [sys.executable, str(CHILD), str(tmp_path / "sessions"), SESSION, mode]
    command += [str(marker), str(tmp_path / "effects")]
    child = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    return child, marker


def payments(tmp_path: Path) -> list[str]:
    effects = tmp_path / "effects"
    return effects.read_text().splitlines() if effects.exists() else []


class Retrying:
    """The model after the restart: each turn, it asks for the same payment again."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        last: Any = request.messages[-1]
        if last.get("role") == "user" and last.get("source", {}).get("kind") == "prompt":
            self.calls += 1
            for chunk in tool_call_block(0, f"call-{self.calls + 1}", TOOL, ARGUMENTS):
                yield chunk
            yield Finish("tool-calls")
        else:
            yield TextDelta("done")
            yield Finish("stop")


async def resume(
    tmp_path: Path, turns: int, answer: bool
) -> tuple[list[Any], list[ApprovalQuestion], list[ApprovalQuestion]]:
    """Recover, list the pending questions, run *turns* turns; return the log, the pending
    questions at start, and every question the person was asked."""
    backend = JsonlSessionPersistence(tmp_path / "sessions")
    asked: list[ApprovalQuestion] = []

    async def approver(question: ApprovalQuestion) -> bool:
        asked.append(question)
        return answer

    async with Host([backend, policy, invariant], autoload=False) as host:
        host.llm.register_adapter(PROVIDER, Retrying())
        host.tools.register(make_pay_tool(tmp_path / "effects"))
        stored = await backend.load(SESSION)
        session = host.sessions.create(SESSION, seed=stored.events)
        agent = Agent(host, session, provider=PROVIDER, model="m", approver=approver)
        pending = agent.pending_approvals()
        for _ in range(turns):
            await agent.run_turn("go on")
        await host.sessions.flush(session)
        return list(session.events), pending, asked


def summary(events: list[Any], start: int) -> list[tuple[str, JSONObject | str]]:
    """From *start* on: each approval and tool event with what matters of it."""
    shown: list[tuple[str, JSONObject | str]] = []
    for event in events[start:]:
        data = event.data
        if event.type.startswith("approval/"):
            shown.append((event.type, data))
        elif event.type == "tool/call":
            shown.append((event.type, {"callId": data["callId"], "approvalId": data["approvalId"]}))
        elif event.type == "tool/result":
            shown.append((event.type, data.get("error", {}).get("code", "ok")))
        elif event.type == "turn/end":
            shown.append((event.type, data["reason"]["kind"]))
    return shown


FIRST_QUESTION: Final = ApprovalQuestion(FIRST_ASK, "call-1", TOOL, ARGUMENTS)
ASKED: Final[JSONObject] = {
    "id": FIRST_ASK,
    "toolName": TOOL,
    "callId": "call-1",
    "arguments": ARGUMENTS,
}


def again(question_id: str, answer: bool) -> list[tuple[str, JSONObject | str]]:
    """The resumed turn, when the pending question is asked again and answered *answer*."""
    reason = f"asked again after a restart (first as {FIRST_ASK})"
    outcome = "allowed-once" if answer else "rejected"
    return [
        (
            "approval/asked",
            {**ASKED, "id": question_id, "callId": "call-2", "reason": reason},
        ),
        ("approval/decided", {"id": question_id, "outcome": outcome}),
        ("tool/call", {"callId": "call-2", "approvalId": question_id}),
        ("tool/result", "ok" if answer else "APPROVAL_REJECTED"),
        ("turn/end", "completed"),
    ]


@pytest.mark.parametrize("answer", [True, False])
def test_a_sigkill_while_asking_leaves_the_question_pending_and_it_is_asked_again(
    tmp_path: Path, answer: bool
) -> None:
    child, marker = start(tmp_path, "wait")
    kill_at_marker(child, marker, "asked")
    assert payments(tmp_path) == []

    events, pending, asked = anyio.run(resume, tmp_path, 1, answer)

    assert pending == [FIRST_QUESTION]
    assert summary(events, 10) == [
        ("approval/asked", ASKED),
        ("tool/result", "TOOL_NOT_STARTED"),  # recovery: the log proves the call never started
        ("turn/end", "interrupted"),
        *again(asked[0].id, answer),
    ]
    (question,) = asked
    assert (question.call_id, question.asked_before) == ("call-2", FIRST_ASK)
    assert payments(tmp_path) == (["call-2"] if answer else [])


def test_a_sigint_while_asking_records_the_stop_and_the_question_is_asked_again(
    tmp_path: Path,
) -> None:
    child, marker = start(tmp_path, "wait")
    try:
        wait_for_marker(child, marker, "asked")
        child.send_signal(signal.SIGINT)
        assert child.wait(MARKER_TIMEOUT) == 0
    finally:
        reap(child)

    events, pending, asked = anyio.run(resume, tmp_path, 1, True)

    assert pending == [FIRST_QUESTION]
    assert summary(events, 10) == [
        ("approval/asked", ASKED),
        ("approval/decided", {"id": FIRST_ASK, "outcome": "cancelled"}),
        ("tool/result", "ABORTED_BEFORE_DISPATCH"),
        ("turn/end", "aborted"),
        *again(asked[0].id, True),
    ]
    (question,) = asked
    assert (question.call_id, question.asked_before) == ("call-2", FIRST_ASK)
    assert payments(tmp_path) == ["call-2"]


def test_a_sigkill_after_the_yes_uses_it_once_without_asking_again(tmp_path: Path) -> None:
    child, marker = start(tmp_path, "decided")
    kill_at_marker(child, marker, "decided")
    assert payments(tmp_path) == []

    events, pending, asked = anyio.run(resume, tmp_path, 2, True)

    assert pending == []
    shown = summary(events, 10)
    assert shown[:4] == [
        ("approval/asked", ASKED),
        ("approval/decided", {"id": FIRST_ASK, "outcome": "allowed-once"}),
        ("tool/result", "TOOL_NOT_STARTED"),
        ("turn/end", "interrupted"),
    ]
    # The next call of the same payment runs under the yes given before the crash: not asked.
    assert shown[4:7] == [
        ("tool/call", {"callId": "call-2", "approvalId": FIRST_ASK}),
        ("tool/result", "ok"),
        ("turn/end", "completed"),
    ]
    # The yes was for one call: the one after it is asked anew.
    (question,) = asked
    assert (question.call_id, question.asked_before) == ("call-3", None)
    assert shown[7:9] == [
        ("approval/asked", {**ASKED, "id": question.id, "callId": "call-3"}),
        ("approval/decided", {"id": question.id, "outcome": "allowed-once"}),
    ]
    assert payments(tmp_path) == ["call-2", "call-3"]


# -- fail-closed, in one process ---------------------------------------------------------------


class FailingAfter:
    """A ``session_flush`` plugin that fails while the last event of the session is *kind*."""

    name = "failing-after"

    def __init__(self, kind: str) -> None:
        self.kind = kind

    @hookimpl
    def session_flush(self, session: Session) -> FlushThunk:
        async def flush() -> None:
            if session.events and session.events[-1].type == self.kind:
                raise OSError(f"disk full after {self.kind}")

        return flush


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kind", "was_asked"), [("approval/asked", False), ("approval/decided", True)]
)
async def test_a_failed_flush_fails_the_call_closed(
    tmp_path: Path, kind: str, was_asked: bool
) -> None:
    asked: list[ApprovalQuestion] = []

    async def approver(question: ApprovalQuestion) -> bool:
        asked.append(question)
        return True

    async with Host([FailingAfter(kind)], autoload=False) as host:
        host.llm.register_adapter(PROVIDER, Retrying())
        host.tools.register(make_pay_tool(tmp_path / "effects"))
        session = host.sessions.create("s")
        agent = Agent(host, session, provider=PROVIDER, model="m", approver=approver)
        outcome = await agent.run_turn("pay")

    assert outcome.reason == {
        "kind": "error",
        "error": {"message": f"disk full after {kind}", "code": "UNKNOWN"},
    }
    assert bool(asked) is was_asked  # the person is asked only once the question is durable
    assert payments(tmp_path) == []  # and the body runs only once the yes is durable
    assert summary(list(session.events), 0)[-2:] == [
        ("tool/result", "ABORTED_BEFORE_DISPATCH"),
        ("turn/end", "error"),
    ]
