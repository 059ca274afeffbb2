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
given log is always the same. A repaired result is marked as such in its message id
(``interrupted-tool-result-<call id>-<seq>``) and, like every result, cites the ``tool/call``
it answers in ``sourceEventSeqs`` when that is in the log. When that ``tool/call`` recorded
the call's effect class (and idempotency key), the ``TOOL_OUTCOME_UNKNOWN`` result carries
them in its ``effect`` field and its text is the one of that class; without a recorded class
(the original harness's logs), the result is exactly the general one. The closers are the original
harness's, envelope included; the texts the model reads are this package's own. Recovery never
dispatches anything again: the model decides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .. import eventdata
from ..events import JSONObject, SessionEvent, StoredDataError, encode_data
from ..results import NOT_STARTED_TEXT, OUTCOME_UNKNOWN_TEXT, not_started, outcome_unknown

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ..effects import EffectClass

__all__ = ["NOT_STARTED_TEXT", "OUTCOME_UNKNOWN_TEXT", "interrupted_turn_closers", "repair_of"]

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
    pending: dict[str, tuple[int, int | None]] = {}  # call id -> (step, seq of its tool/call)
    effects: dict[str, tuple[EffectClass | None, str | None]] = {}  # call id -> class, key
    for event in events[start + 1 :]:
        data = event.data
        if event.type == "step/start":
            step = _int(data, "step")
        elif event.type == "step/end":
            step, pending = None, {}
        elif event.type == "assistant/message":
            for call_id in eventdata.tool_call_ids(data):
                pending[call_id] = (_int(data, "step"), None)
        elif event.type == "tool/call":
            started = data.get("callId")
            if isinstance(started, str) and started in pending:
                pending[started] = (pending[started][0], event.seq)
                effects[started] = eventdata.call_effect_of(data)
        elif event.type == "tool/result":
            answered = eventdata.result_call_id(data)
            if answered is not None:
                pending.pop(answered, None)
    seq, time = len(events), events[-1].time
    closers: list[SessionEvent] = []
    for call_id, (call_step, call_seq) in pending.items():
        if call_seq is not None and call_id in effects:
            result = outcome_unknown(*effects[call_id])
        else:
            result = _OUTCOME_UNKNOWN if call_seq is not None or tail_cut else _NOT_STARTED
        message_id = eventdata.interrupted_result_id(call_id, seq)
        answer = eventdata.tool_result(turn, call_step, call_id, result, message_id=message_id)
        sources = None if call_seq is None else (call_seq,)
        closers.append(_closer("tool/result", seq, time, answer, sources))
        seq += 1
    if step is not None:
        closers.append(_closer("step/end", seq, time, eventdata.step_data(turn, step)))
        seq += 1
    reason: JSONObject = {"kind": "interrupted"}
    closers.append(_closer("turn/end", seq, time, eventdata.turn_end(turn, reason)))
    return tuple(closers)


def repair_of(
    events: Sequence[SessionEvent],
    corrupt: Callable[[int, str], Exception],
    *,
    tail_cut: bool = False,
) -> tuple[SessionEvent, ...]:
    """:func:`interrupted_turn_closers`, for a backend reading a stored log.

    The data of the open turn's events is decoded now, for the first time: if one's is not
    valid, the backend's *corrupt* error (given the event's seq and what is wrong) is raised.
    """
    try:
        return interrupted_turn_closers(events, tail_cut=tail_cut)
    except StoredDataError as exc:
        problem = f"the data of the {exc.event_type!r} event: {exc.problem}"
        raise corrupt(exc.seq, problem) from None


def _closer(
    event_type: str, seq: int, time: int, data: object, sources: tuple[int, ...] | None = None
) -> SessionEvent:
    surface = event_type == "tool/result"
    copy, encoded = encode_data(event_type, data)
    return SessionEvent(
        event_type,
        seq,
        time,
        copy,
        encoded,
        "append" if surface else None,
        sources,
        surface_op_first=True,  # as the original's repair writes its closers
    )


def _int(data: JSONObject, key: str) -> int:
    value = data.get(key)
    return value if type(value) is int else 0
