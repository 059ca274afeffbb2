"""One event record: its shapes, packed rows, and the decoders both backends read them with.

A record is one line of UTF-8 JSON text (without its newline): an event envelope (``type``,
``seq``, ``time``, ``data``, and ``sourceEventSeqs``, ``surfaceOp`` and ``ignorable`` where they
are set), or a *packed row*: three or more consecutive text, reasoning or tool-argument deltas
of one block, written as one ``text-chunks``, ``reasoning-chunks`` or ``tool-call-chunks``
record. The JSONL backend writes records as the lines of its log files, the PostgreSQL backend
one per row (never packed); both read them back with the decoders here.

Reading refuses a record that is not the event expected, naming why (:class:`RecordError`):
another envelope, a seq out of order, a time outside 0 to :data:`MAX_TIME`, a line that is not
JSON, an event type this release does not know (unless the event is marked ``ignorable``: then
it is kept as it is). An event's data is kept as the raw bytes of its record and checked when it
is first read (:attr:`SessionEvent.data <kai_session_checkpoint_policy.events.SessionEvent.data>`:
a JSON object of finite numbers, nested at most
:data:`~kai_session_checkpoint_policy.events.MAX_JSON_DEPTH` levels), unless only the standard
library's decoder can read the line, which checks it at once.

Runs of lines are decoded at once (:func:`decode_run`): by msgspec into structs whose data stays
raw, or, for lines it does not read, by the standard library in one call. A run that is not all
the events expected is decoded a line at a time (:func:`decode_line`), which alone names damage.
"""

from __future__ import annotations

import gc
import json
import math
from array import array
from contextlib import contextmanager
from functools import partial
from itertools import accumulate, groupby, pairwise
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Annotated, Final, Literal, NoReturn, TypeAlias, cast

import msgspec
from msgspec import UNSET, UnsetType

from ..events import (
    JSON,
    KNOWN_EVENT_TYPES,
    MAX_JSON_DEPTH,
    MAX_TIME,
    SURFACE_EVENT_TYPES,
    JSONObject,
    SessionEvent,
    StoredEvents,
    SurfaceOp,
    SurfaceReplace,
    envelope_problem,
    json_depth,
    on_fresh_stack,
)
from .legacy import LEGACY_EVENT_TYPES

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from ..events import Deferred

__all__ = [
    "MAX_TIME",
    "RUN_BYTES",
    "TIME_RANGE",
    "Columns",
    "RecordError",
    "collector_paused",
    "decode_event",
    "decode_line",
    "decode_run",
    "encode_lines",
    "encode_records",
]

TIME_RANGE: Final = f"an integer from 0 to {MAX_TIME} (epoch milliseconds up to the year 9999)"
"""What an event's time must be, as error messages name it."""
RUN_BYTES: Final = 1 << 16
"""About how many bytes of complete lines a reader hands :func:`decode_run` at once."""

_ENVELOPE: Final = frozenset({"type", "seq", "time", "data"})
_ENVELOPE_KEYS: Final = _ENVELOPE | {"surfaceOp", "sourceEventSeqs", "ignorable"}
_ROW_ENVELOPE: Final = frozenset({"type", "seq0", "time0", "data"})
_ROW_TAGS: Final = {
    "text-chunks": "text-delta",
    "reasoning-chunks": "reasoning-delta",
    "tool-call-chunks": "tool-call-delta",
}
_ROW_OF: Final = {kind: tag for tag, kind in _ROW_TAGS.items()}
_TEXT_ROW_KEYS: Final = frozenset({"turn", "step", "index", "dt", "texts"})
_CALL_ROW_KEYS: Final = frozenset({"turn", "step", "index", "dt", "id", "args"})
_CHUNK_DATA_KEYS: Final = ("turn", "step", "chunk")
_TEXT_CHUNK_KEYS: Final = ("type", "index", "text")
_CALL_CHUNK_KEYS: Final = ("type", "index", "id", "argumentsDelta")
_NAMED_CALL_CHUNK_KEYS: Final = ("type", "index", "id", "name", "argumentsDelta")
_MIN_RUN: Final = 3
"""How many consecutive deltas of one block are packed into a row."""
_LINE_DEPTH: Final = MAX_JSON_DEPTH + 1
"""How deep an event line may nest: its data, inside the envelope."""
_OPENERS: Final = bytes.maketrans(b"{", b"[")
_NOT_OPENER_OR_NEWLINE: Final = bytes(set(range(256)) - set(b"[{\n"))
_TOO_MANY_OPENERS: Final = b"[" * (_LINE_DEPTH + 1)
"""Lines translated to their opening brackets hold this if one could nest too deep."""
_EVENT_TYPES: Final = {event_type: event_type for event_type in KNOWN_EVENT_TYPES}
"""One shared copy of each known event type, instead of one string per loaded event."""


