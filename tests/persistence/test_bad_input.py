"""Bad input, end to end: each is refused with a clear error, and nothing on disk changes.

Session ids that look like paths, event data JSON cannot carry unchanged or nested too deep,
logs damaged inside their committed region or holding a complete line of an unexpected shape,
times out of range, a truncated header, a header from a newer release, a log copied into
another session's directory, a log that is a symbolic link out of the root, and a second
process writing a session another one holds.
Where the refusal happens at a checkpoint, the checkpoint fails closed: the model request or
the tool body that depended on it does not run.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

import anyio
import pytest
from hypothesis import given, settings

from kai_session_checkpoint_policy import (
    MAX_JSON_DEPTH,
    Agent,
    EventDataError,
    Host,
    Session,
    SessionEvent,
    SessionExistsError,
    StoredDataError,
    cli,
    policy,
)
from kai_session_checkpoint_policy.persistence import (
    CorruptLogError,
    InvalidSessionIdError,
    JsonlSessionPersistence,
    NotARegularFileError,
    OsFiles,
    PersistenceError,
    SessionLockedError,
    SessionNotFoundError,
    UnsupportedFormatError,
    encode_session_id,
)
from kai_session_checkpoint_policy.persistence.jsonl.format import NO_CWD, encode_header, scan_log
from kai_session_checkpoint_policy.persistence.records import MAX_TIME
from kai_session_checkpoint_policy.persistence.values import SessionHeader

from ..support import SUPPORT
from ..support.crash_child import (
    CRASH_SESSION,
    CRASH_TURN,
    PROVIDER,
    Flush,
    MemoryRecorder,
    ScriptedModel,
    SessionPlan,
    Step,
    Workload,
    run_workload,
)
from ..support.markers import reap, wait_for_marker
from ..support.persistence_helpers import (
    COMPLETE_TURN,
    events,
    find_log,
    log_bytes,
    log_path,
    tree,
    write_log,
)
from ..support.strategies import json_values, lossy_values, session_ids

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import FrameType

    from kai_session_checkpoint_policy import JSON, JSONObject, TurnOutcome

T = TypeVar("T")

LOG: Final = "session.jsonl"
ZLOG: Final = "session.jsonl.zstd"
LOCK: Final = "session.lock"
SECOND_TURN: Final = (Step(("Once more.",), (("write-2", "write"),)), Step(("Done.",)))


def stored(
    root: Path, session_id: str = "s", *, plain: bool = False
) -> tuple[Path, list[SessionEvent]]:
    """A log of two complete turns written through the host; its path and its events.

    *plain*: as plain lines, one event per line (neither compressed nor packed).
    """
    recorder = MemoryRecorder()
    plan = SessionPlan(session_id, (CRASH_TURN, SECOND_TURN, Flush()))
    workload = Workload((plan,), compression="none" if plain else "zstd", pack_chunks=not plain)
    assert anyio.run(run_workload, workload, root, recorder) is None
    return find_log(root, session_id), recorder.events[session_id]


async def resume_turn(root: Path, session_id: str, seed: list[SessionEvent]) -> TurnOutcome:
    """Resume the stored session for one more turn, whose first checkpoint must fail.

    Closing the host drains the session again, which fails the same way.
    """
    model = ScriptedModel(MemoryRecorder())
    host = Host([JsonlSessionPersistence(root), policy])
    host.llm.register_adapter(PROVIDER, model)
    outcomes: list[TurnOutcome] = []

    async def turn() -> None:
        async with host:
            session = host.sessions.create(session_id, seed=seed)
            model.start_turn(session_id, (Step(("unreachable",)),))
            agent = Agent(host, session, provider=PROVIDER, model="m")
            outcomes.append(await agent.run_turn("again"))

    with pytest.raises(PersistenceError) as closing:
        await turn()
    (outcome,) = outcomes
    assert type(closing.value) is type(outcome.error)
    assert model.steps[session_id], "the model was asked although the checkpoint failed"
    return outcome


# -- session ids -----------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(session_id=session_ids())
def test_any_id_names_one_directory_under_the_root(session_id: str) -> None:
    """Separators, ``.``, ``..``, NUL, backslashes and surrogates are escaped, never followed."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "root"
        refused: InvalidSessionIdError | None = None
        try:
            escaped = encode_session_id(session_id)
        except InvalidSessionIdError as exc:
            refused = exc
        if refused is not None:
            assert "session id is too long" in str(refused)
            return
        path, written = stored(root, session_id)
        assert path == root / NO_CWD / escaped / ZLOG
        assert all(not name.startswith("..") for name in tree(Path(scratch)))
        assert set(tree(Path(scratch))) <= {
            "root",
            f"root/{NO_CWD}",
            f"root/{NO_CWD}/{escaped}",
        } | {f"root/{NO_CWD}/{escaped}/{name}" for name in (ZLOG, "session.lock")}
        backend = JsonlSessionPersistence(root)
        assert [header.id for header in anyio.run(backend.list_sessions)] == [session_id]
        assert list(anyio.run(backend.load, session_id).events) == written


