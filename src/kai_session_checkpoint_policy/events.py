"""Session events: the envelope every log entry has, and the lossless JSON rule for its data.

An event is ``{"type", "seq", "time", "data"}``: ``seq`` equals the number of events before it,
``time`` is Unix epoch milliseconds, and ``data`` is JSON that survives a round trip unchanged.
:func:`encode_data` enforces that rule once, at append time, and returns both a private copy of
the data and its canonical encoding, so a persistence backend never encodes an event again.

Three more envelope fields are shared with the original harness's session format: the three
*surface* types (the messages a model sees: ``user/message``, ``assistant/message`` and
``tool/result``) carry ``surfaceOp`` (how the message changes the transcript: ``"append"``),
and may carry ``sourceEventSeqs`` (the events the message was made from: the chunks of a
response, the ``tool/call`` a result answers); an event of a type a reader does not know is
refused unless it is marked ``ignorable``.
"""

from __future__ import annotations

import json
import json.encoder
import math
import operator
import sys
from array import array
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import compress
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Literal,
    NoReturn,
    Protocol,
    TypeAlias,
    TypeVar,
    cast,
    overload,
)

import msgspec

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

if TYPE_CHECKING:
    from collections.abc import Callable, Container, Iterable, Iterator

T = TypeVar("T")

__all__ = [
    "EVENT_TYPES",
    "JSON",
    "KNOWN_EVENT_TYPES",
    "MAX_JSON_DEPTH",
    "MAX_TIME",
    "SURFACE_EVENT_TYPES",
    "Deferred",
    "EventDataError",
    "EventSequence",
    "JSONObject",
    "SessionEvent",
    "StoredDataError",
    "StoredEvents",
    "SurfaceOp",
    "SurfaceReplace",
    "encode_data",
    "envelope_problem",
    "json_depth",
    "on_fresh_stack",
    "time_problem",
]

JSON: TypeAlias = "bool | int | float | str | list[JSON] | dict[str, JSON] | None"
JSONObject: TypeAlias = "dict[str, JSON]"

EVENT_TYPES: Final = frozenset(
    {
        "turn/start",
        "step/start",
        "user/message",
        "request/header",
        "request/context",
        "assistant/chunk",
        "assistant/message",
        "tool/call",
        "tool/result",
        "step/end",
        "turn/end",
    }
)
"""The event types this package writes."""

KNOWN_EVENT_TYPES: Final = EVENT_TYPES | frozenset(
    {
        "agent-preset/selected",
        "agent/inbox/spliced",
        "approval/asked",
        "approval/decided",
        "approval/policy",
        "command/done",
        "command/run",
        "compaction/end",
        "compaction/prune",
        "compaction/start",
        "compaction/summary",
        "feedback/record",
        "goal/change",
        "hook/invoked",
        "hook/result",
        "llm/retry",
        "llm/retry-started",
        "permission/preset",
        "plan/mode",
        "sandbox/mode",
        "schedule/change",
        "session/end-seed",
        "session/title",
        "session/title-llm-request",
        "subagent/descriptor",
        "team/member",
        "team/message/delivered",
        "team/message/queued",
        "team/task",
        "todo/write",
        "tool-workflow/agent-end",
        "tool-workflow/agent-start",
        "tool-workflow/run-end",
        "tool-workflow/run-start",
        "tool/code-dispatch",
        "tool/code-dispatch-start",
        "web/deepseek-search-llm-request",
    }
)
"""The 48 event types of the session format: a log may hold these; an event of any other type
must be marked ``ignorable``, or the log is refused as unsupported."""

SURFACE_EVENT_TYPES: Final = frozenset({"user/message", "assistant/message", "tool/result"})
"""The types whose events are messages of the transcript; only they carry ``surfaceOp`` and
``sourceEventSeqs``."""

MAX_TIME: Final = 253_402_300_799_999
"""The latest time an event may have, in epoch milliseconds: the end of the year 9999 (UTC),
the last moment :class:`datetime.datetime` can show. Times are integers from 0 to this."""


def time_problem(time: object) -> str | None:
    """What is wrong with *time* as an event's time, or ``None``: an integer number of epoch
    milliseconds from 0 (1970) to :data:`MAX_TIME` (the end of the year 9999)."""
    if type(time) is int and 0 <= time <= MAX_TIME:
        return None
    if type(time) is not int:
        return (
            f"the time {time!r} is not an integer number of epoch milliseconds (a clock in "
            "seconds, microseconds or floats?)"
        )
    return (
        f"the time {time} is outside 0 to {MAX_TIME}: before 1970 or after the year 9999 in "
        "epoch milliseconds (a clock that jumped, or in another unit?)"
    )