class RecordError(ValueError):
    """A record that is not the event expected: why, and whether it is a complete record.

    A *complete* record (a JSON object, or a line nested too deep to decode) was written whole:
    it is never a torn tail. An *unsupported* one is an event of a type this release does not
    know, not marked ``ignorable``.
    """

    def __init__(self, problem: str, *, complete: bool, unsupported: bool = False) -> None:
        super().__init__(problem)
        self.problem = problem
        self.complete = complete
        self.unsupported = unsupported


# -- writing events -----------------------------------------------------------------------------

_encode_string: Final = json.encoder.encode_basestring_ascii


_RunKey: TypeAlias = "tuple[str, int, int, int, str, str | None]"
"""What the deltas of one run share: kind, turn, step, index, call id and tool name."""


def _run_key(event: SessionEvent) -> _RunKey | None:
    """What *event* shares with the deltas it may be packed with, or ``None`` if it is none.

    Only a plain text, reasoning or tool-argument delta is packed: an ``assistant/chunk`` with
    no other envelope field, whose data and chunk have exactly the keys (in the order) the
    agent writes and integer turn, step and index, so that a row reads back as the events
    that went into it, byte for byte.
    """
    if (
        event.type != "assistant/chunk"
        or event.surface_op is not None
        or event.source_event_seqs is not None
        or event.ignorable
    ):
        return None
    data = event.data
    if tuple(data) != _CHUNK_DATA_KEYS:
        return None
    turn, step, chunk = data["turn"], data["step"], data["chunk"]
    if type(turn) is not int or type(step) is not int or not isinstance(chunk, dict):
        return None
    kind, index = chunk.get("type"), chunk.get("index")
    if type(index) is not int:
        return None
    keys = tuple(chunk)
    if kind in ("text-delta", "reasoning-delta"):
        if keys == _TEXT_CHUNK_KEYS and isinstance(chunk["text"], str):
            return kind, turn, step, index, "", None
    elif kind == "tool-call-delta" and keys in (_CALL_CHUNK_KEYS, _NAMED_CALL_CHUNK_KEYS):
        call_id, name = chunk["id"], chunk.get("name", None)
        if isinstance(call_id, str) and isinstance(chunk["argumentsDelta"], str):
            if name is None and "name" not in chunk:
                return kind, turn, step, index, call_id, None
            if isinstance(name, str):
                return kind, turn, step, index, call_id, name
    return None


def _encode_row(run: Sequence[SessionEvent], key: _RunKey) -> str:
    kind, turn, step, index, call_id, name = key
    first = run[0]
    dt = ",".join(str(after.time - before.time) for before, after in pairwise(run))
    head = (
        f'{{"type":"{_ROW_OF[kind]}","seq0":{first.seq},"time0":{first.time},'
        f'"data":{{"turn":{turn},"step":{step},"index":{index},"dt":[{dt}],'
    )
    chunks = [cast("JSONObject", event.data["chunk"]) for event in run]
    if kind != "tool-call-delta":
        texts = ",".join(_encode_string(cast("str", chunk["text"])) for chunk in chunks)
        return f'{head}"texts":[{texts}]}}}}'
    named = "" if name is None else f'"name":{_encode_string(name)},'
    pieces = ",".join(_encode_string(cast("str", chunk["argumentsDelta"])) for chunk in chunks)
    return f'{head}"id":{_encode_string(call_id)},{named}"args":[{pieces}]}}}}'


def _lines(events: Sequence[SessionEvent], pack: bool) -> list[str]:
    if not pack:
        return [event.encode() for event in events]
    lines: list[str] = []
    index, count = 0, len(events)
    while index < count:
        event = events[index]
        key = _run_key(event)
        end = index + 1
        if key is not None:
            while (
                end < count
                and events[end].seq == events[end - 1].seq + 1
                and _run_key(events[end]) == key
            ):
                end += 1
        if end - index >= _MIN_RUN:
            lines.append(_encode_row(events[index:end], cast("_RunKey", key)))
        else:
            lines += [member.encode() for member in events[index:end]]
        index = end
    return lines


def encode_lines(events: Sequence[SessionEvent], *, pack: bool = False) -> list[str]:
    """The records of *events*, one line each (without newlines).

    With *pack*, runs of three or more deltas of one block become one packed row.
    """
    return _lines(events, pack)