@pytest.mark.parametrize(
    "session_id", ["../../outside", "..", ".", "a/b/../c", "/etc/passwd", "nul\0byte", "c:\\x"]
)
def test_ids_that_look_like_paths_stay_inside_the_root(tmp_path: Path, session_id: str) -> None:
    root = tmp_path / "root"
    path, written = stored(root, session_id)
    assert path.parent.parent == root / NO_CWD
    assert set(tree(tmp_path)) == {
        "root",
        f"root/{NO_CWD}",
        f"root/{NO_CWD}/{path.parent.name}",
        f"root/{NO_CWD}/{path.parent.name}/{ZLOG}",
        f"root/{NO_CWD}/{path.parent.name}/session.lock",
    }
    assert list(anyio.run(JsonlSessionPersistence(root).load, session_id).events) == written


def test_an_id_too_long_for_a_file_name_is_refused_when_the_session_is_created(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"

    async def create() -> None:
        async with Host([JsonlSessionPersistence(root)]) as host:
            host.sessions.create("x" * 5000)

    with pytest.raises(InvalidSessionIdError, match=r"session id is too long: 5000 bytes"):
        anyio.run(create)
    assert not root.exists() or tree(root) == {}
    with pytest.raises(InvalidSessionIdError, match=r"session id is too long: 5000 bytes"):
        anyio.run(JsonlSessionPersistence(root).load, "x" * 5000)


def test_an_empty_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSessionIdError, match="must be a non-empty string, not ''"):
        anyio.run(JsonlSessionPersistence(tmp_path).load, "")


# -- event data ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"x": math.nan}, "data['x'] is nan"),
        ({"x": [1, math.inf]}, "data['x'][1] is inf"),
        ({"x": {"y": -math.inf}}, "data['x']['y'] is -inf"),
        ({"x": {1: "one"}}, "data['x'] has the non-string key 1"),
        ({"x": b"bytes"}, "data['x'] is of type bytes"),
        ({"x": (1, 2)}, "data['x'] is of type tuple"),
        ({"x": {1, 2}}, "data['x'] is of type set"),
    ],
)
def test_data_json_would_change_is_refused_naming_where(data: object, problem: str) -> None:
    session = Session("s")
    with pytest.raises(EventDataError) as refused:
        session.append("note", data, ignorable=True)
    message = str(refused.value)
    assert message.startswith("data of a 'note' event is not losslessly JSON-serializable: ")
    assert problem in message
    assert session.seq == 0


def test_data_that_contains_itself_or_is_not_an_object_is_refused() -> None:
    looped: dict[str, object] = {}
    looped["self"] = looped
    with pytest.raises(EventDataError, match=r"data\['self'\] contains itself"):
        Session("s").append("note", looped, ignorable=True)
    with pytest.raises(EventDataError, match="must be a JSON object, not list"):
        Session("s").append("note", [1, 2], ignorable=True)


@settings(max_examples=60, deadline=None)
@given(value=lossy_values())
def test_no_lossy_value_is_ever_admitted(value: object) -> None:
    admitted: list[SessionEvent] = []
    session = Session("s", on_append=lambda _, event: admitted.append(event))
    with pytest.raises(EventDataError, match="not losslessly JSON-serializable"):
        session.append("note", {"value": value}, ignorable=True)
    assert session.seq == 0
    assert admitted == []


@settings(max_examples=30, deadline=None)
@given(value=json_values)
def test_lossless_values_come_back_unchanged_from_disk(value: JSON) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)

        async def write_and_load() -> Sequence[SessionEvent]:
            async with Host([JsonlSessionPersistence(root)]) as host:
                session = host.sessions.create("s")
                session.append("note", {"value": value}, ignorable=True)
                await host.sessions.flush(session)
            return (await JsonlSessionPersistence(root).load("s")).events

        (event,) = anyio.run(write_and_load)
        assert event.data == {"value": value}
        assert json.dumps(event.data, sort_keys=True) == json.dumps(
            {"value": value}, sort_keys=True
        )


HIGH, LOW = chr(0xD800), chr(0xDFFF)


@pytest.mark.parametrize("text", [HIGH, LOW, f"a{LOW}b", LOW + HIGH, f"{HIGH}\n"])
def test_lone_surrogates_come_back_unchanged_from_disk(tmp_path: Path, text: str) -> None:
    """JSON escapes them (``\\ud800``); reading them back, as keys and values, never fails."""
    session_id = f"s{text}"

    async def write() -> tuple[SessionEvent, ...]:
        async with Host([JsonlSessionPersistence(tmp_path)]) as host:
            session = host.sessions.create(session_id)
            session.append("note", {text: text, "list": [text, {text: [text]}]}, ignorable=True)
            session.append(f"type{text}", {}, ignorable=True)
            await host.sessions.flush(session)
            return tuple(session.events)

    written = anyio.run(write)
    backend = JsonlSessionPersistence(tmp_path)
    assert [header.id for header in anyio.run(backend.list_sessions)] == [session_id]
    for read in (backend.inspect, backend.load):
        stored = anyio.run(read, session_id)
        assert stored.events == written
        assert [event.type for event in stored.events] == ["note", f"type{text}"]
        assert stored.events[0].data == {text: text, "list": [text, {text: [text]}]}


