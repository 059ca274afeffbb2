"""Older records of format version 0, read as the events the current format holds.

The original harness's logs keep format version 0 while a few event shapes changed; its readers
convert the exact older shapes they know, and so do both backends here, on every read (load,
inspect, read_from). Nothing stored is rewritten: later appends use the current shapes.

* Messages from before message identities: a ``user/message`` whose data is the message without
  ``id`` and ``role``; an ``assistant/message`` with ``content`` and ``provenance`` instead of a
  ``message``; a ``tool/result`` with ``callId``, ``content`` and ``isError`` instead of a
  ``message``. Each message gets the id ``legacy-message:<session id>:<seq>``; a tool result
  that replaces an earlier message takes that message's id.
* Logs from before the react loop: a ``steering/message`` (a message sent during a turn)
  becomes the ``user/message`` it carried; a ``turn/start`` loses its ``trigger``; a
  ``turn/end`` whose reason had an older shape gets the current one.

Two older shapes are refused, as the original refuses them: a ``request/header`` whose reason is
the retired ``fallback``, and a malformed older record (:class:`LegacyRecordError`).
"""

from __future__ import annotations

from functools import partial
from itertools import compress
from typing import TYPE_CHECKING, Final, cast

from ..events import JSON, JSONObject, SessionEvent, SurfaceReplace

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    import msgspec

    from ..events import StoredEvents

__all__ = [
    "LEGACY_EVENT_TYPES",
    "LegacyRecordError",
    "first_older",
    "legacy_message_id",
    "upgrade_events",
    "upgrade_suffix",
]

LEGACY_EVENT_TYPES: Final = frozenset({"steering/message"})
"""Event types of older logs that are read (and converted), though no current event has them."""
_LOOKED_AT: Final = frozenset(
    {
        "user/message",
        "assistant/message",
        "tool/result",
        "turn/start",
        "turn/end",
        "request/header",
        "steering/message",
    }
)
_FAILURE_KEYS: Final = frozenset({"message", "code", "status", "providerRetryAfterMs", "requestId"})


class LegacyRecordError(ValueError):
    """An older record that is not the shape it claims, or a retired one: its seq, and why."""

    def __init__(self, seq: int, problem: str) -> None:
        super().__init__(problem)
        self.seq = seq
        self.problem = problem


def legacy_message_id(session_id: str, seq: int) -> str:
    """The id an older message without one is read with."""
    return f"legacy-message:{session_id}:{seq}"


def _object(value: object) -> JSONObject | None:
    return cast("JSONObject", value) if isinstance(value, dict) else None


def _only(record: JSONObject, required: set[str], optional: frozenset[str] = frozenset()) -> bool:
    return required <= record.keys() <= required | optional


def _is_turn(value: object) -> bool:
    return type(value) is int and value >= 1


def upgrade_events(events: StoredEvents, session_id: str) -> StoredEvents:
    """*events* with their older records converted (the same object if none is older).

    Only the events of the types that had older shapes are looked at, and of those only the
    ones whose stored text may hold an older shape are made and decoded: the texts of one type
    are searched at once (:data:`_CURRENT_MARKS`), and one by one only if that finds one.

    :raises LegacyRecordError: naming the first older record that is malformed or retired.
    """
    seqs, kinds, texts = events.stored_data(_LOOKED_AT)
    suspects: list[int] = []
    for kind in set(kinds):
        positions = list(compress(range(len(kinds)), map(kind.__eq__, kinds)))
        group = list(map(texts.__getitem__, positions))
        if None in group or not _all_current(kind, group):
            suspects += positions
    suspects.sort()
    candidates = [(seqs[position], kinds[position], texts[position]) for position in suspects]
    upgraded = _upgraded(candidates, events.__getitem__, session_id, 0)
    assert upgraded is not None  # a log from seq 0 holds every message a result replaces
    if not upgraded:
        return events
    result = events.copy()
    for event in upgraded:
        result.replace(event)
    return result


def first_older(events: StoredEvents, session_id: str, start: int = 0) -> int | None:
    """The seq of the first event from *start* on that :func:`upgrade_events` would convert
    (or refuse), or ``None``; only the events whose stored text may hold an older shape are
    made."""
    seqs, kinds, texts = events.stored_data(_LOOKED_AT, start)
    suspects: list[int] = []
    for kind in set(kinds):
        positions = list(compress(range(len(kinds)), map(kind.__eq__, kinds)))
        group = list(map(texts.__getitem__, positions))
        if None in group or not _all_current(kind, group):
            suspects += positions
    if not suspects:
        return None
    suspects.sort()
    candidates = [(seqs[position], kinds[position], texts[position]) for position in suspects]
    try:
        upgraded = _upgraded(candidates, events.__getitem__, session_id, start)
    except LegacyRecordError as error:
        return error.seq
    if upgraded is None:  # a result replacing a message before *start*
        return seqs[suspects[0]]
    return min((event.seq for event in upgraded), default=None)