MAX_JSON_DEPTH: Final = 64
"""How many levels of arrays and objects event data may nest; the data object is level 1.

The events this package writes nest 6 levels at most (the text block of a tool result), and
data a host adds rarely needs a dozen; 64 leaves room for both. The bound is what makes every
log readable wherever it is read: the C encoder and decoder of :mod:`json` recurse once per
level, and on Python 3.10 and 3.11 each level counts against the interpreter's recursion limit
(1000 frames by default). Without it, data could be appended that a reader cannot decode, or
can only on a shallower stack. Data within the bound is encoded and decoded on any stack: when
the caller's stack is too deep, the work is done again on a fresh one (:func:`on_fresh_stack`).
"""

_CONTAINERS: Final = frozenset({list, dict})
_COUNTED_TEXT: Final = 4096
"""Up to how many characters an encoding's brackets are counted before its data is measured."""

_encoder: Final = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
_decoder: Final = json.JSONDecoder()
_encode_string: Final = json.encoder.encode_basestring_ascii
_ENCODED_TYPES: Final = {event_type: _encode_string(event_type) for event_type in KNOWN_EVENT_TYPES}
_make_c_encoder: Final[Callable[..., Callable[[object, int], Iterable[str]]] | None] = getattr(
    json.encoder, "c_make_encoder", None
)


_fast_encoder: Final = msgspec.json.Encoder()
_fast_decoder: Final = msgspec.json.Decoder()
_FAST_PATH_ERRORS: Final = (
    TypeError,
    ValueError,
    OverflowError,
    RecursionError,
    msgspec.MsgspecError,
)


def _encode(value: object) -> str:
    """``_encoder.encode(value)``, without the setup it repeats on every call.

    ``JSONEncoder.encode`` builds a new encoder on every call; when the json module has its C
    accelerator, this makes the same call to it directly (a fresh markers dict included, so
    circular references are reported the same way), in less than half the time.
    """
    if _make_c_encoder is None:
        return _encoder.encode(value)
    encoder = _make_c_encoder(
        {}, _encoder.default, _encode_string, None, ":", ",", False, False, False
    )
    return "".join(encoder(value, 0))


def json_depth(value: JSON) -> int:
    """How many levels of arrays and objects *value* nests: 0 for a scalar, 1 for ``[1]``.

    Counted a level at a time, without recursion, for a value decoded from JSON (a tree of
    plain lists and dicts); strings, however long, cost nothing.
    """
    depth, level = 0, [value] if type(value) in _CONTAINERS else []
    while level:  # the containers at this depth
        depth += 1
        below: list[JSON] = []
        for container in cast("list[list[JSON] | dict[str, JSON]]", level):
            for item in container.values() if type(container) is dict else container:
                if type(item) in _CONTAINERS:
                    below.append(item)
        level = below
    return depth


def on_fresh_stack(function: Callable[[], T]) -> T:
    """Return what *function* returns (or raise what it raises), called in a new thread.

    A new thread starts with an empty stack: work that recurses once per level of nested JSON
    and ran out of stack in a caller deep in its own recursion is tried there again.
    """
    with ThreadPoolExecutor(1, thread_name_prefix="kai-fresh-stack") as pool:
        return pool.submit(function).result()


class EventDataError(TypeError):
    """Event data that JSON cannot carry unchanged (NaN, a non-string key, bytes, a tuple...)."""


@dataclass(frozen=True, slots=True)
class SurfaceReplace:
    """A surface operation that replaces the messages from seq *start* to *end* (inclusive)."""

    start: int
    end: int

    def to_json(self) -> JSONObject:
        return {"op": "replace", "start": self.start, "end": self.end}


SurfaceOp: TypeAlias = 'Literal["append"] | SurfaceReplace'
"""How a surface event changes the transcript: ``"append"`` (JSON ``"append"``), or a
:class:`SurfaceReplace` (JSON ``{"op": "replace", "start": ..., "end": ...}``)."""