def test_surrogates_written_raw_by_another_writer_are_read(tmp_path: Path) -> None:
    """A surrogate as the three bytes UTF-8 would give it, as some writers leave them."""
    line = b'{"type":"note","seq":0,"time":1,"data":{"\xed\xa0\x80":"a\xed\xb3\xbf"},'
    line += b'"ignorable":true}\n'
    write_log(tmp_path, "s", encode_header(SessionHeader("s", 1)) + line)
    loaded = anyio.run(JsonlSessionPersistence(tmp_path).load, "s")
    assert [event.data for event in loaded.events] == [{"\ud800": "a\udcff"}]


# -- nesting ---------------------------------------------------------------------------------


STACKS: Final = ["shallow stack", "deep recursion", "worker thread"]


def on_stack(stack: str, function: Callable[[], T]) -> T:
    """Call *function* on a shallow stack, 40 frames short of the recursion limit, or in a
    worker thread."""
    if stack == "worker thread":
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(function).result()
    if stack == "shallow stack":
        return function()
    frame: FrameType | None = sys._getframe()
    depth = 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return _recurse(sys.getrecursionlimit() - 40 - depth, function)


def _recurse(frames: int, function: Callable[[], T]) -> T:
    return function() if frames <= 0 else _recurse(frames - 1, function)


def nested(depth: int) -> JSONObject:
    """An object that nests *depth* levels of objects and arrays, itself included."""
    value: JSON = "leaf"
    for level in range(depth - 1):
        value = {"k": value} if level % 2 else [value]
    return {"v": value}


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 980, 100_000])
def test_data_nested_deeper_than_the_bound_is_refused_naming_its_depth(
    stack: str, depth: int
) -> None:
    admitted: list[SessionEvent] = []
    session = Session("s", on_append=lambda _, event: admitted.append(event))
    data = nested(depth)
    with pytest.raises(EventDataError) as refused:
        on_stack(stack, lambda: session.append("note", data, ignorable=True))
    nests = "more than 64" if depth == 100_000 else depth  # too deep even to encode
    assert str(refused.value) == (
        f"data of a 'note' event is nested {nests} levels deep (arrays and objects); at most 64 "
        "levels are allowed"
    )
    assert (session.seq, admitted) == (0, [])


@pytest.mark.parametrize("stack", STACKS)
def test_data_at_the_bound_is_appended_and_read_back_on_any_stack(
    tmp_path: Path, stack: str
) -> None:
    session = Session("s")
    event = on_stack(stack, lambda: session.append("note", nested(MAX_JSON_DEPTH), ignorable=True))
    path = write_log(tmp_path, "s", log_bytes("s", [event]))
    scan = on_stack(stack, lambda: scan_log(path.read_bytes(), path))
    assert scan.events == (event,)
    assert scan.events[0].data == nested(MAX_JSON_DEPTH)
    assert anyio.run(JsonlSessionPersistence(tmp_path).load, "s").events == (event,)


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 100_000])
def test_a_line_nested_deeper_than_the_bound_is_corrupt_on_any_stack(
    tmp_path: Path, stack: str, depth: int
) -> None:
    logged = events(*COMPLETE_TURN)
    deep = "[" * (depth - 1) + "]" * (depth - 1)  # in {"x": ...}, the data: *depth* levels
    line = f'{{"type":"note","seq":6,"time":1,"data":{{"x":{deep}}}}}\n'.encode()
    path = write_log(tmp_path, "s", log_bytes("s", logged) + line)  # the last line
    nests = "more than 65" if depth == 100_000 else depth + 1  # too deep even to decode
    problem = (
        f"the line is nested {nests} levels deep; an event line nests at most 65 (its data at "
        "most 64)"
    )
    with pytest.raises(CorruptLogError) as refused:
        on_stack(stack, lambda: scan_log(path.read_bytes(), path))
    assert (refused.value.path, refused.value.line, refused.value.problem) == (path, 8, problem)
    before = tree(tmp_path, locks=False)
    for read in (JsonlSessionPersistence(tmp_path).inspect, JsonlSessionPersistence(tmp_path).load):
        with pytest.raises(CorruptLogError, match=f"line 8: {re.escape(problem)}$"):
            anyio.run(read, "s")
    assert tree(tmp_path, locks=False) == before


# -- damaged logs ----------------------------------------------------------------------------


