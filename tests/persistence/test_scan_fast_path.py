"""The bulk decode in ``scan_log`` is only a fast path: it never changes what a scan finds.

Every log, intact or damaged in any of the ways drawn here, must scan to exactly the same
result (events, committed bytes, torn tail) or the same error as line-by-line decoding alone.
"""

from __future__ import annotations

from pathlib import Path
from unittest import mock

from hypothesis import example, given
from hypothesis import strategies as st

from kai_session_checkpoint_policy.events import (
    JSONObject,
    SessionEvent,
    StoredDataError,
    encode_data,
)
from kai_session_checkpoint_policy.persistence import records
from kai_session_checkpoint_policy.persistence.errors import PersistenceError
from kai_session_checkpoint_policy.persistence.jsonl import format as log_format
from kai_session_checkpoint_policy.persistence.jsonl.format import encode_events, encode_header
from kai_session_checkpoint_policy.persistence.records import MAX_TIME
from kai_session_checkpoint_policy.persistence.values import SessionHeader

from ..support.strategies import json_values

PATH = Path("root/s/session.jsonl")

event_types = st.sampled_from(["assistant/chunk", "tool/call", "turn/end", "x", "\u00e9/\u4e8b"])


@st.composite
def event_lines(draw: st.DrawFn) -> list[bytes]:
    """The lines of an intact log's events, without their newlines: plain events, surface
    events with their envelope keys, ignorable events, and packed rows of deltas."""
    events: list[SessionEvent] = []
    for _ in range(draw(st.integers(0, 12))):
        seq, time = len(events), draw(st.integers(0, MAX_TIME - 10))
        kind = draw(st.sampled_from(["plain", "surface", "ignorable", "row"]))
        if kind == "row":
            for offset in range(draw(st.integers(1, 4))):
                chunk: JSONObject = {"type": "text-delta", "index": 0, "text": draw(st.text())}
                delta: JSONObject = {"turn": 1, "step": 1, "chunk": chunk}
                events.append(SessionEvent("assistant/chunk", seq + offset, time + offset, delta))
            continue
        data = draw(st.dictionaries(st.text(max_size=3), json_values, max_size=3))
        copy, encoded = encode_data("x", data)
        if kind == "surface":
            sources = tuple(range(seq)) if seq else None
            event = SessionEvent("tool/result", seq, time, copy, encoded, "append", sources)
        else:
            event_type = draw(event_types)
            event = SessionEvent(event_type, seq, time, copy, encoded, ignorable=kind != "plain")
        events.append(event)
    return encode_events(events, pack=True).splitlines()


def _damaged(line: bytes, how: int, other: bytes) -> list[bytes]:
    """*line* damaged in the way numbered *how*; may become several lines or none."""
    middle = len(line) // 2
    return [
        [b""],
        [b" "],
        [line[:middle], line[middle:]],  # split in two lines
        [b" " + line + b" \r"],  # valid JSON for json.loads, not the canonical shape
        [b"\xef\xbb\xbf" + line],  # a UTF-8 byte order mark
        [line + b"," + other],  # two values on one line
        [line.replace(b'"seq":', b'"seq":true,"x":', 1)],
        [line.replace(b'"data":', b'"data":[', 1)[:-1] + b"]}"],
        [line.replace(b'"type":', b'"type":1,"t":', 1)],
        [line[:middle] + b"\xff" + line[middle:]],  # not UTF-8
        [line[:-1] + b',"extra":1}'],
        [b"NaN"],
        [line.replace(b'"data":{', b'"data":{"n":NaN,', 1)],
        [b"[" + line + b"]"],
        [line[:middle]],  # a fragment
        [b'{"type":"turn/end","seq":0,"time":0,"data":{"a":[1'],  # a value over two lines
        [b"2]}}"],
        [line.replace(b'"seq":', b'"seq":1', 1)],  # the wrong seq
        [line, line],  # a repeat
        [line.replace(b'"data":{', b'"data":{"n":-1e999,', 1)],  # not a finite number
        [line.replace(b'"time":', b'"time":-', 1)],  # a time out of range
        [line.replace(b'"data":{', b'"data":{"n":' + b"[" * 70 + b"]" * 70 + b",", 1)],
        [b"[" * 100_000 + b"]" * 100_000],  # deeper than any decoder's stack
    ][how]