def encode_records(events: Sequence[SessionEvent], *, pack: bool = False) -> bytes:
    """The records of *events* as UTF-8 text, each line ending in a newline; nothing for none."""
    if not events:
        return b""
    return ("\n".join(_lines(events, pack)) + "\n").encode()


# -- reading one record -------------------------------------------------------------------------


class _NotFinite(ValueError):
    """A number a session log cannot hold: NaN, an infinity, or a float that overflows."""


def _reject_constant(name: str) -> NoReturn:
    raise _NotFinite(f"{name} is not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(f"{text} is not a finite number")
    return value


_decoder: Final = json.JSONDecoder(parse_float=_finite_float, parse_constant=_reject_constant)
_first: Final = itemgetter(0)


def _parse(line: bytes, *, fresh_stack: bool) -> JSONObject:
    """Parse one line into a JSON object; see :class:`RecordError` for what is refused."""
    try:
        text = line.decode("utf-8", "surrogatepass")  # as the fast path decodes it
        record = _decoder.decode(text)
    except RecursionError:
        if not fresh_stack:
            raise
        raise RecordError(_nested_too_deep(f"more than {_LINE_DEPTH}"), complete=True) from None
    except _NotFinite as exc:
        try:
            lenient = json.loads(text)
        except (ValueError, RecursionError):
            lenient = None
        raise RecordError(str(exc), complete=isinstance(lenient, dict)) from None
    except ValueError as exc:
        raise RecordError(f"not valid JSON ({exc})", complete=False) from None
    if not isinstance(record, dict):
        raise RecordError("not a JSON object", complete=False)
    # A line nests no deeper than it has brackets: most lines need not be measured.
    if line.count(b"[") + line.count(b"{") > _LINE_DEPTH:
        depth = json_depth(record)
        if depth > _LINE_DEPTH:
            raise RecordError(_nested_too_deep(str(depth)), complete=True)
    return record


def _nested_too_deep(depth: str) -> str:
    return (
        f"the line is nested {depth} levels deep; an event line nests at most {_LINE_DEPTH} "
        f"(its data at most {MAX_JSON_DEPTH})"
    )


def _surface_op(value: JSON) -> SurfaceOp:
    if value == "append":
        return "append"
    if (
        isinstance(value, dict)
        and value.keys() == {"op", "start", "end"}
        and value["op"] == ("replace")
    ):
        start, end = value["start"], value["end"]
        if type(start) is int and type(end) is int:
            return SurfaceReplace(start, end)
    raise RecordError(f'surfaceOp is {value!r}, not "append" or a replacement', complete=True)


def _event(record: JSONObject, seq: int, earlier: bool) -> SessionEvent:
    """The event *record* holds, if it is the event with *seq*; else :class:`RecordError`."""
    event_type = record.get("type")
    if not isinstance(event_type, str) or not event_type:
        raise RecordError("the event type is not a non-empty string", complete=True)
    ignorable = record.get("ignorable", False)
    if earlier:
        if record.keys() != _ENVELOPE:
            raise RecordError(
                "not an event envelope with exactly type, seq, time and data", complete=True
            )
    else:
        if event_type == "session":
            raise RecordError(
                "a second session header: a log has one, on its first line", complete=True
            )
        if (
            event_type not in KNOWN_EVENT_TYPES
            and event_type not in LEGACY_EVENT_TYPES
            and ignorable is not True
        ):
            raise RecordError(
                f"the event type {event_type!r} (seq {record.get('seq')!r}) is unknown to this "
                "release and the event is not marked ignorable; refusing to interpret the log "
                "(a newer release wrote it?)",
                complete=True,
                unsupported=True,
            )
        if not _ENVELOPE <= record.keys() <= _ENVELOPE_KEYS:
            missing = sorted(_ENVELOPE - record.keys())
            extra = sorted(record.keys() - _ENVELOPE_KEYS)
            what = f"no {', '.join(missing)}" if missing else f"the unknown key {extra[0]!r}"
            raise RecordError(f"not an event envelope: it has {what}", complete=True)
    event_seq, time, data = record["seq"], record["time"], record["data"]
    if type(time) is not int or not 0 <= time <= MAX_TIME:
        raise RecordError(f"the event time is not {TIME_RANGE}", complete=True)
    if type(event_seq) is not int:
        raise RecordError("the event seq is not an integer", complete=True)
    if event_seq != seq:
        raise RecordError(f"seq {event_seq} where {seq} was expected", complete=True)
    if not isinstance(data, dict):
        if (
            not earlier
            and ignorable is True
            and event_type not in KNOWN_EVENT_TYPES
            and not {"surfaceOp", "sourceEventSeqs"} & record.keys()
        ):
            # An event a reader may skip, of a type it does not know: its data is not read,
            # whatever JSON it is (as the original harness's readers skip it).
            return SessionEvent(event_type, seq, time, {}, None, None, None, True)
        raise RecordError("the event data is not a JSON object", complete=True)
    event_type = _EVENT_TYPES.get(event_type, event_type)
    if earlier:
        surface: SurfaceOp | None = "append" if event_type in SURFACE_EVENT_TYPES else None
        return SessionEvent(
            event_type, seq, time, data, None, surface, None, event_type not in KNOWN_EVENT_TYPES
        )
    if len(record) == len(_ENVELOPE):
        return SessionEvent(event_type, seq, time, data)
    if ignorable is not True and "ignorable" in record:
        raise RecordError(f"ignorable is {ignorable!r}; when present it is true", complete=True)
    surface_op = None if "surfaceOp" not in record else _surface_op(record["surfaceOp"])
    sources: tuple[int, ...] | None = None
    if "sourceEventSeqs" in record:
        listed = record["sourceEventSeqs"]
        if not isinstance(listed, list) or not all(type(item) is int for item in listed):
            raise RecordError(
                f"sourceEventSeqs is {listed!r}, not a list of integers", complete=True
            )
        sources = tuple(cast("list[int]", listed))
    # An older steering message is checked as the user message it is read as.
    checked_as = "user/message" if event_type in LEGACY_EVENT_TYPES else event_type
    problem = envelope_problem(checked_as, seq, surface_op, sources)
    if problem is not None:
        raise RecordError(problem, complete=True)
    keys = list(record)
    first = surface_op is not None and sources is not None
    first = first and keys.index("surfaceOp") < keys.index("sourceEventSeqs")
    return SessionEvent(
        event_type, seq, time, data, None, surface_op, sources, ignorable is True, first
    )


def _row(record: JSONObject, seq: int) -> list[SessionEvent]:
    """The deltas a packed row holds, if it starts at *seq*; else :class:`RecordError`."""
    tag = cast("str", record["type"])

    def malformed(why: str) -> NoReturn:
        raise RecordError(f"a malformed {tag} row: {why}", complete=True)

    if record.keys() != _ROW_ENVELOPE:
        malformed("it does not have exactly the keys type, seq0, time0 and data")
    seq0, time0, data = record["seq0"], record["time0"], record["data"]
    if type(seq0) is not int:
        malformed("seq0 is not an integer")
    if seq0 != seq:
        raise RecordError(f"seq {seq0} where {seq} was expected", complete=True)
    if type(time0) is not int or not 0 <= time0 <= MAX_TIME:
        malformed(f"time0 is not {TIME_RANGE}")
    if not isinstance(data, dict):
        malformed("its data is not an object")
    kind = _ROW_TAGS[tag]
    calls = kind == "tool-call-delta"
    keys = data.keys()
    if (
        not (keys == _CALL_ROW_KEYS or keys == _CALL_ROW_KEYS | {"name"})
        if calls
        else (keys != _TEXT_ROW_KEYS)
    ):
        malformed(f"its data has the keys {', '.join(sorted(keys))}")
    pieces, dt = data["args" if calls else "texts"], data["dt"]
    if not isinstance(pieces, list) or not pieces or not all(isinstance(p, str) for p in pieces):
        malformed("its pieces are not a non-empty list of strings")
    if not isinstance(dt, list) or len(dt) != len(pieces) - 1:
        malformed(f"dt does not hold one time step fewer than its {len(pieces)} pieces")
    turn, step, index = data["turn"], data["step"], data["index"]
    if not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in (turn, step, index)
    ):
        malformed("turn, step and index are not all numbers")
    call_id, name = data.get("id"), data.get("name")
    if calls and not (isinstance(call_id, str) and (name is None or isinstance(name, str))):
        malformed("its call id or tool name is not a string")
    if not all(type(gap) is int for gap in dt):
        malformed("dt holds a value that is not an integer")
    times = _member_times(time0, cast("list[int]", dt))
    if times is None:
        malformed(f"a member's time is not {TIME_RANGE}")
    head = (kind, index, cast("str", call_id), name, "name" in data) if calls else (kind, index)
    return _members(seq, times, turn, step, head, cast("list[str]", pieces))