def _all_current(kind: str, texts: list[msgspec.Raw | None]) -> bool:
    """Whether the stored data texts of events of type *kind* all show the current shape."""
    mark = _CURRENT_MARKS.get(kind)
    if mark is None:
        return False
    key, present = mark
    joined = b"\x00".join(cast("list[bytes]", texts))
    if present:
        return joined.count(key) >= len(texts)
    return not any(word in joined for word in key.split(b"|"))


def upgrade_suffix(
    events: Sequence[SessionEvent], session_id: str, from_seq: int
) -> list[SessionEvent] | None:
    """The events of a suffix from *from_seq* on with their older records converted; ``None``
    if one of them needs an earlier event to be converted (an older tool result that replaces
    a message before the suffix): then read the whole log.

    :raises LegacyRecordError: as :func:`upgrade_events`.
    """
    by_seq = {event.seq: event for event in events}
    candidates: list[tuple[int, str, msgspec.Raw | None]] = [
        (event.seq, event.type, None) for event in events if event.type in _LOOKED_AT
    ]
    upgraded = _upgraded(candidates, by_seq.__getitem__, session_id, from_seq)
    if upgraded is None:
        return None
    by_seq.update((event.seq, event) for event in upgraded)
    return list(by_seq.values())


class _NeedsPrefix(Exception):
    """An older tool result replaces a message before the events being read."""


def _upgraded(
    candidates: Iterable[tuple[int, str, msgspec.Raw | None]],
    event_at: Callable[[int], SessionEvent],
    session_id: str,
    first: int,
) -> list[SessionEvent] | None:
    """The converted events (those that changed) of the *candidates* (seq, type, and stored
    data text if known), from seq *first* on; *event_at* gives an event by its seq.

    An event whose stored text shows the current shape is not made (:data:`_CURRENT_MARKS`).
    """
    upgraded: dict[int, SessionEvent] = {}
    id_at = partial(_id_at, upgraded, event_at, first)
    try:
        for seq, event_type, raw in candidates:
            if raw is not None:
                text: bytes | None = bytes(cast("bytes", raw))
            else:
                known = event_at(seq).data_json
                text = None if known is None else known.encode("utf-8", "surrogatepass")
            if text is not None and _all_current(event_type, [cast("msgspec.Raw", text)]):
                continue
            event = event_at(seq)
            current = _upgrade(event, session_id, id_at)
            if current is not event:
                upgraded[seq] = current
    except _NeedsPrefix:
        return None
    return list(upgraded.values())


def _id_at(
    upgraded: dict[int, SessionEvent],
    event_at: Callable[[int], SessionEvent],
    first: int,
    seq: int,
) -> str | None:
    """The message id of the event at *seq*, as converted."""
    if seq < first:
        raise _NeedsPrefix
    event = upgraded.get(seq)
    if event is None:
        try:
            event = event_at(seq)
        except (IndexError, KeyError):
            return None
    return _message_id(event)


_CURRENT_MARKS: Final[dict[str, tuple[bytes, bool]]] = {
    "turn/start": (b'"trigger"', False),
    "turn/end": (b'"disposed"|"aborted"|"error"', False),
    "request/header": (b'"fallback"', False),
    "user/message": (b'"role"', True),
    "assistant/message": (b'"provenance"', False),
    "tool/result": (b'"message":', True),
}
"""For each type, what the stored data text of an event of the current shape holds (``True``:
the key is in each) or lacks (``False``: none of the ``|``-separated keys is in it), where an
older one does not (unless a string value in it is exactly the key tested): the events it
passes are not made, so that reading a long log makes almost none."""


def _message_id(event: SessionEvent) -> str | None:
    if event.type not in ("user/message", "assistant/message", "tool/result"):
        return None
    data = event.data
    message = data if event.type == "user/message" else _object(data.get("message"))
    found = None if message is None else message.get("id")
    return found if isinstance(found, str) else None


def _upgrade(
    event: SessionEvent, session_id: str, id_at: Callable[[int], str | None]
) -> SessionEvent:
    seq, data = event.seq, event.data
    if event.type == "request/header" and data.get("reason") == "fallback":
        raise LegacyRecordError(seq, 'the retired request/header reason "fallback"')
    if event.type == "turn/start":
        return _turn_start(event)
    if event.type == "turn/end":
        return _turn_end(event)
    if event.type == "steering/message":
        return _steering(event, session_id)
    return _message(event, session_id, id_at)


def _replaced(event: SessionEvent, event_type: str, data: JSONObject) -> SessionEvent:
    return SessionEvent(
        event_type,
        event.seq,
        event.time,
        data,
        None,
        event.surface_op,
        event.source_event_seqs,
        event.ignorable,
    )