DAMAGE: Final[dict[str, Callable[[bytes], bytes]]] = {
    "garbage": lambda line: b"\x00\xffnot json at all",
    "cut short": lambda line: line[: len(line) // 2],
    "zeros": lambda line: bytes(len(line)),
}
"""Damage that leaves no complete record: a torn tail if nothing but more of it follows."""

SHAPES: Final[dict[str, Callable[[bytes], bytes]]] = {
    "wrong seq": lambda line: line.replace(b'"seq":', b'"seq":1', 1),
    "extra field": lambda line: line[:-1] + b',"extra":1}',
    "missing field": lambda line: re.sub(rb'"time":\d+,', b"", line),
    "seq as a string": lambda line: re.sub(rb'"seq":(\d+)', rb'"seq":"\1"', line),
    "NaN": lambda line: line.replace(b'"data":{', b'"data":{"nan":NaN,', 1),
    "time in the year 10000": lambda line: re.sub(rb'"time":\d+', b'"time":253402300800000', line),
    "nested 100000 deep": lambda line: line.replace(
        b'"data":{', b'"data":{"deep":' + b"[" * 100_000 + b"]" * 100_000 + b",", 1
    ),
}
"""A complete record of an unexpected shape: written whole, so never a torn tail."""


def open_turn_log(root: Path) -> tuple[Path, list[SessionEvent], int]:
    """A log of two turns, the last one still open; its path, events, and the first line of
    the open turn that other events follow."""
    path, written = stored(root, plain=True)
    data = path.read_bytes()
    path.write_bytes(data[: data.rindex(b"\n", 0, -1) + 1])  # without the last turn/end
    start = max(i for i, event in enumerate(written) if event.type == "turn/start")
    return path, written[:-1], start + 3  # the line of the event after the turn's step/start


def assert_refused_and_left_alone(
    root: Path, path: Path, line: int, seed: list[SessionEvent]
) -> str:
    """Reading the log at *path* fails naming *line*, and nothing on disk changes; the message."""
    before = tree(root)
    backend = JsonlSessionPersistence(root)
    for read in (backend.inspect, backend.load):
        with pytest.raises(CorruptLogError) as refused:
            anyio.run(read, "s")
        assert refused.value.path == path
        assert refused.value.line == line
        assert str(refused.value).startswith(f"corrupt session log {path}, line {line}: ")
    outcome = anyio.run(resume_turn, root, "s", seed)
    assert isinstance(outcome.error, CorruptLogError)
    assert tree(root) == before
    return refused.value.problem


@pytest.mark.parametrize("damage", [*DAMAGE, *SHAPES])
def test_a_damaged_line_before_a_turn_end_is_named_and_left_alone(
    tmp_path: Path, damage: str
) -> None:
    path, written = stored(tmp_path, plain=True)
    lines = path.read_bytes().split(b"\n")
    line = 6  # an event of the first turn; both turns end later
    lines[line - 1] = {**DAMAGE, **SHAPES}[damage](lines[line - 1])
    path.write_bytes(b"\n".join(lines))
    assert_refused_and_left_alone(tmp_path, path, line, written)


@pytest.mark.parametrize("damage", [*DAMAGE, *SHAPES])
def test_a_damaged_line_in_the_open_turn_is_named_and_the_events_after_it_kept(
    tmp_path: Path, damage: str
) -> None:
    """No ``turn/end`` follows the damage, but complete events do: it is not a torn tail."""
    path, written, line = open_turn_log(tmp_path)
    lines = path.read_bytes().split(b"\n")
    assert len(lines) > line + 1  # complete events follow
    lines[line - 1] = {**DAMAGE, **SHAPES}[damage](lines[line - 1])
    path.write_bytes(b"\n".join(lines))
    problem = assert_refused_and_left_alone(tmp_path, path, line, written)
    if damage in DAMAGE:
        assert problem.endswith(
            f"line {line + 1} after it is a complete record, so this is not a torn tail"
        )


@pytest.mark.parametrize("damage", SHAPES)
def test_a_last_line_of_an_unexpected_shape_is_named_not_cut(tmp_path: Path, damage: str) -> None:
    path, written, _ = open_turn_log(tmp_path)
    lines = path.read_bytes().split(b"\n")
    lines[-2] = SHAPES[damage](lines[-2])  # the last event; lines[-1] is empty
    path.write_bytes(b"\n".join(lines))
    assert_refused_and_left_alone(tmp_path, path, len(lines) - 1, written)


def with_data_damage(path: Path, line: int) -> str:
    """Put a number no float holds into the data of the event on *line*; return its type."""
    lines = path.read_bytes().split(b"\n")
    lines[line - 1] = lines[line - 1].replace(b'"data":{', b'"data":{"big":1e999,', 1)
    path.write_bytes(b"\n".join(lines))
    return str(json.loads(lines[line - 1].replace(b"1e999", b"0"))["type"])


def test_damaged_data_in_a_closed_turn_is_kept_and_named_when_read(tmp_path: Path) -> None:
    """Only the envelope is checked on reading; the record was written whole, so it stays."""
    path, written = stored(tmp_path, plain=True)
    event_type = with_data_damage(path, 6)
    before = tree(tmp_path, locks=False)
    loaded = anyio.run(JsonlSessionPersistence(tmp_path).load, "s")
    assert (len(loaded.events), loaded.repair, loaded.torn_bytes) == (len(written), (), 0)
    assert tree(tmp_path, locks=False) == before
    assert [event.data for event in loaded.events[5:]] == [event.data for event in written[5:]]
    damaged = loaded.events[4]
    assert (damaged.type, damaged.seq) == (event_type, 4)
    with pytest.raises(StoredDataError) as refused:
        _ = damaged.data
    assert str(refused.value) == (
        f"the data of the stored {event_type!r} event (seq 4): 1e999 is not a finite number"
    )


def test_damaged_data_in_the_open_turn_is_named_and_left_alone(tmp_path: Path) -> None:
    """Recovery reads the data of the open turn's events: it names the event and stops."""
    path, _, line = open_turn_log(tmp_path)
    event_type = with_data_damage(path, line)
    seq = line - 2  # after the header, one event per line
    before = tree(tmp_path)
    backend = JsonlSessionPersistence(tmp_path)
    for read in (backend.inspect, backend.load):
        with pytest.raises(CorruptLogError) as refused:
            anyio.run(read, "s")
        assert (refused.value.path, refused.value.line, refused.value.seq) == (path, None, seq)
        assert str(refused.value) == (
            f"corrupt session log {path}, seq {seq}: the data of the {event_type!r} event: "
            "1e999 is not a finite number"
        )
    assert tree(tmp_path) == before


@pytest.mark.parametrize("damage", DAMAGE)
def test_damage_on_the_last_lines_only_is_cut_as_a_torn_tail(tmp_path: Path, damage: str) -> None:
    path, written, _ = open_turn_log(tmp_path)
    data = path.read_bytes()
    lines = data.split(b"\n")
    last, before_last = lines[-2], lines[-3]
    tail = DAMAGE[damage](before_last) + b"\n" + DAMAGE[damage](last) + b"\n"
    committed = len(data) - len(last) - len(before_last) - 2
    path.write_bytes(data[:committed] + tail)
    loaded = anyio.run(JsonlSessionPersistence(tmp_path).load, "s")
    assert list(loaded.events[: -len(loaded.repair)]) == written[:-2]
    assert loaded.torn_bytes == len(tail)
    assert path.with_name(f"{path.name}.torn-{committed}").read_bytes() == tail


@pytest.mark.parametrize("header", [b"", b'{"format":"kai-ses', b'{"format":"kai-session"'])
def test_a_truncated_header_is_named(tmp_path: Path, header: bytes) -> None:
    path = write_log(tmp_path, "s", header)
    with pytest.raises(CorruptLogError, match=r", line 1: the header line is incomplete$"):
        anyio.run(JsonlSessionPersistence(tmp_path).load, "s")
    assert path.read_bytes() == header


def test_a_log_from_a_newer_release_is_unsupported_not_corrupt(tmp_path: Path) -> None:
    path, written = stored(tmp_path, plain=True)
    data = path.read_bytes().replace(b'"version":0', b'"version":1', 1)
    path.write_bytes(data)
    before = tree(tmp_path)
    backend = JsonlSessionPersistence(tmp_path)
    for read in (backend.inspect, backend.load):
        with pytest.raises(UnsupportedFormatError) as refused:
            anyio.run(read, "s")
        assert not isinstance(refused.value, CorruptLogError)
        message = str(refused.value)
        assert "version 1, newer than version 0" in message
        assert "upgrade kai-session-checkpoint-policy" in message
        assert str(path) in message
    outcome = anyio.run(resume_turn, tmp_path, "s", written)
    assert isinstance(outcome.error, UnsupportedFormatError)
    assert tree(tmp_path) == before


HUGE: Final = 10**30


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("list",), 1),
        (("inspect", "s"), 1),
        (("recover", "s"), 1),
        (("inspect", "t"), 3),
        (("recover", "t"), 3),
    ],
)
def test_times_out_of_range_are_named_by_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], line: int
) -> None:
    """A time past the year 9999 used to crash the command's date formatting."""
    (first, *_) = events(("turn/start", {"turn": 1}))
    later = SessionEvent("turn/end", 1, HUGE, {"turn": 1})
    path = write_log(tmp_path, "s", encode_header(SessionHeader("s", HUGE)) + b"")
    other = write_log(tmp_path / "other", "t", log_bytes("t", [first, later]))
    root = tmp_path if args[-1] != "t" else tmp_path / "other"
    before = tree(tmp_path, locks=False)
    command, *session = args
    assert cli.main([command, str(root), *session]) == cli.EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    named = path if root == tmp_path else other
    what = "the header's createdAt" if line == 1 else "the event time"
    listing = f"cannot list {named.parent}: " if command == "list" else ""
    assert (out, err) == (
        "",
        f"kai-checkpoint: {listing}corrupt session log {named}, line {line}: {what} is not an "
        "integer from 0 to 253402300799999 (epoch milliseconds up to the year 9999)\n",
    )
    assert tree(tmp_path, locks=False) == before