class _Unread:
    """The data of a stored event that has not been decoded yet."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<not decoded yet>"


_UNREAD: Final = _Unread()


class StoredDataError(ValueError):
    """The stored data of an event, decoded only when it was first read, is not valid data.

    Reading a log checks every record's envelope at once, and the data of the events recovery
    needs; the data of the others is checked when it is first read. ``event_type``, ``seq``
    and ``problem`` name the event and what is wrong with its data.
    """

    def __init__(self, event_type: str, seq: int, problem: str) -> None:
        super().__init__(f"the data of the stored {event_type!r} event (seq {seq}): {problem}")
        self.event_type = event_type
        self.seq = seq
        self.problem = problem


class SessionEvent:
    """One entry of a session's event log.

    Treat an event, and its ``data``, as read-only: it is the log's own copy, shared with every
    reader. An event read from storage keeps its data encoded until ``data`` is first read
    (:meth:`stored`), so that a long log nobody reads the chunks of holds them as bytes.
    """

    __slots__ = ("_data", "_encoded", "_envelope", "seq", "time", "type")

    type: str
    seq: int
    time: int

    def __init__(
        self,
        type: str,
        seq: int,
        time: int,
        data: JSONObject,
        data_json: str | None = None,
        surface_op: SurfaceOp | None = None,
        source_event_seqs: tuple[int, ...] | None = None,
        ignorable: bool = False,
        surface_op_first: bool = False,
    ) -> None:
        self.type = type
        self.seq = seq
        self.time = time
        self._data: JSONObject | _Unread = data
        self._encoded: str | bytes | memoryview | msgspec.Raw | None = data_json
        self._envelope: tuple[SurfaceOp | None, tuple[int, ...] | None, bool, bool] | None = (
            None
            if surface_op is None and source_event_seqs is None and not ignorable
            else (surface_op, source_event_seqs, ignorable, surface_op_first)
        )

    @classmethod
    def stored(
        cls,
        type: str,
        seq: int,
        time: int,
        encoded_data: bytes | memoryview | msgspec.Raw,
        surface_op: SurfaceOp | None = None,
        source_event_seqs: tuple[int, ...] | None = None,
        ignorable: bool = False,
        surface_op_first: bool = False,
    ) -> SessionEvent:
        """An event read from storage, its data kept as the JSON text *encoded_data* until read.

        The envelope fields are taken as they are: the reader has checked them.
        """
        event = cls.__new__(cls)
        event.type, event.seq, event.time = type, seq, time
        event._data, event._encoded = _UNREAD, encoded_data
        event._envelope = (
            None
            if surface_op is None and source_event_seqs is None and not ignorable
            else (surface_op, source_event_seqs, ignorable, surface_op_first)
        )
        return event

    @property
    def data(self) -> JSONObject:
        """The event's data.

        :raises StoredDataError: if the event was read from storage and its data, decoded now,
            is not a JSON object of finite numbers nested at most :data:`MAX_JSON_DEPTH`.
        """
        data = self._data
        if isinstance(data, _Unread):
            data = self._data = _decode_stored(self.type, self.seq, self._encoded)
        return data

    @property
    def data_json(self) -> str | None:
        """The encoding of ``data`` as it was written or read, when known."""
        encoded = self._encoded
        if encoded is None or isinstance(encoded, str):
            return encoded
        try:
            return _text(encoded)
        except _BadData as exc:
            _refuse_stored(self.type, self.seq, str(exc))

    @property
    def surface_op(self) -> SurfaceOp | None:
        """How a surface event changes the transcript; ``None`` on every other type."""
        return None if self._envelope is None else self._envelope[0]

    @property
    def source_event_seqs(self) -> tuple[int, ...] | None:
        """The seqs of the events a surface event was made from, when known."""
        return None if self._envelope is None else self._envelope[1]

    @property
    def ignorable(self) -> bool:
        """Whether a reader that does not know the event's type may go on without it."""
        return self._envelope is not None and self._envelope[2]

    @property
    def surface_op_first(self) -> bool:
        """Whether ``surfaceOp`` is written before ``sourceEventSeqs``, as the original harness's
        crash repair writes them (every other writer puts ``sourceEventSeqs`` first)."""
        return self._envelope is not None and self._envelope[3]

    def copy(self) -> SessionEvent:
        """An equal event whose data is decoded anew from its encoding when first read: a
        copy a reader may change without changing this event."""
        encoded = self.data_json
        if encoded is None:
            encoded = _encode(self.data)
        return SessionEvent.stored(
            self.type,
            self.seq,
            self.time,
            encoded.encode("utf-8", "surrogatepass"),
            self.surface_op,
            self.source_event_seqs,
            self.ignorable,
            self.surface_op_first,
        )

    def replace(self, **changes: Any) -> SessionEvent:
        """A copy with *changes* (any of the constructor's arguments), as ``dataclasses.replace``.

        A new ``data`` drops the encoding the event had.
        """
        fields: dict[str, Any] = {
            "type": self.type,
            "seq": self.seq,
            "time": self.time,
            "data": self.data,
            "data_json": self.data_json,
            "surface_op": self.surface_op,
            "source_event_seqs": self.source_event_seqs,
            "ignorable": self.ignorable,
            "surface_op_first": self.surface_op_first,
        }
        if "data" in changes:
            fields["data_json"] = None
        fields.update(changes)
        return SessionEvent(**fields)

    def _key(self) -> tuple[object, ...]:
        envelope = self._envelope
        return (self.type, self.seq, self.time, None if envelope is None else envelope[:3])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SessionEvent):
            return NotImplemented
        return self._key() == other._key() and self.data == other.data

    __hash__ = None  # type: ignore[assignment]  # its data is mutable JSON

    def __repr__(self) -> str:
        parts = f"type={self.type!r}, seq={self.seq!r}, time={self.time!r}, data={self.data!r}"
        if self._envelope is not None:
            op, seqs, ignorable, _first = self._envelope
            parts += f", surface_op={op!r}, source_event_seqs={seqs!r}, ignorable={ignorable!r}"
        return f"SessionEvent({parts})"

    def to_json(self) -> JSONObject:
        """Return the envelope as a JSON object, with the keys :meth:`encode` writes."""
        envelope: JSONObject = {
            "type": self.type,
            "seq": self.seq,
            "time": self.time,
            "data": self.data,
        }
        seqs: JSON = None if self.source_event_seqs is None else list(self.source_event_seqs)
        op = self.surface_op
        op_json: JSON = op if isinstance(op, (str, type(None))) else op.to_json()
        for key, value in (
            (("surfaceOp", op_json), ("sourceEventSeqs", seqs))
            if self.surface_op_first
            else (("sourceEventSeqs", seqs), ("surfaceOp", op_json))
        ):
            if value is not None:
                envelope[key] = value
        if self.ignorable:
            envelope["ignorable"] = True
        return envelope

    def encode(self) -> str:
        """Return the envelope as one line of compact JSON, without the newline.

        The keys are ``type``, ``seq``, ``time``, ``data``, then those that are set of
        ``sourceEventSeqs`` and ``surfaceOp`` (in the other order if
        :attr:`surface_op_first`), then ``ignorable``. The data is written as it was encoded
        when appended, or as it was read.
        """
        encoded_type = _ENCODED_TYPES.get(self.type) or _encode_string(self.type)
        data = self.data_json
        if data is None:
            data = _encode(self.data)
        head = f'{{"type":{encoded_type},"seq":{self.seq},"time":{self.time},"data":{data}'
        if self._envelope is None:
            return head + "}"
        return head + self._envelope_tail() + "}"

    def _envelope_tail(self) -> str:
        op = self.surface_op
        encoded_op = (
            ""
            if op is None
            else ',"surfaceOp":"append"'
            if op == "append"
            else f',"surfaceOp":{_encode(op.to_json())}'
        )
        seqs = self.source_event_seqs
        encoded_seqs = "" if seqs is None else f',"sourceEventSeqs":[{",".join(map(str, seqs))}]'
        tail = encoded_op + encoded_seqs if self.surface_op_first else encoded_seqs + encoded_op
        return tail + ',"ignorable":true' if self.ignorable else tail