def _turn_start(event: SessionEvent) -> SessionEvent:
    data = event.data
    if "trigger" not in data:
        return event
    trigger = _object(data["trigger"])
    if not (
        _is_turn(data.get("turn"))
        and data.keys() == {"turn", "trigger"}
        and trigger is not None
        and isinstance(trigger.get("kind"), str)
        and trigger["kind"]
    ):
        raise LegacyRecordError(event.seq, "a malformed turn/start from before the react loop")
    return _replaced(event, "turn/start", {"turn": data["turn"]})


def _turn_end(event: SessionEvent) -> SessionEvent:
    """A ``turn/end`` whose reason has an older shape, with the current one."""
    data = event.data
    reason = _object(data.get("reason"))
    if (
        data.keys() != {"turn", "reason"}
        or reason is None
        or not isinstance(reason.get("kind"), str)
    ):
        return event  # not an older shape: read as it is
    malformed = LegacyRecordError(event.seq, "a malformed turn/end from before the react loop")
    kind = reason["kind"]
    current: JSONObject
    if kind == "aborted" and "reason" not in reason:
        if reason.keys() != {"kind"}:
            raise malformed
        current = {"kind": "aborted", "reason": {"kind": "legacy"}}
    elif kind == "disposed":
        if reason.keys() != {"kind"}:
            raise malformed
        current = {"kind": "aborted", "reason": {"kind": "disposed"}}
    elif kind == "error" and "error" not in reason:
        failure = _older_failure(reason)
        if failure is None:
            raise malformed
        current = {"kind": "error", "error": failure}
    else:
        return event
    return _replaced(event, "turn/end", {**data, "reason": current})


def _older_failure(reason: JSONObject) -> JSONObject | None:
    """The current error of an older ``error`` reason (a failure, or a message and a code);
    ``None`` if it is malformed."""
    step = reason.get("step")
    if type(step) is not int or step < 0:
        return None
    failure = _object(reason.get("failure"))
    if (
        failure is not None
        and reason.keys() == {"kind", "step", "failure"}
        and _only(failure, {"message", "code"}, _FAILURE_KEYS)
        and isinstance(failure["message"], str)
        and isinstance(failure["code"], str)
        and (failure.get("status") is None or _is_number(failure["status"]))
        and (
            failure.get("providerRetryAfterMs") is None
            or _is_number(failure["providerRetryAfterMs"])
        )
        and (failure.get("requestId") is None or isinstance(failure["requestId"], str))
    ):
        return failure
    keys = {"kind", "step", "message"} | ({"code"} if "code" in reason else set())
    code = reason.get("code")
    if reason.keys() != keys or not isinstance(reason.get("message"), str):
        return None
    if code is not None and not isinstance(code, str):
        return None
    return {"message": reason["message"], "code": code if isinstance(code, str) else "UNKNOWN"}


def _is_number(value: JSON) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _steering(event: SessionEvent, session_id: str) -> SessionEvent:
    data = event.data
    wrapped = _object(data.get("message"))
    if wrapped is not None and _is_turn(data.get("turn")) and data.keys() == {"turn", "message"}:
        return _replaced(event, "user/message", wrapped)
    if not (_is_turn(data.get("turn")) and data.keys() == {"turn", "content", "source"}):
        raise LegacyRecordError(
            event.seq, "a malformed steering/message from before the react loop"
        )
    message: JSONObject = {key: value for key, value in data.items() if key != "turn"}
    message["id"] = legacy_message_id(session_id, event.seq)
    message["role"] = "user"
    return _replaced(event, "user/message", message)


def _message(
    event: SessionEvent, session_id: str, id_at: Callable[[int], str | None]
) -> SessionEvent:
    data = event.data
    minted = legacy_message_id(session_id, event.seq)
    if event.type == "user/message":
        if {"id", "role", "message"} & data.keys() or not {"content", "source"} <= data.keys():
            return event
        return _replaced(event, event.type, {**data, "id": minted, "role": "user"})
    if event.type == "assistant/message":
        if "message" in data or not {"content", "provenance"} <= data.keys():
            return event
        rest = {key: value for key, value in data.items() if key not in ("content", "provenance")}
        source: JSONObject = {**(_object(data["provenance"]) or {}), "kind": "model"}
        message: JSONObject = {
            "id": minted,
            "role": "assistant",
            "content": data["content"],
            "source": source,
        }
        return _replaced(event, event.type, {**rest, "message": message})
    if "message" in data or not {"callId", "content", "isError"} <= data.keys():
        return event
    rest = {
        key: value for key, value in data.items() if key not in ("callId", "content", "isError")
    }
    op = event.surface_op
    inherited = id_at(op.start) if isinstance(op, SurfaceReplace) else None
    block: JSONObject = {
        "type": "tool-result",
        "toolCallId": data["callId"],
        "content": data["content"],
        "isError": data["isError"],
    }
    result: JSONObject = {
        "id": inherited if isinstance(op, SurfaceReplace) else minted,
        "role": "user",
        "content": [block],
        "source": {"kind": "tool", "callId": data["callId"]},
    }
    return _replaced(event, event.type, {**rest, "message": result})