def test_the_latest_time_a_log_may_hold_is_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_log(tmp_path, "s", encode_header(SessionHeader("s", MAX_TIME)))
    assert cli.main(["list", str(tmp_path)]) == 0
    assert capsys.readouterr() == ("s\t9999-12-31T23:59:59Z\t_no-cwd/s/session.jsonl\n", "")


# -- a log in another session's place --------------------------------------------------------


def test_a_log_copied_into_another_sessions_directory_is_refused_untouched(
    tmp_path: Path,
) -> None:
    """Recovery would otherwise cut and close a log it does not own, under the wrong id."""
    source, _ = stored(tmp_path / "source", "a", plain=True)
    data = source.read_bytes()
    path = write_log(tmp_path / "root", "b", data[: data.rindex(b"\n", 0, -1) + 1] + b'{"ty')
    before = tree(tmp_path, locks=False)
    backend = JsonlSessionPersistence(tmp_path / "root")
    for read in (backend.inspect, backend.load):
        with pytest.raises(PersistenceError) as refused:
            anyio.run(read, "b")
        assert str(refused.value) == (
            f"{path} belongs to session 'a', not 'b'; refusing to read or change it as that session"
        )
    assert tree(tmp_path, locks=False) == before


# -- symbolic links --------------------------------------------------------------------------