class Deferred(Protocol):
    """Stored events read as one record (a packed row), made into events when first read."""

    def events(self) -> Sequence[SessionEvent]:
        """The events, in seq order."""
        ...


class EventSequence(Sequence[SessionEvent]):
    """A read-only sequence of events that compares equal to any sequence of equal events, as
    a tuple does (and so is not hashable)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(map(operator.eq, self, other))

    __hash__ = None  # type: ignore[assignment]  # its events are mutable

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {len(self)} events>"


class StoredEvents(EventSequence):
    """The events of a stored log, from seq 0 on, each made an object when it is first read.

    Until then a log holds, for each event, its type (one shared string per type), its time
    (in an array of integers) and its data as the raw bytes of its record, which decoding the
    log left undecoded; a million chunks nobody reads cost no Python object each. An event
    read once is kept, so reading it again returns the same object.

    A live session keeps its older events in one too, in blocks, the texts of their data
    compressed together (:meth:`extend_settled`), made into equal events when one is read.

    Reading a log's events fills it (:meth:`extend`, :meth:`extend_stored`); a reader treats
    it as read-only.
    """

    __slots__ = ("_items", "_times", "_types")

    def __init__(self, events: Iterable[SessionEvent] = ()) -> None:
        self._types: list[str] = []
        self._times = array("q")
        self._items: list[SessionEvent | msgspec.Raw | Deferred] = []
        self.extend(events)

    def extend_settled(self, events: Sequence[SessionEvent]) -> None:
        """Add events that follow the last one, kept as one block: their types, times and
        envelope fields, and the texts of their data compressed together. Reading any of
        them makes them all again, equal to what they were, and keeps them (as the members of
        a packed row are: see :class:`Deferred`).

        For the events a live session appended, once they are no longer the ones read most.

        :raises ValueError: if their seqs do not continue from the number of events so far.
        """
        first = len(self._items)
        if not events:
            return
        if events[0].seq != first or events[-1].seq != first + len(events) - 1:
            raise ValueError(f"stored events must continue from seq {first}, in order")
        types = list(map(_type_of, events))
        times = array("q", map(_time_of, events))
        block = _Settled(first, types, times, events)
        self._types += types
        self._times += times
        self._items += [block] * len(events)

    def extend(self, events: Iterable[SessionEvent]) -> None:
        """Add events that follow the last one.

        :raises ValueError: if their seqs do not continue from the number of events so far.
        """
        events = list(events)
        first = len(self._items)
        if [event.seq for event in events] != list(range(first, first + len(events))):
            raise ValueError(f"stored events must continue from seq {first}, in order")
        self._types += [event.type for event in events]
        self._times.extend(event.time for event in events)
        self._items += events

    def extend_stored(
        self,
        types: Sequence[str],
        times: Iterable[int],
        items: Sequence[SessionEvent | msgspec.Raw | Deferred],
    ) -> None:
        """Add stored events that follow the last one: for each, its type, its time, and the
        event, the raw data of an event without more envelope fields, or the one
        :class:`Deferred` record every event it holds refers to."""
        self._types += types
        self._times.extend(times)
        self._items += items

    def stored_data(
        self, types: Container[str], start: int = 0
    ) -> tuple[list[int], list[str], list[msgspec.Raw | None]]:
        """The seqs and types of the events from seq *start* on whose type is in *types*, and
        for each the stored JSON text of its data (a :class:`msgspec.Raw`) if the event has not
        been made yet (``None`` if it has: read it). Nothing is made or decoded."""
        kinds = self._types
        seqs = list(compress(range(start, len(kinds)), map(types.__contains__, kinds[start:])))
        items = list(map(self._items.__getitem__, seqs))
        texts = [item if type(item) is msgspec.Raw else None for item in items]
        return seqs, list(map(kinds.__getitem__, seqs)), texts

    def replace(self, event: SessionEvent) -> None:
        """Put *event* in place of the stored event with its seq (a reader converting an older
        record; the type may change with it).

        :raises IndexError: if there is no event with that seq.
        """
        self._event(event.seq)  # a packed row's members are made first, each in its place
        self._types[event.seq] = event.type
        self._times[event.seq] = event.time
        self._items[event.seq] = event

    def copy(self) -> StoredEvents:
        """A copy that can be extended on its own; events already made are shared."""
        copy = StoredEvents()
        copy._types, copy._times, copy._items = self._types[:], self._times[:], self._items[:]
        return copy

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> SessionEvent: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[SessionEvent, ...]: ...
    def __getitem__(self, index: int | slice) -> SessionEvent | tuple[SessionEvent, ...]:
        if isinstance(index, slice):
            return tuple(map(self._event, range(*index.indices(len(self._items)))))
        item = self._items[index]  # an IndexError as a list raises it
        if type(item) is SessionEvent:
            return item
        return self._event(index + len(self._items) if index < 0 else index)

    def __iter__(self) -> Iterator[SessionEvent]:
        return map(self._event, range(len(self._items)))

    def _event(self, index: int) -> SessionEvent:
        item = self._items[index]
        if type(item) is SessionEvent:
            return item
        if type(item) is msgspec.Raw:
            event = SessionEvent.stored(self._types[index], index, self._times[index], item)
            self._items[index] = event
            return event
        events = cast("Deferred", item).events()
        first = events[0].seq
        self._items[first : first + len(events)] = events
        return events[index - first]

    @property
    def types(self) -> Sequence[str]:
        """The type of every event, by seq, without making any event (read-only)."""
        return self._types

    def fresh(self, seqs: Iterable[int]) -> Iterator[SessionEvent]:
        """The events at *seqs*, in that order, made for the caller and not kept.

        An event already made is returned as it is; the others are made anew each time and
        left to the caller, so that going through a long log this way holds at most one
        packed row's events at a time, where iterating it keeps every event it made.
        """
        row: Deferred | None = None
        members: Sequence[SessionEvent] = ()
        for seq in seqs:
            item = self._items[seq]
            if type(item) is SessionEvent:
                yield item
            elif type(item) is msgspec.Raw:
                yield SessionEvent.stored(self._types[seq], seq, self._times[seq], item)
            else:
                if item is not row:
                    row = cast("Deferred", item)
                    members = row.events()
                yield members[seq - members[0].seq]

    def select(
        self, types: Container[str], start: int = 0, stop: int | None = None
    ) -> list[SessionEvent]:
        """The events from seq *start* on (up to *stop*, if given) whose type is in *types*;
        the others stay unmade."""
        stop = len(self._types) if stop is None else stop
        found = compress(range(start, stop), map(types.__contains__, self._types[start:stop]))
        return list(map(self._event, found))

    def __add__(self, other: Sequence[SessionEvent]) -> StoredEvents:
        joined = self.copy()
        joined.extend(other)
        return joined


_Envelope: TypeAlias = "tuple[SurfaceOp | None, tuple[int, ...] | None, bool, bool]"
_encoded_of: Final = operator.attrgetter("_encoded")
_type_of: Final = operator.attrgetter("type")
_time_of: Final = operator.attrgetter("time")
_data_json_of: Final = operator.attrgetter("data_json")
_envelope_of: Final = operator.attrgetter("_envelope")


class _Settled:
    """Events kept as one block (:meth:`StoredEvents.extend_settled`): the texts of their
    data, one a line, compressed together (Zstandard, its fastest level: a block of 512 chunks takes
    tens of microseconds, and texts as alike as a response's chunks shrink many times over);
    their types, times, and the envelope fields of those that have more than the four."""

    __slots__ = ("_envelopes", "_first", "_texts", "_times", "_types")

    def __init__(
        self, first: int, types: list[str], times: array[int], events: Sequence[SessionEvent]
    ) -> None:
        texts = list(map(_encoded_of, events))
        envelopes = list(map(_envelope_of, events))
        try:
            # Compact JSON holds no raw newline: one text a line. Lone surrogates are carried
            # as they are read back from a log.
            joined = "\n".join(texts).encode("utf-8", "surrogatepass")
        except TypeError:  # not all made with their data's text
            texts = [
                _encode(event.data) if text is None else text
                for event, text in zip(events, map(_data_json_of, events), strict=True)
            ]
            joined = "\n".join(texts).encode("utf-8", "surrogatepass")
        self._texts = zstd.compress(joined, level=1)
        self._envelopes = (
            None
            if envelopes.count(None) == len(envelopes)
            else {index: envelope for index, envelope in enumerate(envelopes) if envelope}
        )
        self._first, self._types, self._times = first, tuple(types), times

    def events(self) -> list[SessionEvent]:
        texts = zstd.decompress(self._texts).split(b"\n")
        envelopes = self._envelopes or {}
        first, times, made = self._first, self._times, []
        for index, event_type in enumerate(self._types):
            event = SessionEvent.__new__(SessionEvent)
            event.type, event.seq, event.time = event_type, first + index, times[index]
            event._data, event._encoded = _UNREAD, texts[index]
            event._envelope = envelopes.get(index)
            made.append(event)
        return made


def envelope_problem(
    event_type: str,
    seq: int,
    surface_op: SurfaceOp | None,
    source_event_seqs: Sequence[int] | None,
) -> str | None:
    """Why these envelope fields cannot go together, or ``None`` if they can.

    Only a surface type carries a surface operation or source seqs; a replacement names a
    range of earlier seqs; source seqs are distinct seqs of earlier events, and at least one
    except on ``assistant/message`` (whose response may have streamed nothing).
    """
    if event_type not in SURFACE_EVENT_TYPES:
        if surface_op is not None or source_event_seqs is not None:
            surfaces = ", ".join(sorted(SURFACE_EVENT_TYPES))
            return f"only {surfaces} events carry surfaceOp and sourceEventSeqs, not {event_type!r}"
        return None
    op: object = surface_op  # as a host may pass it
    if isinstance(op, SurfaceReplace):
        start, end = op.start, op.end
        if not (_is_seq(start) and _is_seq(end) and start <= end < seq):
            return f"surfaceOp replaces seqs {start!r} to {end!r}, not a range of earlier seqs"
    elif op is not None and op != "append":
        return f'surfaceOp is {op!r}, not "append" or a replacement'
    if source_event_seqs is not None:
        if not all(_is_seq(source) and source < seq for source in source_event_seqs):
            return f"sourceEventSeqs {list(source_event_seqs)!r} are not all seqs of earlier events"
        if len(set(source_event_seqs)) != len(source_event_seqs):
            return f"sourceEventSeqs {list(source_event_seqs)!r} repeat a seq"
        if not source_event_seqs and event_type != "assistant/message":
            return f"sourceEventSeqs of a {event_type!r} event is empty"
    return None


def _is_seq(value: object) -> bool:
    return type(value) is int and value >= 0


def encode_data(event_type: str, data: object) -> tuple[JSONObject, str]:
    """Check that *data* is a lossless JSON object; return a private copy and its encoding.

    The data may nest at most :data:`MAX_JSON_DEPTH` levels of arrays and objects. How deep the
    caller's own stack is does not matter. The encoding is compact ASCII JSON.

    Lossless means that the data reads back equal: it is encoded and decoded again, by the
    compiled codec (``msgspec``) where the encoding is ASCII and the compiled codec can carry
    it, else by the standard library's, whose round trip also names what would change.

    :raises EventDataError: naming the event type and the path of the first offending value,
        or how deep the data nests.
    """
    if type(data) is dict:
        try:
            encoded = _fast_encoder.encode(data)
            if encoded.isascii():
                copy = _fast_decoder.decode(encoded)
                if copy == data and (
                    len(encoded) <= 2 * MAX_JSON_DEPTH or not _maybe_too_deep(encoded, copy)
                ):
                    return copy, encoded.decode("ascii")
        except _FAST_PATH_ERRORS:
            pass  # the standard library's path says what is wrong, if anything is
    try:
        return _checked(event_type, data, False)
    except RecursionError:
        return on_fresh_stack(partial(_checked, event_type, data, True))


def _maybe_too_deep(encoded: bytes | str, decoded: JSON) -> bool:
    """Whether *decoded* (encoded as *encoded*) may nest deeper than :data:`MAX_JSON_DEPTH`.

    Data nests no deeper than half its encoding's length, nor than it has brackets, so most
    data need not be measured; counting a long encoding costs more than measuring it.
    """
    size = len(encoded)
    if size <= 2 * MAX_JSON_DEPTH:
        return False
    if size <= _COUNTED_TEXT and _openers(encoded) <= MAX_JSON_DEPTH:
        return False
    return json_depth(decoded) > MAX_JSON_DEPTH


def _openers(encoded: bytes | str) -> int:
    """How many arrays and objects *encoded* may open (brackets in strings count too)."""
    if isinstance(encoded, bytes):
        return encoded.count(b"[") + encoded.count(b"{")
    return encoded.count("[") + encoded.count("{")


def _decode_stored(
    event_type: str, seq: int, encoded: str | bytes | memoryview | msgspec.Raw | None
) -> JSONObject:
    """The data of a stored event, decoded and checked; see :class:`StoredDataError`."""
    if encoded is None:  # pragma: no cover - an event has data or its encoding
        raise StoredDataError(event_type, seq, "none stored")
    try:
        data: JSON = _fast_decoder.decode(encoded)
    except (msgspec.MsgspecError, RecursionError):
        # What the compiled codec refuses (a lone surrogate escaped, a non-finite number, data
        # too deep for this stack): the standard library's decoder, which says why.
        try:
            text = encoded if isinstance(encoded, str) else _text(encoded)
            try:
                data = _strict_loads(text)
            except RecursionError:
                data = on_fresh_stack(partial(_strict_loads, text))
        except _BadData as exc:
            _refuse_stored(event_type, seq, str(exc))
        except RecursionError:  # too deep even for a fresh stack: far deeper than the bound
            _refuse_stored(event_type, seq, _TOO_DEEP_STORED)
    if not isinstance(data, dict):
        _refuse_stored(event_type, seq, "not a JSON object")
    if _maybe_too_deep(encoded if isinstance(encoded, str) else bytes(encoded), data):
        # (bytes() of a raw slice is a copy, made only for data long enough to be measured)
        _refuse_stored(event_type, seq, _TOO_DEEP_STORED)
    return data


def _text(encoded: bytes | memoryview | msgspec.Raw) -> str:
    """Stored UTF-8 as text; lone surrogates pass, as they do in a whole line of a log."""
    try:
        return bytes(encoded).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise _BadData(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None


_TOO_DEEP_STORED: Final = f"nested deeper than {MAX_JSON_DEPTH} levels"


def _refuse_stored(event_type: str, seq: int, problem: str) -> NoReturn:
    raise StoredDataError(event_type, seq, problem)


class _BadData(ValueError):
    """Why stored data is not data this package reads."""


def _not_finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadData(f"{text} is not a finite number")
    return value


def _no_constant(name: str) -> NoReturn:
    raise _BadData(f"{name} is not a finite number")


_strict_decoder: Final = json.JSONDecoder(parse_float=_not_finite, parse_constant=_no_constant)


def _strict_loads(text: str) -> JSON:
    try:
        value: JSON = _strict_decoder.decode(text)
    except _BadData:
        raise
    except ValueError as exc:
        raise _BadData(f"not valid JSON ({exc})") from None
    return value


def _checked(event_type: str, data: object, fresh_stack: bool, /) -> tuple[JSONObject, str]:
    if not isinstance(data, dict):
        raise EventDataError(
            f"data of {event_type!r} events must be a JSON object, not {type(data).__name__}"
        )
    try:
        encoded = _encode(data)
        copy = _decoder.raw_decode(encoded)[0]  # json.loads, minus its checks for whitespace
    except (TypeError, ValueError):
        pass
    except RecursionError:
        if not fresh_stack:
            raise
        # Too deep even for a whole stack, so far deeper than the bound.
    else:
        if _maybe_too_deep(encoded, copy):
            raise _too_deep(event_type, str(json_depth(copy)))
        if copy == data:
            return copy, encoded
    problem = _first_problem(data, "data")
    if problem is _BEYOND_THE_BOUND:
        raise _too_deep(event_type, f"more than {MAX_JSON_DEPTH}")
    raise EventDataError(
        f"data of a {event_type!r} event is not losslessly JSON-serializable: "
        f"{problem or 'data changes in a JSON round trip'}"
    )


def _too_deep(event_type: str, depth: str) -> EventDataError:
    return EventDataError(
        f"data of a {event_type!r} event is nested {depth} levels deep (arrays and objects); "
        f"at most {MAX_JSON_DEPTH} levels are allowed"
    )


_BEYOND_THE_BOUND: Final = "a value nested deeper than MAX_JSON_DEPTH"


def _first_problem(value: object, path: str, parents: tuple[int, ...] = ()) -> str | None:
    """Describe the first value under *path* that JSON would reject or change, if any.

    Only the first :data:`MAX_JSON_DEPTH` levels are searched: beyond them, the problem is the
    depth itself (:data:`_BEYOND_THE_BOUND`).
    """
    if id(value) in parents:
        return f"{path} contains itself"
    parents = (*parents, id(value))
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r}"
    if isinstance(value, (list, dict)) and len(parents) > MAX_JSON_DEPTH:
        return _BEYOND_THE_BOUND
    if isinstance(value, list):
        problems = (_first_problem(item, f"{path}[{i}]", parents) for i, item in enumerate(value))
        return next((problem for problem in problems if problem), None)
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has the non-string key {key!r}"
            problem = _first_problem(item, f"{path}[{key!r}]", parents)
            if problem:
                return problem
        return None
    return f"{path} is of type {type(value).__name__}, which JSON cannot carry unchanged"