@st.composite
def logs(draw: st.DrawFn) -> bytes:
    lines = draw(event_lines())
    for _ in range(draw(st.integers(0, 2))):
        if not lines:
            break
        index = draw(st.integers(0, len(lines) - 1))
        other = lines[draw(st.integers(0, len(lines) - 1))]
        lines[index : index + 1] = _damaged(lines[index], draw(st.integers(0, 22)), other)
    if draw(st.booleans()):
        lines.append(b'{"type":"turn/end","seq":99,"time":0,"data":{}}')
    data = encode_header(SessionHeader("s", 1)) + b"".join(line + b"\n" for line in lines)
    if draw(st.booleans()):  # a torn tail
        data = data[: draw(st.integers(0, len(data)))]
    return data


def _data(event: SessionEvent) -> object:
    try:
        return event.data
    except StoredDataError as error:
        return str(error)


def _scan(data: bytes) -> object:
    """What a scan finds: every event in full (its data, or why its data cannot be read)."""
    try:
        scan = log_format.scan_log(data, PATH)
    except PersistenceError as error:
        return type(error), str(error)
    return scan.header, list(map(_whole, scan.events)), scan.committed_bytes, scan.torn


def _whole(event: SessionEvent) -> tuple[object, ...]:
    envelope = (event.surface_op, event.source_event_seqs, event.ignorable, event.surface_op_first)
    return event.type, event.seq, event.time, envelope, _data(event)


@given(logs(), st.sampled_from([1, 40, 1 << 16]))
@example(encode_header(SessionHeader("s", 1)) + b"\n", 1 << 16)
def test_the_fast_paths_scan_exactly_as_line_by_line(data: bytes, chunk: int) -> None:
    """Runs of lines decoded at once (by the compiled decoder, or else by the standard
    library's) find what decoding one line at a time finds."""
    with mock.patch.object(log_format, "RUN_BYTES", chunk):
        fast = _scan(data)
    with (
        mock.patch.object(records, "_compiled_lines", return_value=False),
        mock.patch.object(log_format, "RUN_BYTES", chunk),
    ):
        standard = _scan(data)
    with (
        mock.patch.object(records, "_compiled_lines", return_value=False),
        mock.patch.object(records, "_decode_lines", return_value=None),
    ):
        slow = _scan(data)
    assert fast == standard == slow


def test_loaded_events_share_one_copy_of_each_key_and_type() -> None:
    line = b'{"type":"assistant/chunk","seq":%d,"time":1,"data":{"chunk":{"text":"a"}}}\n'
    data = encode_header(SessionHeader("s", 1)) + b"".join(line % seq for seq in range(3))
    first, *others = log_format.scan_log(data, PATH).events
    for event in others:
        assert event.type is first.type
        assert next(iter(event.data)) is next(iter(first.data))


def test_a_packed_log_is_read_by_the_fast_path() -> None:
    """Packed rows have four keys, as plain events do: they must not send a scan line by line."""
    chunk: JSONObject = {"type": "text-delta", "index": 0, "text": "piece"}
    events = [
        SessionEvent("assistant/chunk", seq, 1, {"turn": 1, "step": 1, "chunk": chunk})
        for seq in range(10)
    ]
    events.append(SessionEvent("assistant/message", 10, 1, {}, None, "append", tuple(range(10))))
    data = encode_header(SessionHeader("s", 1)) + encode_events(events, pack=True)
    assert data.count(b"\n") == 3  # the header, one row, the message
    with mock.patch.object(records, "_parse", side_effect=AssertionError("line by line")):
        assert log_format.scan_log(data, PATH).events == tuple(events)