def test_a_log_that_links_out_of_the_root_is_never_followed(tmp_path: Path) -> None:
    outside, written = stored(tmp_path / "elsewhere")
    root = tmp_path / "root"
    log_path(root, "s").parent.mkdir(parents=True)
    log_path(root, "s").symlink_to(outside)
    before = tree(tmp_path, locks=False)
    backend = JsonlSessionPersistence(root)
    for read in (backend.inspect, backend.load):
        with pytest.raises(PersistenceError, match="is a symbolic link; refusing to follow it"):
            anyio.run(read, "s")
    outcome = anyio.run(resume_turn, root, "s", written)
    assert isinstance(outcome.error, PersistenceError)
    assert "symbolic link" in str(outcome.error)
    assert tree(tmp_path, locks=False) == before


def test_a_session_directory_that_links_out_of_the_root_is_never_followed(tmp_path: Path) -> None:
    outside, written = stored(tmp_path / "elsewhere")
    root = tmp_path / "root"
    (root / NO_CWD).mkdir(parents=True)
    (root / NO_CWD / "s").symlink_to(outside.parent, target_is_directory=True)
    before = tree(tmp_path)
    backend = JsonlSessionPersistence(root)
    for read in (backend.inspect, backend.load):
        with pytest.raises(InvalidSessionIdError, match="is a symbolic link; refusing to follow"):
            anyio.run(read, "s")
    assert anyio.run(backend.list_sessions) == []
    outcome = anyio.run(resume_turn, root, "s", written)
    assert isinstance(outcome.error, InvalidSessionIdError)
    assert tree(tmp_path) == before


# -- two writers -----------------------------------------------------------------------------


CHILD: Final = SUPPORT / "crash_child.py"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file locks")
def test_a_second_process_is_refused_before_writing_a_byte(tmp_path: Path) -> None:
    """A child process writes the session and holds it; this process then tries to write it."""
    root, trace, marker = tmp_path / "root", tmp_path / "trace", tmp_path / "marker"
    trace.mkdir()
    marker.write_bytes(b"")
    holding = "crash pre-step 1.1: flush-after"  # its first batch is written; it keeps going
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(trace), str(root), "--point", holding, "--marker", marker],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_marker(child, marker, holding)
        before = tree(root)

        async def second_writer() -> None:
            async with Host([JsonlSessionPersistence(root)]) as host:
                with pytest.raises(SessionExistsError, match=r"resume\('crash'\)"):
                    host.sessions.create(CRASH_SESSION)
                locked = f"session {CRASH_SESSION!r} is being written by another process"
                with pytest.raises(SessionLockedError, match=locked):
                    await host.sessions.resume(CRASH_SESSION)

        anyio.run(second_writer)
        with pytest.raises(SessionLockedError):
            anyio.run(JsonlSessionPersistence(root).load, CRASH_SESSION)
        assert tree(root) == before
    finally:
        reap(child)
    recovered = anyio.run(JsonlSessionPersistence(root).load, CRASH_SESSION)
    assert recovered.events[-1].type == "turn/end"


# -- files that are not regular files --------------------------------------------------------


FIFO_DEADLINE: Final = 30.0
"""Seconds an operation on a FIFO may take before the test releases it and fails."""


def without_hanging(call: Callable[[], T], *fifos: Path) -> T:
    """Run *call* in a thread and return its result; a FIFO that blocks it fails the test.

    If *call* is still running after :data:`FIFO_DEADLINE` seconds, the other end of each of
    *fifos* is opened and closed again, which lets an open blocked on it (and a read after it)
    return, and the test fails.
    """
    results: list[T] = []
    errors: list[Exception] = []

    def run() -> None:
        try:
            results.append(call())
        except Exception as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(FIFO_DEADLINE)
    if thread.is_alive():
        for fifo in fifos:
            os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
        thread.join(FIFO_DEADLINE)
        pytest.fail(f"blocked on a FIFO for {FIFO_DEADLINE} seconds")
    if errors:
        raise errors[0]
    return results[0]


def special_file(path: Path, kind: str) -> Path:
    """Make *path* a FIFO, a directory, a socket or a symbolic link; return it."""
    if kind == "a FIFO":
        os.mkfifo(path, 0o600)
    elif kind == "a directory":
        path.mkdir()
    elif kind == "a socket":
        with socket.socket(socket.AF_UNIX) as bound:
            bound.bind(str(path))
    else:
        path.symlink_to(path.with_name("target"))
        path.with_name("target").write_bytes(b"")
    return path


