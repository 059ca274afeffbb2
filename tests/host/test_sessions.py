"""Sessions and the session store: the log's rules, and ``SessionStore.flush`` fan-out."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
import pytest

from kai_session_checkpoint_policy import (
    EventDataError,
    Host,
    Session,
    SessionEvent,
    SessionNotLiveError,
    hookimpl,
)
from kai_session_checkpoint_policy.host import SessionError

from ..support.plugins import FlushListener

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Generator

    from kai_session_checkpoint_policy.hookspecs import FlushThunk

pytestmark = pytest.mark.anyio


class BrokenBuilder:
    """A ``session_flush`` plugin that raises while building its thunk."""

    name = "broken-builder"

    def __init__(self, error: Exception) -> None:
        self.error = error

    @hookimpl
    def session_flush(self) -> FlushThunk:
        raise self.error


class EventRecorder:
    name = "event-recorder"

    def __init__(self) -> None:
        self.events: list[tuple[str, int, str]] = []

    @hookimpl
    def session_event(self, session: Session, event: SessionEvent) -> None:
        self.events.append((session.id, event.seq, event.type))


class BrokenEventListener:
    name = "broken-event-listener"

    @hookimpl
    def session_event(self) -> None:
        raise RuntimeError("listener broke")


@pytest.fixture
async def host() -> AsyncIterator[Host]:
    async with Host(clock=lambda: 1_700_000_000_000) as host:
        yield host


@pytest.fixture
def order() -> list[str]:
    return []


async def flush_in_background(
    host: Host, session: Session, outcome: list[object], group: anyio.abc.TaskGroup
) -> None:
    """Start ``host.sessions.flush(session)``; its result or exception lands in *outcome*."""

    async def flush() -> None:
        try:
            outcome.append(await host.sessions.flush(session))
        except Exception as exc:
            outcome.append(exc)

    group.start_soon(flush)
    await anyio.wait_all_tasks_blocked()


# SessionStore.flush


async def test_flush_returns_false_without_a_listener(host: Host) -> None:
    assert await host.sessions.flush(host.sessions.create("quiet")) is False


@pytest.mark.parametrize("count", [1, 2, 3])
async def test_flush_returns_true_with_listeners(host: Host, order: list[str], count: int) -> None:
    for index in range(count):
        host.register(FlushListener(f"L{index}", order))
    session = host.sessions.create("heard")

    assert await host.sessions.flush(session) is True
    assert sorted(order) == sorted(
        f"L{i}:{step}" for i in range(count) for step in ("start", "end")
    )


async def test_flush_starts_every_listener_before_any_finishes(
    host: Host, order: list[str]
) -> None:
    gate = anyio.Event()
    for name in ("A", "B", "C"):
        host.register(FlushListener(name, order, gate=gate))
    session = host.sessions.create("fan-out")
    outcome: list[object] = []

    async with anyio.create_task_group() as group:
        await flush_in_background(host, session, outcome, group)
        assert sorted(order) == ["A:start", "B:start", "C:start"]
        assert outcome == []
        gate.set()

    assert sorted(order[3:]) == ["A:end", "B:end", "C:end"]
    assert outcome == [True]


async def test_flush_waits_for_a_slow_listener_before_reporting_a_failure(
    host: Host, order: list[str]
) -> None:
    gate = anyio.Event()
    failure = OSError("disk unavailable")
    host.register(FlushListener("slow", order, gate=gate))
    host.register(FlushListener("failing", order, error=failure))
    session = host.sessions.create("settle")
    outcome: list[object] = []

    async with anyio.create_task_group() as group:
        await flush_in_background(host, session, outcome, group)
        assert sorted(order) == ["failing:failed", "failing:start", "slow:start"]
        assert outcome == []
        gate.set()

    assert order[3:] == ["slow:end"]
    assert outcome == [failure]


async def test_flush_raises_the_first_failure_in_registration_order(
    host: Host, order: list[str]
) -> None:
    gate = anyio.Event()
    first, second = OSError("first registered"), OSError("second registered")
    host.register(FlushListener("A", order, gate=gate, error=first))
    host.register(FlushListener("B", order, error=second))
    session = host.sessions.create("registration-order")
    outcome: list[object] = []

    async with anyio.create_task_group() as group:
        await flush_in_background(host, session, outcome, group)
        assert sorted(order) == ["A:start", "B:failed", "B:start"]
        gate.set()

    assert order[3:] == ["A:failed"]
    assert len(outcome) == 1
    assert outcome[0] is first


async def test_a_listener_failing_to_build_its_thunk_does_not_starve_later_ones(
    host: Host, order: list[str]
) -> None:
    failure = RuntimeError("build broke")
    later = FlushListener("later", order)
    host.register(BrokenBuilder(failure))
    host.register(later)
    session = host.sessions.create("build-failure")

    with pytest.raises(RuntimeError, match=r"^build broke$") as raised:
        await host.sessions.flush(session)

    assert raised.value is failure
    assert order == ["later:start", "later:end"]


class FlushWrapper:
    name = "flush-wrapper"

    @hookimpl(wrapper=True)
    def session_flush(self) -> Generator[None, list[FlushThunk], list[FlushThunk]]:
        return (yield)


class EventWrapper:
    name = "event-wrapper"

    @hookimpl(hookwrapper=True, specname="session_event")
    def wrap_events(self) -> Generator[None, object, None]:
        yield


@pytest.mark.parametrize(
    ("plugin", "hook"),
    [(FlushWrapper(), "session_flush"), (EventWrapper(), "session_event")],
    ids=["session_flush", "session_event"],
)
async def test_a_wrapper_of_a_per_implementation_hook_is_refused_when_registered(
    host: Host, order: list[str], plugin: object, hook: str
) -> None:
    host.register(FlushListener("L", order))
    name = getattr(plugin, "name", "")

    with pytest.raises(TypeError, match=rf"^{hook} cannot be a hook wrapper \({name}\)$"):
        host.register(plugin)

    assert not host.pm.is_registered(plugin)
    assert await host.sessions.flush(host.sessions.create("unwrapped"))
    assert order == ["L:start", "L:end"]


async def test_a_single_listener_failure_propagates_as_is(host: Host, order: list[str]) -> None:
    failure = OSError("disk unavailable")
    host.register(FlushListener("only", order, error=failure))

    with pytest.raises(OSError, match=r"^disk unavailable$") as raised:
        await host.sessions.flush(host.sessions.create("single"))

    assert raised.value is failure


async def test_flush_rejects_a_session_never_created_in_the_store(
    host: Host, order: list[str]
) -> None:
    listener = FlushListener("L", order)
    host.register(listener)

    with pytest.raises(SessionNotLiveError, match=r"^session 'loose' is not live in this store$"):
        await host.sessions.flush(Session("loose"))

    assert listener.sessions == []


async def test_flush_rejects_a_detached_session(host: Host, order: list[str]) -> None:
    listener = FlushListener("L", order)
    host.register(listener)
    session = host.sessions.create("detached")
    host.sessions.detach(session)

    with pytest.raises(SessionNotLiveError, match=r"^session 'detached' is not live"):
        await host.sessions.flush(session)

    assert listener.sessions == []


async def test_flush_rejects_a_stale_session_whose_id_is_live_again(
    host: Host, order: list[str]
) -> None:
    listener = FlushListener("L", order)
    host.register(listener)
    stale = host.sessions.create("reused")
    host.sessions.detach(stale)
    fresh = host.sessions.create("reused")

    with pytest.raises(SessionNotLiveError, match=r"^session 'reused' is not live"):
        await host.sessions.flush(stale)

    assert listener.sessions == []
    assert await host.sessions.flush(fresh) is True
    assert listener.sessions == ["reused"]


async def test_flush_rejects_a_session_of_another_store(host: Host, order: list[str]) -> None:
    listener = FlushListener("L", order)
    host.register(listener)
    async with Host() as other:
        foreign = other.sessions.create("foreign")

        with pytest.raises(SessionNotLiveError):
            await host.sessions.flush(foreign)

    assert listener.sessions == []


# Session


def test_seq_is_contiguous_from_zero() -> None:
    session = Session("s", clock=lambda: 42)

    events = [session.append("turn/start", {"turn": n}) for n in range(3)]

    assert [event.seq for event in events] == [0, 1, 2]
    assert session.seq == 3
    assert session.events == tuple(events)
    assert events[2] == SessionEvent("turn/start", 2, 42, {"turn": 2}, '{"turn":2}')


def test_append_keeps_a_snapshot_of_the_data() -> None:
    session = Session("s")
    data: dict[str, object] = {"items": [1, {"deep": "a"}]}

    event = session.append("request/context", data)
    data["added"] = True
    items = data["items"]
    assert isinstance(items, list)
    items.append(2)
    items[1]["deep"] = "b"

    assert event.data == {"items": [1, {"deep": "a"}]}
    assert session.events[0].data == {"items": [1, {"deep": "a"}]}
    assert event.encode().endswith('"data":{"items":[1,{"deep":"a"}]}}')


def _cycle() -> dict[str, object]:
    cycle: dict[str, object] = {}
    cycle["self"] = cycle
    return cycle


PREFIX = "data of a 'turn/start' event is not losslessly JSON-serializable: "


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"x": float("nan")}, PREFIX + "data['x'] is nan"),
        ({"x": [1, {"y": float("inf")}]}, PREFIX + "data['x'][1]['y'] is inf"),
        ({1: "a"}, PREFIX + "data has the non-string key 1"),
        ({"b": b"x"}, PREFIX + "data['b'] is of type bytes, which JSON cannot carry unchanged"),
        ({"t": (1, 2)}, PREFIX + "data['t'] is of type tuple, which JSON cannot carry unchanged"),
        (_cycle(), PREFIX + "data['self'] contains itself"),
        ([], "data of 'turn/start' events must be a JSON object, not list"),
    ],
    ids=["nan", "nested-inf", "non-string-key", "bytes", "tuple", "cycle", "not-an-object"],
)
def test_append_rejects_data_json_cannot_carry(data: object, message: str) -> None:
    session = Session("s")
    session.append("turn/start", {"turn": 1})

    with pytest.raises(EventDataError) as raised:
        session.append("turn/start", data)

    assert str(raised.value) == message
    assert session.seq == 1


def test_a_seed_must_be_contiguous_from_zero() -> None:
    seed = [
        SessionEvent("turn/start", 0, 1, {"turn": 1}),
        SessionEvent("step/start", 2, 1, {"turn": 1, "step": 1}),
    ]

    with pytest.raises(SessionError) as raised:
        Session("seeded", seed)

    assert str(raised.value) == (
        "session 'seeded': events must be contiguous from seq 0, but event 1 has seq 2"
    )


async def test_a_seeded_live_session_continues_its_seq(host: Host) -> None:
    seed = [SessionEvent("turn/start", 0, 1, {"turn": 1})]

    session = host.sessions.create("seeded", seed=seed)

    # A seed of events no backend stores is a fork's: marked where the session's own begin.
    assert [(event.type, event.seq) for event in session.events] == [
        ("turn/start", 0),
        ("session/end-seed", 1),
    ]
    assert session.first_live_seq == 2
    assert session.append("turn/end", {"turn": 1}).seq == 2
    with pytest.raises(SessionError, match=r"event 0 has seq 1"):
        host.sessions.create("bad-seed", seed=[SessionEvent("turn/start", 1, 1, {})])
    assert host.sessions.get("bad-seed") is None


async def test_live_appends_are_announced_and_detached_ones_are_not(host: Host) -> None:
    recorder = EventRecorder()
    host.register(recorder)
    session = host.sessions.create("announced")

    session.append("turn/start", {"turn": 1})
    with pytest.raises(EventDataError):
        session.append("turn/end", {"bad": b""})
    host.sessions.detach(session)
    session.append("turn/end", {"turn": 1})

    assert recorder.events == [("announced", 0, "turn/start")]
    assert session.seq == 2


async def test_a_failing_event_listener_fails_neither_the_append_nor_the_other_listeners(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = EventRecorder()
    host.register(recorder)
    host.register(BrokenEventListener())  # registered last, so called first
    session = host.sessions.create("contained")

    with caplog.at_level(logging.ERROR):
        event = session.append("turn/start", {"turn": 1})

    assert event.seq == 0
    assert session.events == (event,)
    assert recorder.events == [("contained", 0, "turn/start")]
    assert [record.getMessage() for record in caplog.records] == [
        "session_event listener 'broken-event-listener' failed on seq 0 of session 'contained'"
    ]
    assert caplog.records[0].exc_info is not None
    assert str(caplog.records[0].exc_info[1]) == "listener broke"


async def test_event_listeners_are_called_last_registered_first(host: Host) -> None:
    heard: list[str] = []

    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

        @hookimpl
        def session_event(self, event: SessionEvent) -> None:
            heard.append(f"{self.name}:{event.seq}")

    for name in ("first", "second", "third"):
        host.register(Named(name))
    host.sessions.create("ordered").append("turn/start", {"turn": 1})

    assert heard == ["third:0", "second:0", "first:0"]


async def test_the_store_knows_its_live_sessions(host: Host) -> None:
    first = host.sessions.create("first")
    second = host.sessions.create()

    assert host.sessions.get("first") is first
    assert host.sessions.live() == (first, second)
    with pytest.raises(SessionError, match=r"^a live session 'first' already exists$"):
        host.sessions.create("first")

    host.sessions.detach(first)
    assert host.sessions.get("first") is None
    assert host.sessions.is_live(first) is False
    assert host.sessions.live() == (second,)