def _member_times(time0: int, dt: list[int]) -> list[int] | None:
    """The times of a row's members, from the first and the steps; ``None`` if one is out of
    range."""
    times = list(accumulate(dt, initial=time0))
    return times if min(times) >= 0 and max(times) <= MAX_TIME else None


def _members(
    seq: int,
    times: list[int],
    turn: JSON,
    step: JSON,
    head: tuple[str, JSON] | tuple[str, JSON, str, JSON, bool],
    pieces: list[str],
) -> list[SessionEvent]:
    """The ``assistant/chunk`` events of a row: one per piece, from *seq* on.

    *head* is the chunk type and block index of a text or reasoning row; a tool-call row's
    also has the call id, the tool name, and whether the row names it.
    """
    events = []
    for offset, (piece, time) in enumerate(zip(pieces, times, strict=True)):
        chunk: JSONObject
        if len(head) == 5:
            kind, index, call_id, name, named = head
            chunk = {"type": kind, "index": index, "id": call_id}
            if named:
                chunk["name"] = name
            chunk["argumentsDelta"] = piece
        else:
            chunk = {"type": head[0], "index": head[1], "text": piece}
        chunk_data: JSONObject = {"turn": turn, "step": step, "chunk": chunk}
        events.append(SessionEvent("assistant/chunk", seq + offset, time, chunk_data))
    return events


