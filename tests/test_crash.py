"""Hard crashes: a real child process is killed with SIGKILL at a semantic boundary.

The child is ``kai-checkpoint agent --hang-at ...``: one scripted turn of the demo agent with
the JSONL backend. It writes a marker file at the chosen point and waits forever; the parent
waits for the marker's *content* (the file is created empty beforehand, so its mere existence
means nothing), kills the child, and loads the session with recovery in this process.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from kai_session_checkpoint_policy.demo import HangAt
from kai_session_checkpoint_policy.effects import idempotency_key
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence, SessionNotFoundError
from kai_session_checkpoint_policy.results import outcome_unknown_text

from .support.markers import kill_at_marker, start_agent

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kai_session_checkpoint_policy.effects import EffectClass
    from kai_session_checkpoint_policy.events import SessionEvent

pytestmark = [
    pytest.mark.crash,
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX"),
]

SESSION = "semantic-checkpoint-crash"


def kill_at(
    tmp_path: Path, hang_at: HangAt, expected: str, *options: str, use_policy: bool = True
) -> Path:
    """Run the agent until its marker reads *expected*, SIGKILL it, and return the root."""
    child, marker = start_agent(tmp_path, SESSION, hang_at, *options, use_policy=use_policy)
    kill_at_marker(child, marker, expected)
    return tmp_path / "sessions"


def recover(root: Path) -> Sequence[SessionEvent]:
    return anyio.run(JsonlSessionPersistence(root).load, SESSION).events


def test_a_model_request_in_flight_is_durable_through_its_header(tmp_path: Path) -> None:
    loaded = recover(kill_at(tmp_path, "request", "request-dispatched"))
    assert [event.type for event in loaded] == [
        "turn/start",
        "step/start",
        "user/message",
        "request/header",
        "request/context",
        "step/end",
        "turn/end",
    ]
    assert [event.seq for event in loaded] == list(range(7))
    assert loaded[-1].data == {"turn": 1, "reason": {"kind": "interrupted"}}


def test_a_side_effecting_tool_call_is_durable_and_recovers_as_unknown(tmp_path: Path) -> None:
    root = kill_at(tmp_path, "tool", "tool-side-effect")
    loaded = recover(root)
    types = [event.type for event in loaded]
    assert types[-5:] == ["assistant/message", "tool/call", "tool/result", "step/end", "turn/end"]
    call, result = loaded[-4], loaded[-3]
    # The payment tool declares itself side-effecting: verify first, and its key is named.
    effect: tuple[EffectClass, str] = (
        "side-effecting",
        idempotency_key(SESSION, str(call.data["callId"])),
    )
    assert result.data["error"] == {
        "name": "ToolOutcomeUnknownError",
        "code": "TOOL_OUTCOME_UNKNOWN",
    }
    message = result.data["message"]
    assert isinstance(message, dict)
    assert message["source"] == {"kind": "tool", "callId": call.data["callId"]}
    assert message["content"] == [
        {
            "type": "tool-result",
            "toolCallId": call.data["callId"],
            "isError": True,
            "content": [{"type": "text", "text": f"Error: {outcome_unknown_text(*effect)}"}],
        }
    ]
    assert (call.data["effect"], call.data["idempotencyKey"]) == effect
    assert result.data["effect"] == {"class": effect[0], "idempotencyKey": effect[1]}
    assert "First verify whether the change happened" in outcome_unknown_text(*effect)
    assert [event.seq for event in loaded] == list(range(len(loaded)))
    assert (tmp_path / "ledger.jsonl").read_text().count("\n") == 1  # the payment did happen
    # Recovery is durable: a second load adds nothing.
    assert recover(root) == loaded


@pytest.mark.parametrize(
    ("hang_at", "marker"), [("request", "request-dispatched"), ("tool", "tool-side-effect")]
)
def test_without_the_policy_the_same_crash_loses_the_intent(
    tmp_path: Path, hang_at: HangAt, marker: str
) -> None:
    """The backend alone writes only when its window expires: here, never before the kill."""
    root = kill_at(tmp_path, hang_at, marker, "--batch-window", "3600", use_policy=False)
    with pytest.raises(SessionNotFoundError):
        recover(root)
    payments = tmp_path / "ledger.jsonl"
    assert payments.exists() == (hang_at == "tool")  # the payment happened; no log says so
