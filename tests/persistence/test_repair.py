"""Crash repair: which events close a turn that a crash left open."""

from __future__ import annotations

from kai_session_checkpoint_policy import eventdata
from kai_session_checkpoint_policy.events import JSONObject, SessionEvent
from kai_session_checkpoint_policy.persistence import (
    NOT_STARTED_TEXT,
    OUTCOME_UNKNOWN_TEXT,
    interrupted_turn_closers,
)
from kai_session_checkpoint_policy.results import EffectInfo, outcome_unknown

from ..support.persistence_helpers import COMPLETE_TURN, assistant, events, tool_call, tool_result

UNKNOWN = {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"}
OPEN_TURN_2: list[tuple[str, JSONObject]] = [
    ("turn/start", {"turn": 1}),
    ("turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
    ("turn/start", {"turn": 2}),
    ("step/start", {"turn": 2, "step": 1}),
]


def summary(closers: tuple[SessionEvent, ...]) -> list[tuple[str, int, JSONObject]]:
    return [(closer.type, closer.seq, closer.data) for closer in closers]


def test_a_balanced_or_empty_log_needs_nothing() -> None:
    assert interrupted_turn_closers(events(*COMPLETE_TURN)) == ()
    assert interrupted_turn_closers([]) == ()


def test_an_open_turn_without_a_step_gets_turn_end() -> None:
    closers = interrupted_turn_closers(events(("turn/start", {"turn": 1})))
    assert summary(closers) == [
        ("turn/end", 1, {"turn": 1, "reason": {"kind": "interrupted"}}),
    ]


def test_an_open_step_gets_step_end_then_turn_end() -> None:
    logged = events(("turn/start", {"turn": 1}), ("step/start", {"turn": 1, "step": 1}))
    assert summary(interrupted_turn_closers(logged)) == [
        ("step/end", 2, {"turn": 1, "step": 1}),
        ("turn/end", 3, {"turn": 1, "reason": {"kind": "interrupted"}}),
    ]


def test_closers_reuse_the_last_event_time() -> None:
    logged = events(("turn/start", {"turn": 1}), ("step/start", {"turn": 1, "step": 1}))
    assert {closer.time for closer in interrupted_turn_closers(logged)} == {logged[-1].time}


def test_a_call_without_tool_call_was_not_started() -> None:
    logged = events(OPEN_TURN_2[0], OPEN_TURN_2[2], OPEN_TURN_2[3], assistant(2, 1, "c1"))
    closers = interrupted_turn_closers(logged)
    assert [(c.type, c.seq) for c in closers] == [
        ("tool/result", 4),
        ("step/end", 5),
        ("turn/end", 6),
    ]
    assert closers[0].data == {
        "turn": 2,
        "step": 1,
        "message": {
            "id": "interrupted-tool-result-c1-4",
            "role": "user",
            "source": {"kind": "tool", "callId": "c1"},
            "content": [
                {
                    "type": "tool-result",
                    "toolCallId": "c1",
                    "isError": True,
                    "content": [{"type": "text", "text": f"Error: {NOT_STARTED_TEXT}"}],
                }
            ],
        },
        "error": {"name": "ToolNotStartedError", "code": "TOOL_NOT_STARTED"},
    }
    # Nothing was recorded for the call to cite; like every closer, its surfaceOp comes first.
    assert (closers[0].surface_op, closers[0].source_event_seqs) == ("append", None)
    assert closers[0].encode().endswith(',"surfaceOp":"append"}')
    assert [(c.surface_op, c.source_event_seqs) for c in closers[1:]] == [(None, None)] * 2


def test_after_a_cut_tail_a_call_without_tool_call_has_an_unknown_outcome() -> None:
    """The cut bytes may have held the call's tool/call: nothing proves it never started."""
    logged = events(*OPEN_TURN_2, assistant(2, 1, "c1", "c2"), tool_call(2, 1, "c2"))
    for tail_cut, first in ((False, "TOOL_NOT_STARTED"), (True, "TOOL_OUTCOME_UNKNOWN")):
        closers = interrupted_turn_closers(logged, tail_cut=tail_cut)
        assert [(c.type, c.seq) for c in closers] == [
            ("tool/result", 6),
            ("tool/result", 7),
            ("step/end", 8),
            ("turn/end", 9),
        ]
        assert [c.data["error"]["code"] for c in closers[:2]] == [  # type: ignore[call-overload,index]
            first,
            "TOOL_OUTCOME_UNKNOWN",
        ]


def test_a_recorded_call_without_result_has_an_unknown_outcome() -> None:
    logged = events(*OPEN_TURN_2, assistant(2, 1, "c1"), tool_call(2, 1, "c1"))
    result, step_end, turn_end = interrupted_turn_closers(logged)
    assert (result.type, result.seq, step_end.type, turn_end.type) == (
        "tool/result",
        6,
        "step/end",
        "turn/end",
    )
    assert result.data["error"] == {
        "name": "ToolOutcomeUnknownError",
        "code": "TOOL_OUTCOME_UNKNOWN",
    }
    # Marked as a repair in its id, citing the tool/call it answers, as the original writes it.
    assert result.data["message"]["id"] == "interrupted-tool-result-c1-6"  # type: ignore[call-overload,index]
    assert (result.surface_op, result.source_event_seqs) == ("append", (5,))
    assert result.encode().endswith(',"surfaceOp":"append","sourceEventSeqs":[5]}')
    text = result.data["message"]["content"][0]["content"][0]["text"]  # type: ignore[index,call-overload]
    assert text == f"Error: {OUTCOME_UNKNOWN_TEXT}"
    for fragment in (
        "Retry only if the operation is read-only or idempotent.",
        "first verify the external state or ask the user",
        "Do not retry blindly.",
    ):
        assert fragment in OUTCOME_UNKNOWN_TEXT


def test_an_answered_call_needs_only_the_closers() -> None:
    logged = events(
        *OPEN_TURN_2, assistant(2, 1, "c1"), tool_call(2, 1, "c1"), tool_result(2, 1, "c1")
    )
    assert [c.type for c in interrupted_turn_closers(logged)] == ["step/end", "turn/end"]


def test_a_closed_step_needs_only_turn_end() -> None:
    logged = events(*OPEN_TURN_2, ("step/end", {"turn": 2, "step": 1}))
    assert summary(interrupted_turn_closers(logged)) == [
        ("turn/end", 5, {"turn": 2, "reason": {"kind": "interrupted"}}),
    ]


def test_calls_of_an_earlier_completed_turn_are_ignored() -> None:
    logged = events(
        ("turn/start", {"turn": 1}),
        ("step/start", {"turn": 1, "step": 1}),
        assistant(1, 1, "old"),
        ("turn/end", {"turn": 1, "reason": {"kind": "error"}}),
        ("turn/start", {"turn": 2}),
    )
    assert [c.type for c in interrupted_turn_closers(logged)] == ["turn/end"]


def test_only_the_unanswered_of_two_calls_is_closed() -> None:
    logged = events(
        *OPEN_TURN_2,
        assistant(2, 1, "c1", "c2"),
        tool_call(2, 1, "c1"),
        tool_call(2, 1, "c2"),
        tool_result(2, 1, "c1"),
    )
    result, *_ = interrupted_turn_closers(logged)
    assert result.data["message"]["source"] == {"kind": "tool", "callId": "c2"}  # type: ignore[index,call-overload]
    assert result.data["error"] == {
        "name": "ToolOutcomeUnknownError",
        "code": "TOOL_OUTCOME_UNKNOWN",
    }
    # Marked as a repair in its id, citing the tool/call it answers, as the original writes it.
    assert result.data["message"]["id"] == "interrupted-tool-result-c2-8"  # type: ignore[call-overload,index]
    assert (result.surface_op, result.source_event_seqs) == ("append", (6,))
    assert result.encode().endswith(',"surfaceOp":"append","sourceEventSeqs":[6]}')


def test_pending_calls_are_closed_in_model_order() -> None:
    logged = events(*OPEN_TURN_2, assistant(2, 1, "b", "a"), tool_call(2, 1, "a"))
    first, second, *_ = interrupted_turn_closers(logged)
    assert [first.data["error"], second.data["error"]] == [
        {"name": "ToolNotStartedError", "code": "TOOL_NOT_STARTED"},
        UNKNOWN,
    ]


def test_a_tool_call_the_model_never_asked_for_is_ignored() -> None:
    logged = events(*OPEN_TURN_2, tool_call(2, 1, "stray"))
    assert [c.type for c in interrupted_turn_closers(logged)] == ["step/end", "turn/end"]


def test_events_outside_any_turn_need_nothing() -> None:
    logged = events(("step/start", {"turn": 1, "step": 1}), assistant(1, 1, "stray"))
    assert interrupted_turn_closers(logged) == ()


def test_only_the_last_started_turn_is_closed() -> None:
    logged = events(
        ("turn/start", {"turn": 1}),
        ("step/start", {"turn": 1, "step": 1}),
        assistant(1, 1, "abandoned"),
        ("turn/start", {"turn": 2}),
    )
    assert summary(interrupted_turn_closers(logged)) == [
        ("turn/end", 4, {"turn": 2, "reason": {"kind": "interrupted"}}),
    ]


def test_a_recorded_class_and_key_give_the_result_of_that_class() -> None:
    """The class and key are read back from the tool/call; a class this package does not know
    (a newer writer's, or damage) gives the general result, as no class does."""
    name, data = tool_call(2, 1, "c1")
    for effect, key, expected in (
        ("side-effecting", "k-1", outcome_unknown("side-effecting", "k-1")),
        ("read-only", "k-1", outcome_unknown("read-only")),
        ("idempotent", 7, outcome_unknown("idempotent")),  # a key that is no string is no key
        ("fragile", "k-1", outcome_unknown()),
    ):
        recorded: JSONObject = {**data, "effect": effect, "idempotencyKey": key}
        logged = events(*OPEN_TURN_2, assistant(2, 1, "c1"), (name, recorded))
        result = interrupted_turn_closers(logged)[0]
        assert result.data == eventdata.tool_result(
            2, 1, "c1", expected, message_id="interrupted-tool-result-c1-6"
        )
    side_effecting = outcome_unknown("side-effecting", "k-1")
    assert side_effecting.effect == EffectInfo("side-effecting", "k-1")
    assert eventdata.tool_result(2, 1, "c1", side_effecting)["effect"] == {
        "class": "side-effecting",
        "idempotencyKey": "k-1",
    }
    assert "k-1" in side_effecting.content[0].text
    assert "First verify whether the change happened" in side_effecting.content[0].text