def refused(path: Path, kind: str) -> str:
    if kind == "a symbolic link":
        return f"{path} is a symbolic link; refusing to follow it"
    return f"{path} is {kind}, not a regular file; refusing to open it"


FILE_OPERATIONS: Final[dict[str, Callable[[OsFiles, Path], object]]] = {
    "read": OsFiles.read,
    "read_first_line": OsFiles.read_first_line,
    "open_append": OsFiles.open_append,
    "lock": OsFiles.lock,
}


@pytest.mark.parametrize("operation", FILE_OPERATIONS)
@pytest.mark.parametrize("kind", ["a FIFO", "a directory", "a socket", "a symbolic link"])
def test_only_regular_files_are_opened(tmp_path: Path, operation: str, kind: str) -> None:
    path = special_file(tmp_path / "file", kind)
    files = OsFiles()
    fifos = [path] if kind == "a FIFO" else []
    with pytest.raises(NotARegularFileError) as refusal:
        without_hanging(lambda: FILE_OPERATIONS[operation](files, path), *fifos)
    assert str(refusal.value) == refused(path, kind)
    assert (refusal.value.path, refusal.value.kind) == (path, kind)


@pytest.mark.parametrize("operation", FILE_OPERATIONS)
def test_a_device_is_not_opened_as_a_file(operation: str) -> None:
    with pytest.raises(NotARegularFileError) as refusal:
        FILE_OPERATIONS[operation](OsFiles(), Path(os.devnull))
    assert str(refusal.value) == refused(Path(os.devnull), "a character device")


def test_regular_files_stay_blocking(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"line\n")
    files = OsFiles()
    for fd in (files.open_append(path), files.lock(tmp_path / "lock")):
        try:
            assert os.get_blocking(fd)
        finally:
            os.close(fd)
    assert files.read(path) == files.read_first_line(path) == b"line\n"


def fifo_session(root: Path, name: str) -> tuple[Path, list[SessionEvent]]:
    """A stored session whose log, lock, or copy of a torn tail (``torn``) is a FIFO."""
    path, written = stored(root, plain=True)
    if name == "torn":  # a torn tail, whose copy recovery would keep in the FIFO
        fifo = path.with_name(f"{LOG}.torn-{path.stat().st_size}")
        with path.open("ab") as log:
            log.write(b'{"type":"tool/result","se')
    else:
        fifo = path.with_name(name)
        fifo.unlink()
    os.mkfifo(fifo, 0o600)
    return fifo, written


@pytest.mark.parametrize(
    ("name", "reads"),
    [(LOG, ("inspect", "load", "write")), ("torn", ("load",)), (LOCK, ("load", "write"))],
)
def test_a_fifo_in_a_session_is_refused_without_blocking(
    tmp_path: Path, name: str, reads: tuple[str, ...]
) -> None:
    fifo, written = fifo_session(tmp_path, name)
    before = tree(tmp_path)
    backend = JsonlSessionPersistence(tmp_path)
    for read in reads:
        if read == "write":
            outcome = without_hanging(lambda: anyio.run(resume_turn, tmp_path, "s", written), fifo)
            error = outcome.error
        else:
            with pytest.raises(NotARegularFileError) as refusal:
                without_hanging(partial(anyio.run, getattr(backend, read), "s"), fifo)
            error = refusal.value
        assert isinstance(error, NotARegularFileError)
        assert str(error) == refused(fifo, "a FIFO")
    assert tree(tmp_path) == before


# -- what recovery leaves behind -------------------------------------------------------------


def unlocked_session(root: Path, damage: str) -> tuple[Path, type[Exception]]:
    """A session never written here (no lock file), *damage*-d; its log and the refusal."""
    path, _ = stored(root, plain=True)
    path.with_name(LOCK).unlink()
    data = path.read_bytes()
    if damage == "no log":
        path.unlink()
        return path, SessionNotFoundError
    if damage == "corrupt":
        lines = data.split(b"\n")
        lines[5] = DAMAGE["garbage"](lines[5])  # an event of the first turn
        path.write_bytes(b"\n".join(lines))
        return path, CorruptLogError
    if damage == "newer":
        path.write_bytes(data.replace(b'"version":0', b'"version":1', 1))
        return path, UnsupportedFormatError
    path.unlink()
    os.mkfifo(path, 0o600)
    return path, NotARegularFileError


@pytest.mark.parametrize("damage", ["no log", "corrupt", "newer", "fifo"])
def test_a_refused_recovery_leaves_no_lock_file(tmp_path: Path, damage: str) -> None:
    path, error = unlocked_session(tmp_path, damage)
    before = tree(tmp_path)
    with pytest.raises(error):
        without_hanging(partial(anyio.run, JsonlSessionPersistence(tmp_path).load, "s"), path)
    assert tree(tmp_path) == before
    assert not path.with_name(LOCK).exists()


