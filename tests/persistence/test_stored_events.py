"""Events read from a log are made into objects when first read: exactly the events written.

Whatever path reads a line (the compiled decoder a run at a time, or the standard library's a
line at a time), the events equal those written, their data included, and encode to the same
bytes again; so do the events a ``StoredEvents`` gives by index, slice, iteration and type.
"""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kai_session_checkpoint_policy.events import (
    KNOWN_EVENT_TYPES,
    SURFACE_EVENT_TYPES,
    JSONObject,
    SessionEvent,
    StoredEvents,
    SurfaceOp,
    SurfaceReplace,
    encode_data,
)
from kai_session_checkpoint_policy.persistence import records
from kai_session_checkpoint_policy.persistence.jsonl.format import (
    encode_events,
    encode_header,
    scan_log,
)
from kai_session_checkpoint_policy.persistence.records import MAX_TIME
from kai_session_checkpoint_policy.persistence.values import SessionHeader

from ..support.persistence_helpers import compressed
from ..support.strategies import json_values

ALL_TYPES = sorted(KNOWN_EVENT_TYPES)
data_objects = st.dictionaries(st.text(max_size=4), json_values, max_size=4)


@st.composite
def logged_events(draw: st.DrawFn) -> list[SessionEvent]:
    """Events of every known type, unknown ignorable ones, surface events with every envelope,
    and runs of deltas that pack into rows."""
    events: list[SessionEvent] = []
    for _ in range(draw(st.integers(0, 16))):
        seq, time = len(events), draw(st.integers(0, MAX_TIME - 10))
        kind = draw(st.sampled_from(["known", "surface", "ignorable", "deltas"]))
        if kind == "deltas":
            delta = draw(st.sampled_from(["text-delta", "reasoning-delta", "tool-call-delta"]))
            for offset in range(draw(st.integers(1, 5))):
                chunk: JSONObject = {"type": delta, "index": 0}
                if delta == "tool-call-delta":
                    chunk |= {"id": "c1", "name": "write", "argumentsDelta": draw(st.text())}
                else:
                    chunk["text"] = draw(st.text())
                step = draw(st.sampled_from([1, 2.5]))
                data: JSONObject = {"turn": 1, "step": step, "chunk": chunk}
                events.append(SessionEvent("assistant/chunk", seq + offset, time + offset, data))
            continue
        copy, encoded = encode_data("x", draw(data_objects))
        if kind == "surface":
            event_type = draw(st.sampled_from(sorted(SURFACE_EVENT_TYPES)))
            op = draw(st.sampled_from(["append", "replace"]))
            surface: SurfaceOp = SurfaceReplace(0, seq - 1) if op == "replace" and seq else "append"
            sources = tuple(range(seq)) if seq and draw(st.booleans()) else None
            first = draw(st.booleans())
            events.append(
                SessionEvent(event_type, seq, time, copy, encoded, surface, sources, False, first)
            )
        elif kind == "ignorable":
            unknown = draw(st.sampled_from(["x", "\u00e9/\u4e8b", "plan/mode"]))
            events.append(SessionEvent(unknown, seq, time, copy, encoded, ignorable=True))
        else:
            events.append(SessionEvent(draw(st.sampled_from(ALL_TYPES)), seq, time, copy, encoded))
    return events


def read(events: list[SessionEvent], *, pack: bool, zstd: bool) -> StoredEvents:
    data = encode_header(SessionHeader("s", 1)) + encode_events(events, pack=pack)
    path = Path("s/session.jsonl.zstd" if zstd else "s/session.jsonl")
    scan = scan_log(compressed(data) if zstd else data, path)
    assert (scan.torn, len(scan.events)) == (b"", len(events))
    return scan.events


@given(logged_events(), st.booleans(), st.booleans())
def test_events_read_lazily_equal_the_events_written_and_read_eagerly(
    events: list[SessionEvent], pack: bool, zstd: bool
) -> None:
    lazy = read(events, pack=pack, zstd=zstd)
    with (
        mock.patch.object(records, "_compiled_lines", return_value=False),
        mock.patch.object(records, "_compiled_line", return_value=None),
    ):
        eager = read(events, pack=pack, zstd=zstd)
    assert list(lazy) == events == list(eager)
    assert [event.encode() for event in lazy] == [event.encode() for event in events]


