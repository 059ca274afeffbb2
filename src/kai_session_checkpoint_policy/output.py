"""Human-readable output: one line per event, with colour only where it is wanted.

Event data, session ids and paths are untrusted text (tool output is often web content): every
piece of it goes through :func:`printable`, which shows control characters escaped, so output
never moves the cursor, forges a line or fails on a lone surrogate. The command line and the
demo both print with it.
"""

from __future__ import annotations

import json
import os
import re
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import chain
from typing import TYPE_CHECKING, Final, TextIO

from . import eventdata
from .events import StoredEvents, SurfaceReplace

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from .events import JSON, SessionEvent
    from .persistence import SessionHeader, StoredLog

__all__ = [
    "Attention",
    "Console",
    "JsonStream",
    "LogSummary",
    "LogView",
    "TurnSpan",
    "attention",
    "compact",
    "describe",
    "each_of",
    "event_line",
    "format_of",
    "format_time",
    "json_header",
    "print_events",
    "print_json",
    "print_log",
    "print_repair",
    "printable",
    "summarize",
    "turn_of_each",
    "turn_spans",
    "types_of",
]


@dataclass
class Console:
    """Where human-readable output goes, with colour only on a terminal that wants it.

    Colour is used when *stream* is a terminal, ``NO_COLOR`` is unset or empty, and ``TERM``
    is not ``dumb``.
    """

    stream: TextIO
    color: bool = False
    live: bool = True
    """Flush after every line (as the demo wants); a long listing leaves it to the stream."""

    @classmethod
    def for_stream(cls, stream: TextIO, *, live: bool = True) -> Console:
        wants_color = (
            stream.isatty()
            and not os.environ.get("NO_COLOR")
            and os.environ.get("TERM", "") != "dumb"
        )
        return cls(stream, wants_color, live)

    def _paint(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def bold(self, text: str) -> str:
        return self._paint("1", text)

    def dim(self, text: str) -> str:
        return self._paint("2", text)

    def good(self, text: str) -> str:
        return self._paint("32", text)

    def bad(self, text: str) -> str:
        return self._paint("31", text)

    def note(self, text: str) -> str:
        return self._paint("33", text)

    def line(self, text: str = "") -> None:
        self.stream.write(text + "\n")
        if self.live:
            self.stream.flush()


_UNPRINTABLE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
"""C0 and C1 controls, DEL, line and paragraph separators, bidi embeddings, overrides and
isolates, and lone surrogates."""


def printable(text: str) -> str:
    """*text* with every control character escaped visibly, as Python writes it (``\\x1b``).

    Escapes what could move the cursor, erase or forge a line, set the terminal's title, or
    reorder what follows (C0 and C1 controls, DEL, U+2028, U+2029, U+202A-U+202E and
    U+2066-U+2069), and lone surrogates, which no UTF-8 output can encode. Every piece of
    untrusted text (event data and types, session ids, paths) goes through it before it is
    printed.
    """
    return _UNPRINTABLE.sub(lambda match: match[0].encode("unicode_escape").decode(), text)


def _shorten(text: str, limit: int = 72) -> str:
    text = " ".join(printable(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compact(value: JSON) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _block(block: JSON) -> str:
    if not isinstance(block, dict):
        return compact(block)
    if block.get("type") == "tool-call":
        return f"tool-call {block.get('name')}({block.get('arguments')}) [{block.get('id')}]"
    if block.get("type") in ("text", "reasoning"):
        return f"{block.get('type')} {block.get('text')!r}"
    return compact(block)


def _chunk(chunk: dict[str, JSON]) -> str:
    """One stream chunk, in the shapes of ``contract.StreamChunk``."""
    kind = chunk.get("type")
    index = chunk.get("index") if type(chunk.get("index")) is int else "?"
    if kind == "block-start":
        return f"block {index} starts: {chunk.get('blockType')}"
    if kind in ("text-delta", "reasoning-delta"):
        return f"block {index}: {chunk.get('text')!r}"
    if kind == "tool-call-delta":
        return f"block {index}: {chunk.get('name') or ''} {chunk.get('argumentsDelta')!r}"
    if kind == "block-end":
        return f"block {index} ends: {_block(chunk.get('block'))}"
    if kind == "usage":
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            return "usage " + ", ".join(f"{key} {value}" for key, value in usage.items())
    if kind == "finish":
        reason = chunk.get("reason")
        return f"finish ({reason.get('kind') if isinstance(reason, dict) else reason})"
    return compact(chunk)


def describe(event: SessionEvent) -> str:
    """A one-line human summary of *event*, :func:`printable`.

    What the envelope says is shown too: the chunks a message was made from, the ``tool/call``
    a result answers (``[<call id> of seq <n>]``), a replacement, an ignorable event.
    """
    notes = [note for note in (_sources(event), _surface(event)) if note]
    if event.ignorable:
        notes.append("ignorable")
    summary = _summary(event)
    return _shorten(f"({'; '.join(notes)}) {summary}" if notes else summary)


def _seq_ranges(seqs: tuple[int, ...]) -> str:
    """``5-16`` for ``5, 6, ..., 16``; ``3, 5`` for ``3, 5``."""
    ranges: list[list[int]] = []
    for seq in seqs:
        if ranges and seq == ranges[-1][-1] + 1:
            ranges[-1].append(seq)
        else:
            ranges.append([seq])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in ranges)


def _sources(event: SessionEvent) -> str:
    """The events a message was made from; a tool result names its call in its summary."""
    seqs = event.source_event_seqs
    if seqs is None or event.type == "tool/result":
        return ""
    if event.type == "assistant/message":
        return f"from chunks {_seq_ranges(seqs)}" if seqs else "from no chunks"
    return f"from seqs {_seq_ranges(seqs)}"


def _surface(event: SessionEvent) -> str:
    op = event.surface_op
    return f"replaces seqs {op.start}-{op.end}" if isinstance(op, SurfaceReplace) else ""


def _summary(event: SessionEvent) -> str:
    data = event.data
    kind = event.type
    if kind == "turn/start":
        return f"turn {data.get('turn')}"
    if kind in ("step/start", "step/end"):
        return f"turn {data.get('turn')}, step {data.get('step')}"
    if kind == "turn/end":
        reason = data.get("reason")
        what = reason.get("kind") if isinstance(reason, dict) else reason
        text = f"turn {data.get('turn')}: {what}"
        error = reason.get("error") if isinstance(reason, dict) else None
        if isinstance(error, dict):
            text += f" ({error.get('message')})"
        return text
    if kind == "user/message":
        return repr(" ".join(eventdata.texts_of(data.get("content"))))
    if kind == "request/header":
        header = data.get("header")
        config = header.get("config") if isinstance(header, dict) else None
        route = (
            f"{config.get('provider')}/{config.get('model')}" if isinstance(config, dict) else "?"
        )
        return f"{route} ({data.get('reason')})"
    if kind == "request/context":
        return f"{data.get('provider')}/{data.get('model')}"
    if kind == "assistant/chunk":
        chunk = eventdata.chunk_of(data)
        return _chunk(chunk) if chunk is not None else compact(data.get("chunk"))
    if kind == "assistant/message":
        content = eventdata.message_of(kind, data).get("content")
        parts: list[str] = []
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool-call":
                parts.append(f"asks for {block.get('name')} [{block.get('id')}]")
            elif isinstance(block, dict) and block.get("type") == "text":
                parts.append(repr(block.get("text")))
        return "; ".join(parts) or "(empty)"
    if kind == "tool/call":
        return f"{data.get('name')}({data.get('arguments')}) [{data.get('callId')}]"
    if kind == "tool/result":
        message = eventdata.message_of(kind, data)
        call_id = eventdata.result_call_id(data) or "?"
        if event.source_event_seqs:
            call_id += f" of seq {_seq_ranges(event.source_event_seqs)}"
        failure = eventdata.error_of(data)
        status = "ok"
        if failure is not None:
            status = f"error {failure['code']}"
        else:
            content = message.get("content")
            blocks = content if isinstance(content, list) else []
            if any(isinstance(block, dict) and block.get("isError") for block in blocks):
                status = "error"
        return f"[{call_id}] {status}: {' '.join(eventdata.texts_of(message.get('content')))}"
    return compact(data)


def event_line(
    console: Console,
    event: SessionEvent,
    mark: str = " ",
    paint: Callable[[str], str] | None = None,
) -> str:
    """One event as a line: *mark*, seq, type and :func:`describe`, each part *paint*-ed."""
    paint = paint or str
    return (
        paint(f"{mark}{event.seq:>4}  ")
        + console.bold(paint(f"{printable(event.type):<17}"))
        + paint(f" {describe(event)}")
    )


def format_time(epoch_ms: int) -> str:
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def turn_of_each(events: Sequence[SessionEvent]) -> list[int | None]:
    """The turn each event belongs to (from its ``turn/start`` to its ``turn/end``), or ``None``."""
    turns: list[int | None] = []
    current: int | None = None
    for event in events:
        if event.type == "turn/start":
            turn = event.data.get("turn")
            current = turn if type(turn) is int else None
        turns.append(current)
        if event.type == "turn/end":
            current = None
    return turns


@dataclass(frozen=True, slots=True)
class LogSummary:
    """What a log holds, in numbers: the lines ``inspect --summary`` prints."""

    events: int
    by_type: dict[str, int]
    turns: int
    open_turn: int | None
    """The turn the log ends inside, if any."""
    open_turn_events: int
    repair: tuple[str, ...]
    torn_bytes: int


def types_of(events: Sequence[SessionEvent]) -> Sequence[str]:
    """The type of each event, without making the events of a stored log."""
    if isinstance(events, StoredEvents):
        return events.types
    return [event.type for event in events]


def each_of(events: Sequence[SessionEvent], seqs: Iterable[int]) -> Iterator[SessionEvent]:
    """The events at the positions *seqs*; those of a stored log are made one by one and not
    kept, so that going through a long log holds one event at a time."""
    if isinstance(events, StoredEvents):
        return events.fresh(seqs)
    return map(events.__getitem__, seqs)


def _positions(types: Sequence[str], event_type: str, count: int, start: int = 0) -> list[int]:
    """Where the events from *start* to *count* have the type *event_type*."""
    found: list[int] = []
    try:
        while True:  # a list finds each in C, comparing identity first (types are shared)
            start = types.index(event_type, start, count) + 1
            found.append(start - 1)
    except ValueError:
        return found


@dataclass(frozen=True, slots=True)
class TurnSpan:
    """Where one turn's events are in a log: from its ``turn/start`` to its ``turn/end``
    (included), or to the next ``turn/start``, or to the end."""

    turn: int | None
    """The turn's number, or ``None`` if its ``turn/start`` has no whole number."""
    start: int
    stop: int


def turn_spans(events: Sequence[SessionEvent], count: int | None = None) -> list[TurnSpan]:
    """The turns of the first *count* events (all by default), as :func:`turn_of_each` tells
    them apart, found from the events' types; only the ``turn/start`` events are read."""
    count = len(events) if count is None else count
    types = types_of(events)
    starts = _positions(types, "turn/start", count)
    ends = _positions(types, "turn/end", count)
    spans: list[TurnSpan] = []
    for index, start in enumerate(each_of(events, starts)):
        position = starts[index]
        following = starts[index + 1] if index + 1 < len(starts) else count
        end = bisect_left(ends, position)
        stop = ends[end] + 1 if end < len(ends) and ends[end] < following else following
        turn = start.data.get("turn")
        spans.append(TurnSpan(turn if type(turn) is int else None, position, stop))
    return spans


def summarize(
    stored: Sequence[SessionEvent],
    repair: Sequence[SessionEvent],
    torn: int,
    count: int | None = None,
) -> LogSummary:
    """Count the first *count* events of *stored* (all by default) by type and by turn; name
    the repair recovery adds, or added. Only the last ``turn/start`` is made an event."""
    count = len(stored) if count is None else count
    types = types_of(stored)
    counted = Counter(types[:count] if count < len(types) else types)
    open_turn: int | None = None
    open_events = 0
    last_start = _open_turn_start(types, count)
    if last_start is not None:
        # The log ends inside the turn that starts there (a turn/end belongs to the turn it
        # closes, so a log that ends with one has no open turn).
        (start,) = each_of(stored, [last_start])
        turn = start.data.get("turn")
        if type(turn) is int:
            open_turn, open_events = turn, count - last_start
    return LogSummary(
        events=count,
        by_type=dict(sorted(counted.items(), key=lambda item: (-item[1], item[0]))),
        turns=counted.get("turn/start", 0),
        open_turn=open_turn,
        open_turn_events=open_events,
        repair=tuple(event.type for event in repair),
        torn_bytes=torn,
    )


def _open_turn_start(types: Sequence[str], count: int) -> int | None:
    """Where the ``turn/start`` of the turn the first *count* events end inside is, if any."""
    start = _last(types, "turn/start", count)
    end = _last(types, "turn/end", count)
    return start if start is not None and (end is None or start > end) else None


def _last(types: Sequence[str], event_type: str, count: int) -> int | None:
    """Where the last of the first *count* events of type *event_type* is, if any."""
    for position in range(count - 1, -1, -1):
        if types[position] == event_type:
            return position
    return None


@dataclass(frozen=True, slots=True)
class Attention:
    """What in a stored log may need a person: the turn it ends inside, and the tool calls
    answered with an unknown outcome that no model has answered since."""

    open_turn: SessionEvent | None
    """The ``turn/start`` of the turn the log ends inside, if it does."""
    unanswered: tuple[str, ...]
    """The call ids of the ``tool/result`` events with ``TOOL_OUTCOME_UNKNOWN`` after the last
    ``assistant/message``."""

    @property
    def needed(self) -> bool:
        return self.open_turn is not None or bool(self.unanswered)

    @property
    def turn(self) -> int | None:
        """The open turn's number, if it has a whole number."""
        turn = None if self.open_turn is None else self.open_turn.data.get("turn")
        return turn if type(turn) is int else None

    def reasons(self) -> str:
        """Why, in words: ``turn 3 is open; unknown outcome of call-7 not yet answered``."""
        reasons = []
        if self.open_turn is not None:
            turn = self.turn
            reasons.append("a turn is open" if turn is None else f"turn {turn} is open")
        if self.unanswered:
            calls = ", ".join(printable(call_id) for call_id in self.unanswered)
            reasons.append(f"unknown outcome of {calls} not yet answered")
        return "; ".join(reasons)


def attention(stored: Sequence[SessionEvent]) -> Attention:
    """What in *stored* may need a person (:class:`Attention`); only the events that tell it
    are read: the last ``turn/start``, and the ``tool/result`` events after the last
    ``assistant/message``."""
    from .results import TOOL_OUTCOME_UNKNOWN

    count = len(stored)
    types = types_of(stored)
    open_turn = None
    last_start = _open_turn_start(types, count)
    if last_start is not None:
        (open_turn,) = each_of(stored, [last_start])
    answered = _last(types, "assistant/message", count)
    results = _positions(types, "tool/result", count, 0 if answered is None else answered)
    unanswered = []
    for result in each_of(stored, results):
        failure = eventdata.error_of(result.data)
        if failure is not None and failure["code"] == TOOL_OUTCOME_UNKNOWN:
            unanswered.append(eventdata.result_call_id(result.data) or "?")
    return Attention(open_turn, tuple(unanswered))


def print_events(console: Console, events: Iterable[SessionEvent], *, mark: str = " ") -> None:
    """Print stored events, one :func:`event_line` each."""
    for event in events:
        console.line(event_line(console, event, mark=mark))


def print_repair(console: Console, repair: Iterable[SessionEvent], *, mark: str = "+") -> None:
    """Print the events recovery adds (or would add), marked and painted as a note."""
    for event in repair:
        console.line(event_line(console, event, mark=mark, paint=console.note))


# -- a whole stored log -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogView:
    """Which part of a log to print, and how."""

    as_json: bool = False
    summary: bool = False
    tail: int | None = None
    turn: int | None = None

    def select(self, stored: Sequence[SessionEvent], count: int | None = None) -> list[range]:
        """Where the events to show are among the first *count* of *stored* (all by
        default): one turn's, then the last *tail* of them, as runs of positions."""
        count = len(stored) if count is None else count
        runs = [range(count)]
        if self.turn is not None:
            spans = turn_spans(stored, count)
            runs = [range(span.start, span.stop) for span in spans if span.turn == self.turn]
        if self.tail is not None:
            kept, left = [], self.tail
            for run in reversed(runs):
                if left <= 0:
                    break
                kept.append(run[max(0, len(run) - left) :])
                left -= len(kept[-1])
            runs = kept[::-1]
        return runs


def print_log(log: StoredLog, *, added_on_disk: bool, stream: TextIO, view: LogView) -> None:
    """Print a stored log; *added_on_disk* tells whether ``log.repair`` was persisted.

    Every event is made when it is printed and then let go: a log of any length is printed
    in the memory its stored form takes.
    """
    count = len(log.events) - len(log.repair) if added_on_disk else len(log.events)
    if view.as_json:
        print_json(log, stream=stream, added_on_disk=added_on_disk, view=view, count=count)
        return
    console = Console.for_stream(stream, live=False)
    header = log.header
    console.line(
        console.bold(f"session {printable(header.id)}")
        + console.dim(
            f"  created {format_time(header.created_at)}, {format_of(header)}, "
            f"{printable(str(log.location))}"
        )
    )
    if view.summary:
        summary = summarize(log.events, log.repair, log.torn_bytes, count)
        _print_summary(console, summary, added_on_disk)
        return
    runs = view.select(log.events, count)
    shown = sum(map(len, runs))
    if shown < count:
        console.line(console.dim(f"({count - shown} of {count} events not shown)"))
    print_events(console, each_of(log.events, chain.from_iterable(runs)))
    if log.torn_bytes:
        verb = "were cut off" if added_on_disk else "would be cut off"
        console.line(console.note(f"a torn tail of {log.torn_bytes} bytes {verb} (a copy is kept)"))
    if not log.repair:
        if not added_on_disk:
            console.line(console.dim("the last turn is closed: recovery would add nothing"))
        return
    if added_on_disk:
        console.line(console.note("added by this recovery, now on disk:"))
    else:
        console.line(console.note("recovery would add (not on disk; run 'recover' to write it):"))
    print_repair(console, log.repair)


def _print_summary(console: Console, summary: LogSummary, added_on_disk: bool) -> None:
    console.line(f"{summary.events} events in {summary.turns} turns")
    for event_type, count in summary.by_type.items():
        console.line(f"  {count:>9}  {printable(event_type)}")
    if summary.open_turn is None:
        console.line("every turn is closed")
    else:
        console.line(f"turn {summary.open_turn} is open ({summary.open_turn_events} events)")
    if summary.torn_bytes:
        verb = "were cut off" if added_on_disk else "would be cut off"
        console.line(console.note(f"a torn tail of {summary.torn_bytes} bytes {verb}"))
    if summary.repair:
        verb = "recovery added" if added_on_disk else "recovery would add"
        console.line(console.note(f"{verb}: {', '.join(summary.repair)}"))


def json_header(header: SessionHeader) -> str:
    """The first record of ``--json`` output: the header as stored, wrapped."""
    from .persistence.jsonl.format import encode_header

    return json.dumps({"header": json.loads(encode_header(header))}, separators=(",", ":"))


def print_json(
    log: StoredLog,
    *,
    stream: TextIO,
    added_on_disk: bool,
    view: LogView,
    count: int | None = None,
    written: int | None = None,
) -> None:
    """One record per line: the header, each event as stored, the torn tail, the repair.

    Only events have a ``type`` at the top level; the header, the torn tail and a repair not
    yet on disk are wrapped (``{"header": ...}``, ``{"torn": ...}``, ``{"repair": ...}``).
    *count* is how many of ``log.events`` were stored before this call (all by default);
    *written* says that the header and that many events were written already
    (:class:`JsonStream`), so only the rest is.
    """
    count = len(log.events) if count is None else count
    if written is None:
        stream.write(json_header(log.header) + "\n")
        runs = view.select(log.events, count)
    else:
        runs = [range(written, count)]
    # A line at a time: a text stream ignores what a closed pipe cuts off a large write.
    for event in each_of(log.events, chain.from_iterable(runs)):
        stream.write(event.encode() + "\n")
    if log.torn_bytes:
        torn = {"bytes": log.torn_bytes, "cut": added_on_disk}
        stream.write(json.dumps({"torn": torn}, separators=(",", ":")) + "\n")
    for event in log.repair:
        stream.write(event.encode() + "\n" if added_on_disk else f'{{"repair":{event.encode()}}}\n')


class JsonStream:
    """Writes ``--json`` records while a log is being read: the header, then each event as
    soon as it is decoded (:meth:`__call__`, given to the reader); :func:`print_json`, with
    :attr:`written`, then writes the rest.

    A log found damaged further on has had its first events written by then.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.written: int | None = None
        """How many events were written (after the header), or ``None`` before the header."""

    def __call__(self, header: SessionHeader, events: StoredEvents) -> None:
        if self.written is None:
            self.stream.write(json_header(header) + "\n")
            self.written = 0
        count = len(events)
        if count > self.written:
            for event in events.fresh(range(self.written, count)):
                self.stream.write(event.encode() + "\n")
            self.written = count


def format_of(header: SessionHeader) -> str:
    """The format version, the earlier format named, and the working directory if any."""
    if header.earlier_format:
        described = f"this project's earlier format (version {header.version})"
    else:
        described = f"format version {header.version}"
    return described if header.cwd is None else f"{described}, cwd {printable(header.cwd)}"