def _record_events(record: JSONObject, seq: int, earlier: bool) -> list[SessionEvent]:
    """The events one stored record holds: one event, or the members of a packed row."""
    if not earlier and record.get("type") in _ROW_TAGS:
        return _row(record, seq)
    return [_event(record, seq, earlier)]


def decode_event(record: str, seq: int) -> SessionEvent:
    """Decode one stored record (as :meth:`SessionEvent.encode` writes it), the event *seq*.

    This is the whole check a record passes wherever it is stored: a JSON object with the
    envelope's keys (``type``, ``seq``, ``time``, ``data``, and where set ``sourceEventSeqs``,
    ``surfaceOp``, ``ignorable``), a known type unless marked ignorable, the seq expected, a
    time from 0 to :data:`MAX_TIME`; its data is checked when first read
    (:attr:`SessionEvent.data <kai_session_checkpoint_policy.events.SessionEvent.data>`).
    How deep the caller's stack is does not matter.

    :raises RecordError: naming what is wrong (``unsupported`` for an unknown type).
    """
    line = record.encode("utf-8", "surrogatepass")
    columns = _compiled_line(line, seq)
    if columns is not None and not isinstance(item := columns[2][0], _Row):
        if isinstance(item, SessionEvent):
            return item
        return SessionEvent.stored(columns[0][0], seq, columns[1][0], cast("msgspec.Raw", item))
    try:
        return _decode_one(line, seq, fresh_stack=False)
    except RecursionError:
        return on_fresh_stack(partial(_decode_one, line, seq, fresh_stack=True))


def _decode_one(line: bytes, seq: int, *, fresh_stack: bool) -> SessionEvent:
    record = _parse(line, fresh_stack=fresh_stack)
    if record.get("type") in _ROW_TAGS:
        raise RecordError("a packed row of several events, not one event", complete=True)
    return _event(record, seq, False)


# -- reading with the compiled decoder ----------------------------------------------------------
#
# Most lines are read by msgspec into structs whose data stays raw (undecoded) bytes: the
# envelope of every event is checked at once, its data when it is first read (see
# SessionEvent.data). A line the compiled decoder cannot read as an event expected next is read
# by the standard library's decoder, which checks everything and names what is wrong.

if TYPE_CHECKING:
    _KnownType: TypeAlias = str
else:
    _KnownType = Literal[tuple(sorted(KNOWN_EVENT_TYPES))]
_Time: TypeAlias = Annotated[int, msgspec.Meta(ge=0, le=MAX_TIME)]
_Number: TypeAlias = int | float
_Pieces: TypeAlias = Annotated[list[str], msgspec.Meta(min_length=1)]


