"""Crash repair: the events that close a turn a crash left open.

A log that ends inside a turn is closed by synthetic events, in this order:

1. one error ``tool/result`` for every tool call the model asked for that has no result:
   ``TOOL_OUTCOME_UNKNOWN`` if its ``tool/call`` is in the log (the call started, and its side
   effect may have happened) or may have been in a torn tail that recovery cut off,
   ``TOOL_NOT_STARTED`` only if the log proves the call never started (its ``tool/call`` is
   not in the log, and nothing was cut after it);
2. ``step/end``, if a step is open;
3. ``turn/end`` with reason ``{"kind": "interrupted"}``.

Their seqs continue the log and their time is the time of the last event, so the repair of a
given log is always the same. Recovery never dispatches anything again: the model decides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..events import JSONObject, SessionEvent, encode_data, tool_result_data
from ..results import NOT_STARTED_TEXT, OUTCOME_UNKNOWN_TEXT, not_started, outcome_unknown

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["NOT_STARTED_TEXT", "OUTCOME_UNKNOWN_TEXT", "interrupted_turn_closers"]

_OUTCOME_UNKNOWN: Final = outcome_unknown()
_NOT_STARTED: Final = not_started()

_BOUNDARIES: Final = frozenset({"turn/start", "turn/end"})


def interrupted_turn_closers(
    events: Sequence[SessionEvent], *, tail_cut: bool = False
) -> tuple[SessionEvent, ...]:
    """Return the events that close the open turn at the end of *events*, or ``()``.

    :param tail_cut: Whether bytes after *events* were cut off as a torn tail (or will be):
        a call whose ``tool/call`` is not in *events* may then have had it among them, so it
        is answered ``TOOL_OUTCOME_UNKNOWN`` instead of ``TOOL_NOT_STARTED``.
    """
    # Only a turn that started after the last turn/end can be open: find its turn/start.
    start = next(
        (index for index in range(len(events) - 1, -1, -1) if events[index].type in _BOUNDARIES),
        None,
    )
    if start is None or events[start].type == "turn/end":
        return ()
    turn = _int(events[start].data, "turn")
    step: int | None = None
    pending: dict[str, tuple[int, bool]] = {}  # call id -> (step, tool/call recorded)
    for event in events[start + 1 :]:
        data = event.data
        if event.type == "step/start":
            step = _int(data, "step")
        elif event.type == "step/end":
            step, pending = None, {}
        elif event.type == "assistant/message":
            for call_id in _tool_call_ids(data):
                pending[call_id] = (_int(data, "step"), False)
        elif event.type == "tool/call":
            started = data.get("callId")
            if isinstance(started, str) and started in pending:
                pending[started] = (pending[started][0], True)
        elif event.type == "tool/result":
            answered = _result_call_id(data)
            if answered is not None:
                pending.pop(answered, None)
    closers: list[tuple[str, JSONObject]] = [
        (
            "tool/result",
            tool_result_data(
                turn,
                call_step,
                call_id,
                _OUTCOME_UNKNOWN if recorded or tail_cut else _NOT_STARTED,
            ),
        )
        for call_id, (call_step, recorded) in pending.items()
    ]
    if step is not None:
        closers.append(("step/end", {"turn": turn, "step": step}))
    closers.append(("turn/end", {"turn": turn, "reason": {"kind": "interrupted"}}))
    seq, time = len(events), events[-1].time
    return tuple(
        SessionEvent(event_type, seq + index, time, *encode_data(event_type, data))
        for index, (event_type, data) in enumerate(closers)
    )


def _int(data: JSONObject, key: str) -> int:
    value = data.get(key)
    return value if type(value) is int else 0


def _tool_call_ids(data: JSONObject) -> list[str]:
    message = data.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    ids: list[str] = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "tool-call":
            call_id = block.get("id")
            if isinstance(call_id, str):
                ids.append(call_id)
    return ids


def _result_call_id(data: JSONObject) -> str | None:
    message = data.get("message")
    source = message.get("source") if isinstance(message, dict) else None
    call_id = source.get("callId") if isinstance(source, dict) else None
    return call_id if isinstance(call_id, str) else None