@given(logged_events(), st.booleans())
def test_index_slice_iteration_and_selection_give_the_same_events(
    events: list[SessionEvent], pack: bool
) -> None:
    stored = read(events, pack=pack, zstd=False)
    assert stored == tuple(events)
    assert [stored[i] for i in range(-len(events), 0)] == events
    assert stored[1::2] == tuple(events[1::2])
    assert stored[::-1] == tuple(reversed(events))
    for types in ({"assistant/chunk"}, SURFACE_EVENT_TYPES, {"nothing"}):
        start = len(events) // 2
        assert stored.select(types, start) == [e for e in events[start:] if e.type in types]
    assert all(stored[i] is event for i, event in enumerate(stored))  # each made once


@given(logged_events(), st.booleans(), st.data())
def test_fresh_events_are_the_same_and_none_is_kept(
    events: list[SessionEvent], pack: bool, data: st.DataObject
) -> None:
    stored = read(events, pack=pack, zstd=False)
    made = [type(item) is SessionEvent for item in stored._items]
    seqs = data.draw(st.lists(st.integers(0, len(events) - 1))) if events else []
    assert list(stored.fresh(seqs)) == [events[seq] for seq in seqs]
    assert list(stored.fresh(range(len(events)))) == events
    assert stored.types == [event.type for event in events]
    assert [type(item) is SessionEvent for item in stored._items] == made  # none kept


def test_an_event_is_made_only_when_read() -> None:
    chunk: JSONObject = {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "text": "a"}}
    written = [SessionEvent("assistant/chunk", seq, 1, chunk) for seq in range(5)]
    stored = read(written, pack=False, zstd=False)
    assert repr(stored) == "<StoredEvents of 5 events>"
    assert stored.select({"turn/start"}) == []
    unread = [item for item in stored._items if not isinstance(item, SessionEvent)]
    assert len(unread) == 5
    assert stored[3] == written[3]
    assert [isinstance(item, SessionEvent) for item in stored._items] == [0, 0, 0, 1, 0]


def test_stored_events_refuse_events_out_of_order() -> None:
    stored = StoredEvents([SessionEvent("turn/start", 0, 1, {})])
    with pytest.raises(ValueError, match=r"^stored events must continue from seq 1, in order$"):
        stored.extend([SessionEvent("turn/end", 2, 1, {})])
    assert len(stored) == 1
    with pytest.raises(IndexError):
        stored[1]
    more = [SessionEvent("turn/end", 1, 1, {})]
    assert stored + more == (
        SessionEvent("turn/start", 0, 1, {}),
        SessionEvent("turn/end", 1, 1, {}),
    )
    assert len(stored) == 1  # adding made a copy


@pytest.mark.parametrize("zstd", [False, True], ids=["plain", "zstd"])
@pytest.mark.parametrize("pack", [False, True], ids=["lines", "packed"])
def test_an_intact_log_is_read_by_the_compiled_decoder_alone(pack: bool, zstd: bool) -> None:
    """Events with every envelope field, and packed rows, never need the slower decoder."""
    chunk: JSONObject = {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0}}
    call: JSONObject = {"type": "tool-call-delta", "index": 1, "id": "c", "argumentsDelta": "{"}
    written = [SessionEvent("turn/start", 0, 1, {"turn": 1})]
    written += [SessionEvent("assistant/chunk", seq, 2, chunk | {"x": seq}) for seq in (1, 2)]
    written += [
        SessionEvent("assistant/chunk", seq, seq, {"turn": 1, "step": 1, "chunk": call})
        for seq in range(3, 7)
    ]
    written += [
        SessionEvent("assistant/message", 7, 9, {}, None, "append", (1, 2, 3)),
        SessionEvent("tool/result", 8, 9, {}, None, "append", (7,), surface_op_first=True),
        SessionEvent("user/message", 9, 9, {}, None, SurfaceReplace(0, 8)),
        SessionEvent("x", 10, 9, {}, None, ignorable=True),
    ]
    slower = AssertionError("read by the standard library's decoder")
    with (
        mock.patch.object(records, "_decode_lines", side_effect=slower),
        mock.patch.object(records, "_parse", side_effect=slower),
    ):
        stored = read(written, pack=pack, zstd=zstd)
    assert list(stored) == written
    assert [event.encode() for event in stored] == [event.encode() for event in written]
