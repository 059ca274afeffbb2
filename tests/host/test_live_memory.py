"""A live session keeps its older events as a loaded log keeps its own: in columns, made again
(equal) when read, so that a long live session holds about what the same log resumed does."""

from __future__ import annotations

import gc
import tracemalloc
from typing import TYPE_CHECKING

import pytest

from kai_session_checkpoint_policy import (
    Host,
    JsonlSessionPersistence,
    Session,
    SessionEvent,
)
from kai_session_checkpoint_policy.events import SurfaceReplace

if TYPE_CHECKING:
    from pathlib import Path

    from kai_session_checkpoint_policy import JSONObject

pytestmark = pytest.mark.anyio

EVENTS = 20_000
MEMORY_FACTOR = 1.5
"""How many times what the same log holds resumed a live session may hold."""


def chunk(index: int) -> JSONObject:
    return {
        "turn": 1,
        "step": 1,
        "chunk": {"type": "text-delta", "index": 0, "text": f"word {index} of the answer "},
    }


def append_mixed(session: Session, count: int) -> list[SessionEvent]:
    """Append *count* events of every shape a log holds; the events ``append`` returned."""
    made = [session.append("turn/start", {"turn": 1})]
    while session.seq < count:
        seq = session.seq
        kind = seq % 7
        if kind == 0:
            made.append(
                session.append("user/message", {"text": f"question {seq} \u00e9\U0001f600"})
            )
        elif kind == 1:
            made.append(
                session.append("assistant/message", {"text": "x"}, source_event_seqs=[seq - 1])
            )
        elif kind == 2:
            made.append(
                session.append(
                    "tool/result",
                    {"text": "lone \ud800 surrogate"},
                    surface_op=SurfaceReplace(seq - 2, seq - 1),
                )
            )
        elif kind == 3:
            made.append(session.append("vendor/note", {"n": [seq, {"a": None}]}, ignorable=True))
        else:
            made.append(session.append("assistant/chunk", chunk(seq)))
    return made


def made_events() -> int:
    """How many event objects exist in this process."""
    gc.collect()
    return sum(isinstance(item, SessionEvent) for item in gc.get_objects())


def same(event: SessionEvent, expected: SessionEvent) -> None:
    assert event == expected
    assert (event.encode(), event.data_json, event.surface_op_first) == (
        expected.encode(),
        expected.data_json,
        expected.surface_op_first,
    )


def test_a_live_log_reads_back_equal_events_after_its_older_ones_are_settled() -> None:
    session = Session("s")
    early = session.events
    made = append_mixed(session, 3_000)
    snapshot = session.events
    more = append_mixed(session, 4_000)  # the events after the snapshot
    assert len(early) == 0
    assert len(snapshot) == 3_000
    assert len(session.events) == 4_000
    events = session.events
    for index in (5, 2_999, 0, 1_000):  # out of order: a block made from the middle
        same(events[index], made[index])
        assert events[index] is events[index]  # made once, then kept
    assert events[-1] is more[-1]  # the latest events are the objects append returned
    for event, expected in zip(events, made + more, strict=True):
        same(event, expected)
    assert list(snapshot) == made
    assert snapshot[10:20] == tuple(made[10:20])
    assert snapshot == made
    assert events[::500] == tuple((made + more)[::500])
    replaced = [event for event in made + more if event.type == "tool/result"]
    assert events.select({"tool/result"}) == replaced
    assert snapshot.select({"tool/result"}, 1_000) == [
        e for e in replaced if 1_000 <= e.seq < 3_000
    ]
    kept = made_events()
    assert list(events.fresh(range(len(events)))) == made + more
    assert list(snapshot.fresh([2_999, 3, 1_500])) == [made[2_999], made[3], made[1_500]]
    assert made_events() == kept  # made for the caller, not kept in the log
    with pytest.raises(IndexError, match="session event index out of range"):
        list(snapshot.fresh([3_000]))
    fresh = Session("t")
    appended = append_mixed(fresh, 3_000)
    assert [event.seq for event in fresh.events.select({"vendor/note"}, 2_900)] == [
        event.seq for event in appended if event.type == "vendor/note" and event.seq >= 2_900
    ]


async def test_live_copies_and_the_resumed_log_equal_what_was_appended(tmp_path: Path) -> None:
    backend = JsonlSessionPersistence(tmp_path)
    async with Host([backend], autoload=False) as host:
        session = host.sessions.create("s")
        made = append_mixed(session, 2_500)
        made.append(session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}}))
        await host.sessions.flush(session)
        kept = made_events()
        loaded = await backend.load("s")  # live here: copies
        assert list(loaded.events) == made
        del loaded
        assert made_events() == kept  # copied without making the live log's older events
        await host.sessions.close(session)
    async with Host([JsonlSessionPersistence(tmp_path)], autoload=False) as host:
        resumed = await host.sessions.resume("s")
        assert [event.encode() for event in resumed.events] == [event.encode() for event in made]
        host.sessions.detach(resumed)


async def test_a_long_live_session_holds_about_what_its_log_resumed_holds(
    tmp_path: Path,
) -> None:
    """Structure, not time: bytes held per event, live against resumed (``tracemalloc``)."""
    backend = JsonlSessionPersistence(tmp_path, batch_window=3600)
    async with Host([backend], autoload=False) as host:
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            session = host.sessions.create("long")
            session.append("turn/start", {"turn": 1})
            for index in range(EVENTS - 2):
                session.append("assistant/chunk", chunk(index))
            session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
            await host.sessions.flush(session)
            gc.collect()
            live = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        await host.sessions.close(session)
    async with Host([JsonlSessionPersistence(tmp_path)], autoload=False) as host:
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            resumed = await host.sessions.resume("long")
            gc.collect()
            stored = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert len(resumed.events) == EVENTS
        host.sessions.detach(resumed)
    assert live <= MEMORY_FACTOR * stored, (live / EVENTS, stored / EVENTS)