class _Plain(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """An event of a known type with the four envelope keys alone."""

    type: _KnownType
    seq: int
    time: _Time
    data: msgspec.Raw


class _Record(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """Any record: an event with any of the envelope keys, or a packed row."""

    type: str
    data: msgspec.Raw
    seq: int | UnsetType = UNSET
    time: _Time | UnsetType = UNSET
    seq0: int | UnsetType = UNSET
    time0: _Time | UnsetType = UNSET
    surfaceOp: msgspec.Raw | UnsetType = UNSET
    sourceEventSeqs: list[int] | UnsetType = UNSET
    ignorable: bool | UnsetType = UNSET


class _TextRow(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    turn: _Number
    step: _Number
    index: _Number
    dt: list[int]
    texts: _Pieces


class _CallRow(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    turn: _Number
    step: _Number
    index: _Number
    dt: list[int]
    id: str
    args: _Pieces
    name: str | UnsetType = UNSET


_plain_lines: Final = msgspec.json.Decoder(_Plain).decode_lines
_record_lines: Final = msgspec.json.Decoder(_Record).decode_lines
_decode_record: Final = msgspec.json.Decoder(_Record).decode
_decode_text_row: Final = msgspec.json.Decoder(_TextRow).decode
_decode_call_row: Final = msgspec.json.Decoder(_CallRow).decode
_decode_value: Final = msgspec.json.Decoder().decode
_REFUSED: Final = (msgspec.MsgspecError, RecursionError)
"""What the compiled decoder raises for a line it does not read (it has a depth limit)."""
_optional_of: Final = attrgetter("time0", "seq0", "surfaceOp", "sourceEventSeqs", "ignorable")
_NONE_SET: Final = (UNSET,) * 5
"""What :data:`_optional_of` gives for a record without the optional envelope keys."""
_CHUNK: Final = "assistant/chunk"
_seq_of: Final = attrgetter("seq")
_type_of: Final = attrgetter("type")
_time_of: Final = attrgetter("time")
_data_of: Final = attrgetter("data")

_Item: TypeAlias = "SessionEvent | msgspec.Raw | Deferred"
Columns: TypeAlias = "tuple[list[str], array[int], list[_Item]]"
"""Decoded events as :meth:`StoredEvents.extend_stored` takes them."""


class _Row(msgspec.Struct, frozen=True, gc=False):
    """A packed row checked while reading, kept raw; its members are made when one is read."""

    seq: int
    time0: int
    data: msgspec.Raw
    kind: str

    def events(self) -> list[SessionEvent]:
        row = _decode_row(self.kind, self.data)
        times = list(accumulate(row.dt, initial=self.time0))
        if isinstance(row, _CallRow):
            name = None if isinstance(row.name, UnsetType) else row.name
            head: tuple[str, JSON] | tuple[str, JSON, str, JSON, bool] = (
                self.kind,
                row.index,
                row.id,
                name,
                name is not None,
            )
            return _members(self.seq, times, row.turn, row.step, head, row.args)
        return _members(self.seq, times, row.turn, row.step, (self.kind, row.index), row.texts)


def _decode_row(kind: str, data: msgspec.Raw) -> _TextRow | _CallRow:
    if kind == "tool-call-delta":
        return _decode_call_row(data)
    return _decode_text_row(data)


def _compiled_lines(events: StoredEvents, data: bytes, start: int, end: int) -> bool:
    """Add the events of the complete lines ``data[start:end]``, if the compiled decoder reads
    every one as the event expected next; else add nothing and return ``False``.

    The decoder reads a run of JSON values whatever lines they are on; each line holds exactly
    one only if the values are as many as the lines and every newline but the last separates
    ``}`` from ``{`` (which no JSON value can hold: a string holds no newline, and no value
    follows a ``}`` without a comma).
    """
    lines = data.count(b"\n", start, end)
    if not (
        data.startswith(b"{", start)
        and data.endswith(b"}\n", start, end)
        and data.count(b"}\n{", start, end) == lines - 1
    ):
        return False
    view = memoryview(data)[start:end]
    seq = len(events)
    try:
        plain = _plain_lines(view)
    except msgspec.ValidationError:  # not all plain events of known types: record by record
        try:
            records = _record_lines(view)
        except _REFUSED:
            return False
        columns = (
            _columns(records, seq, _Lines(data, start, end)) if len(records) == lines else None
        )
        if columns is None:
            return False
        events.extend_stored(*columns)
        return True
    except _REFUSED:
        return False
    if len(plain) != lines or list(map(_seq_of, plain)) != list(range(seq, seq + lines)):
        return False
    times = array("q")
    times.fromlist(list(map(_time_of, plain)))
    events.extend_stored(list(map(_type_of, plain)), times, list(map(_data_of, plain)))
    return True


class _Lines:
    """The lines of ``data[start:end]`` by their index from 0, split when one is first asked."""

    __slots__ = ("_data", "_end", "_lines", "_start")

    def __init__(self, data: bytes, start: int, end: int) -> None:
        self._data, self._start, self._end = data, start, end
        self._lines: list[bytes] | None = None

    def __call__(self, number: int) -> bytes:
        if self._lines is None:
            self._lines = self._data[self._start : self._end].split(b"\n")
        return self._lines[number]


def _compiled_line(line: bytes, seq: int) -> Columns | None:
    """The events of one line, if the compiled decoder reads it as the events expected."""
    try:
        record = _decode_record(line)
    except _REFUSED:
        return None
    return _columns([record], seq, lambda number: line)


def _columns(records: list[_Record], first: int, line_of: Callable[[int], bytes]) -> Columns | None:
    """The events of *records*, from seq *first* on, if all are the events expected.

    ``None`` if one is not: the standard library's decoder then says why. *line_of* gives the
    text of a record by its index; it is read only to tell the order of ``surfaceOp`` and
    ``sourceEventSeqs`` in a record that has both.
    """
    types: list[str] = []
    times = array("q")
    items: list[_Item] = []
    seq = first
    known = _EVENT_TYPES.get
    for number, record in enumerate(records):
        event_type = known(record.type)
        time = record.time
        if (
            event_type is not None
            and record.seq == seq
            and _optional_of(record) == _NONE_SET
            and not isinstance(time, UnsetType)
        ):  # the usual event: a known type, the four envelope keys alone
            types.append(event_type)
            times.append(time)
            items.append(record.data)
            seq += 1
            continue
        kind = _ROW_TAGS.get(record.type)
        if kind is not None:
            found = _compiled_row(record, seq, kind)
            if found is None:
                return None
            row, count = found
            types += [_CHUNK] * count
            times.frombytes(bytes(8 * count))  # unused: a row makes its members' times
            items += [row] * count
            seq += count
            continue
        event = _enveloped(record, seq, event_type, partial(line_of, number))
        if event is None:
            return None
        types.append(event.type)
        times.append(event.time)
        items.append(event)
        seq += 1
    return types, times, items


def _enveloped(
    record: _Record, seq: int, known_type: str | None, line: Callable[[], bytes]
) -> SessionEvent | None:
    """The event *record* holds, with the envelope fields it has, if it is the one expected."""
    time, ignorable = record.time, record.ignorable
    if record.seq != seq or isinstance(time, UnsetType):
        return None
    if record.seq0 is not UNSET or record.time0 is not UNSET:
        return None
    if ignorable is False or (known_type is None and ignorable is not True):
        return None  # refused, or unknown to this release (and not ignorable)
    if known_type is None and not bytes(record.data).startswith(b"{"):
        return None  # an ignorable event whose data is no object: read one by one
    event_type = known_type or record.type
    if not event_type:
        return None
    op, sources = record.surfaceOp, record.sourceEventSeqs
    surface_op = None
    if not isinstance(op, UnsetType):
        try:
            surface_op = _surface_op(_decode_value(op))
        except (*_REFUSED, RecordError):
            return None
    listed = None if isinstance(sources, UnsetType) else tuple(sources)
    if envelope_problem(event_type, seq, surface_op, listed) is not None:
        return None
    op_first = False
    if surface_op is not None and listed is not None:
        text = line()
        op_first = text.rfind(b'"surfaceOp":') < text.rfind(b'"sourceEventSeqs":')
    return SessionEvent.stored(
        event_type, seq, time, record.data, surface_op, listed, ignorable is True, op_first
    )


def _compiled_row(record: _Record, seq: int, kind: str) -> tuple[_Row, int] | None:
    """The row *record* holds, and how many members, if it is a packed row that starts at
    *seq* (its members' times are checked here, and made with the members)."""
    time0 = record.time0
    if (
        record.seq0 != seq
        or isinstance(time0, UnsetType)
        or record.seq is not UNSET
        or record.time is not UNSET
        or record.surfaceOp is not UNSET
        or record.sourceEventSeqs is not UNSET
        or record.ignorable is not UNSET
    ):
        return None
    try:
        row = _decode_row(kind, record.data)
    except _REFUSED:
        return None
    dt = row.dt
    count = len(row.args if isinstance(row, _CallRow) else row.texts)
    if len(dt) != count - 1:
        return None
    if not dt or min(dt) >= 0:  # the usual steps: the last member is the latest
        if time0 + sum(dt) > MAX_TIME:
            return None
    elif _member_times(time0, dt) is None:
        return None
    return _Row(seq, time0, record.data, kind), count


# -- reading runs of lines ---------------------------------------------------------------------


def _simple_events(records: list[JSONObject], seq: int, earlier: bool) -> list[SessionEvent] | None:
    """The events of records with exactly the four envelope keys, checked a column at a time.

    Several times faster than checking each record in a loop; ``None`` if any record is not
    the event expected (the caller then finds out which, and why).
    """
    try:
        columns = [list(map(itemgetter(key), records)) for key in ("type", "seq", "time", "data")]
    except (TypeError, KeyError):  # not objects, or four keys but not the envelope's
        return None
    types, seqs, times, datas = columns
    if (
        set(map(type, types)) != {str}
        or "" in types
        or set(map(type, seqs)) != {int}
        or seqs != list(range(seq, seq + len(seqs)))
        or set(map(type, times)) != {int}
        or min(times) < 0
        or max(times) > MAX_TIME
        or set(map(type, datas)) != {dict}
    ):
        return None
    if earlier:
        if not SURFACE_EVENT_TYPES.isdisjoint(types) or not KNOWN_EVENT_TYPES.issuperset(types):
            return None  # the earlier format's surface events and unknown types: one by one
    elif not KNOWN_EVENT_TYPES.issuperset(types):
        return None
    types = cast("list[str]", list(map(_EVENT_TYPES.get, types, types)))
    return list(map(SessionEvent, types, seqs, times, datas))


def _decode_lines(
    data: bytes, start: int, end: int, seq: int, earlier: bool
) -> list[SessionEvent] | None:
    """Decode the complete lines ``data[start:end]`` at once, if all are the records expected.

    The second fast path of :func:`scan_log`, for runs of lines the compiled decoder does not
    read (a lone surrogate escaped): the lines are wrapped as ``[[line],[line],...]`` and
    decoded in one call, which also shares one copy of each key among all the events. A line
    boundary can only separate the wrappers if every line is a complete JSON value (a string
    cannot span lines), and a wrapper must hold exactly one value, so a line is accepted here
    only if decoding it alone gives the same events. Anything else returns ``None``: the caller
    then decodes line by line, which alone reports or cuts damage.
    """
    lines = data[start:end]
    try:
        text = lines.decode("utf-8", "surrogatepass")
        wrapped = _decoder.decode("[[" + text.replace("\n", "\n],[")[:-2] + "]")
    except (ValueError, RecursionError):  # damage, or a deep stack: decoded line by line
        return None
    # Checked a column at a time with builtins, which is several times faster than a loop.
    if len(wrapped) != lines.count(b"\n") or set(map(len, wrapped)) != {1}:
        return None  # not exactly one value per line
    records = list(map(_first, wrapped))
    # Only where a line has more brackets than it may nest levels, measure the records.
    if (
        _TOO_MANY_OPENERS in lines.translate(_OPENERS, _NOT_OPENER_OR_NEWLINE)
        and json_depth(cast("JSON", records)) > _LINE_DEPTH + 1
    ):
        return None
    events: list[SessionEvent] = []
    try:
        # Runs of events with the four envelope keys alone are checked a column at a time;
        # packed rows (four keys too) and events with more keys, one by one.
        for simple, group in groupby(records, _is_simple):
            batch = list(group)
            if simple:
                found = _simple_events(batch, seq + len(events), earlier)
                if found is None:
                    return None
                events += found
            else:
                for record in batch:
                    events += _record_events(record, seq + len(events), earlier)
    except (AttributeError, TypeError, RecordError):  # not objects, or not the records expected
        return None
    return events


def _is_simple(record: JSONObject) -> bool:
    """Whether *record* has four keys and is no packed row (the fast path checks the rest)."""
    return len(record) == len(_ENVELOPE) and record.get("type") not in _ROW_TAGS


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a log's events are created.

    Every few hundred new containers trigger a collection, and each full collection walks
    every live object, so creating a million long-lived events spends most of its time in
    collections that free nothing. The collector is restored as it was (as Mercurial's
    ``util.nogc`` does); reference counting frees everything else meanwhile.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def decode_run(
    events: StoredEvents, data: bytes, start: int, end: int, *, earlier: bool = False
) -> bool:
    """Add the events of the complete lines ``data[start:end]``, the events expected next, at
    once; ``False`` (adding nothing) if they are not all intact events.

    *earlier* reads lines of this project's earlier format. The caller then decodes the lines
    one by one (:func:`decode_line`), which tells damage from a torn tail and names it.
    """
    if not earlier and _compiled_lines(events, data, start, end):
        return True
    lines = _decode_lines(data, start, end, len(events), earlier)
    if lines is None:
        return False
    events.extend(lines)
    return True


def decode_line(line: bytes, seq: int, *, earlier: bool = False, fresh_stack: bool) -> Columns:
    """The events of one line (a record without its newline), the events from *seq* on.

    *fresh_stack* tells that the caller runs on a fresh stack (:func:`on_fresh_stack`), where
    a line too deep to decode is refused rather than raising :class:`RecursionError`.

    :raises RecordError: naming what is wrong with the line.
    """
    if not earlier and (columns := _compiled_line(line, seq)) is not None:
        return columns
    events = _record_events(_parse(line, fresh_stack=fresh_stack), seq, earlier)
    times = array("q", [event.time for event in events])
    return [event.type for event in events], times, [*events]