def test_a_recovery_with_nothing_to_do_leaves_no_lock_file(tmp_path: Path) -> None:
    path, written = stored(tmp_path, plain=True)
    path.with_name(LOCK).unlink()
    before = tree(tmp_path)
    recovered = anyio.run(JsonlSessionPersistence(tmp_path).load, "s")
    assert (list(recovered.events), recovered.repair) == (written, ())
    assert tree(tmp_path) == before


class FinishingFiles(OsFiles):
    """Real files on which another writer appends *rest* to *log* just before a lock is taken."""

    def __init__(self, log: Path, rest: bytes) -> None:
        super().__init__()
        self.log, self.rest = log, rest

    def lock(self, path: Path) -> int:
        with self.log.open("ab") as log:
            log.write(self.rest)
        return super().lock(path)


def test_a_recovery_that_repairs_reads_the_log_again_under_the_lock(tmp_path: Path) -> None:
    path, written = stored(tmp_path, plain=True)
    path.with_name(LOCK).unlink()
    data = path.read_bytes()
    cut = data.index(b"\n", data.index(b'"step/start"')) + 1  # an open step: needs a repair
    path.write_bytes(data[:cut])
    files = FinishingFiles(path, data[cut:])  # the rest arrives before recovery locks the log
    recovered = anyio.run(JsonlSessionPersistence(tmp_path, files=files).load, "s")
    assert (list(recovered.events), recovered.repair) == (written, ())
    assert path.read_bytes() == data
    assert set(tree(tmp_path)) == {NO_CWD, f"{NO_CWD}/s", f"{NO_CWD}/s/{LOG}", f"{NO_CWD}/s/{LOCK}"}


STALE: Final = (f"{LOG}.0123456789ab.tmp", f"{LOG}.torn-100.abcdef012345.tmp")
"""Temporary files an interrupted publish of a log, or of a torn tail's copy, leaves."""
NOT_STALE: Final = (f"{LOG}.torn-100", "notes.tmp", f"{LOG}.0123456789AB.tmp", f"{LOG}.tmp")


def test_recovery_removes_the_temporaries_an_interrupted_publish_left(tmp_path: Path) -> None:
    path, written = stored(tmp_path, plain=True)
    for name in (*STALE, *NOT_STALE):
        path.with_name(name).write_bytes(b"left over")
    before = tree(tmp_path)
    recovered = anyio.run(JsonlSessionPersistence(tmp_path).load, "s")
    assert list(recovered.events) == written
    assert tree(tmp_path) == {
        name: entry
        for name, entry in before.items()
        if name.removeprefix(f"{NO_CWD}/s/") not in STALE
    }


def test_a_writer_removes_the_temporary_of_an_interrupted_creation(tmp_path: Path) -> None:
    directory = tmp_path / NO_CWD / "s"
    directory.mkdir(mode=0o700, parents=True)
    (directory / LOCK).write_bytes(b"")  # a writer took the lock, and died while publishing
    (directory / STALE[0]).write_bytes(b'{"type":"session"')
    stored(tmp_path, plain=True)
    assert set(tree(tmp_path)) == {NO_CWD, f"{NO_CWD}/s", f"{NO_CWD}/s/{LOG}", f"{NO_CWD}/s/{LOCK}"}


# -- listing ---------------------------------------------------------------------------------


def test_one_bad_session_never_hides_the_others(tmp_path: Path) -> None:
    root = tmp_path / "root"
    stored(root, "good")
    stored(tmp_path / "elsewhere")
    bad = {
        "fifo": NotARegularFileError,
        "link": InvalidSessionIdError,
        "newer": UnsupportedFormatError,
        "torn-header": CorruptLogError,
    }
    for name in ("fifo", "newer", "torn-header"):
        (root / name).mkdir()
    os.mkfifo(root / "fifo" / LOG)
    (root / "newer" / LOG).write_bytes(b'{"format":"kai-session","version":2}\n')
    (root / "torn-header" / LOG).write_bytes(b'{"format":"kai-session"')
    (root / "link").symlink_to(tmp_path / "elsewhere" / "s", target_is_directory=True)
    (root / "no-log-yet").mkdir()
    before = tree(tmp_path)
    backend = JsonlSessionPersistence(root)
    listing = without_hanging(partial(anyio.run, backend.scan_sessions), root / "fifo" / LOG)
    assert [header.id for header in listing.headers] == ["good"]
    assert [(problem.directory, type(problem.error)) for problem in listing.problems] == [
        (root / name, error) for name, error in bad.items()
    ]
    assert [str(problem.error) for problem in listing.problems] == [
        f"{root}/fifo/{LOG} is a FIFO, not a regular file; refusing to open it",
        f"{root}/link is a symbolic link; refusing to follow it out of the root",
        f"{root}/newer/{LOG} was written in session format version 2, newer than version 1 "
        "which this release reads; upgrade kai-session-checkpoint-policy",
        f"corrupt session log {root}/torn-header/{LOG}, line 1: the header line is incomplete",
    ]
    assert anyio.run(backend.list_sessions) == list(listing.headers)
    assert tree(tmp_path) == before
