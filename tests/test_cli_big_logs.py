"""The command line on big logs: a summary, filters, JSON records, buffered output, progress."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from kai_session_checkpoint_policy import JsonlSessionPersistence, JSONObject, cli, output
from kai_session_checkpoint_policy.events import SessionEvent, StoredEvents
from kai_session_checkpoint_policy.persistence.jsonl.format import (
    compress_frame,
    encode_events,
    encode_header,
)
from kai_session_checkpoint_policy.persistence.values import SessionHeader

from .support.persistence_helpers import (
    COMPLETE_TURN,
    T0,
    events,
    find_log,
    log_bytes,
    log_path,
    write_log,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

COMMAND = [sys.executable, "-m", "kai_session_checkpoint_policy"]

CHUNK: JSONObject = {"turn": 2, "step": 1, "chunk": {"type": "text-delta"}}
OPEN_TURN: list[tuple[str, JSONObject]] = [
    ("turn/start", {"turn": 2}),
    ("step/start", {"turn": 2, "step": 1}),
    *[("assistant/chunk", CHUNK)] * 3,
]


@pytest.fixture
def two_turns(tmp_path: Path) -> Path:
    """A closed turn of six events, then an open one of five, then a torn fragment."""
    body = log_bytes("s", events(*COMPLETE_TURN, *OPEN_TURN)) + b'{"type":"assis'
    write_log(tmp_path, "s", body)
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    status = cli.main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return status, out, err


def test_a_summary_counts_types_and_turns_and_names_the_repair(
    two_turns: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, "inspect", two_turns, "s", "--summary")
    assert (status, err) == (0, "")
    assert out.splitlines()[1:] == [
        "11 events in 2 turns",
        "          3  assistant/chunk",
        "          2  step/start",
        "          2  turn/start",
        "          1  assistant/message",
        "          1  step/end",
        "          1  turn/end",
        "          1  user/message",
        "turn 2 is open (5 events)",
        "a torn tail of 14 bytes would be cut off",
        "recovery would add: step/end, turn/end",
    ]


def test_tail_and_turn_choose_the_events_shown(
    two_turns: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def seqs(*options: str) -> list[int]:
        status, out, _err = run(capsys, "inspect", two_turns, "s", "--json", *options)
        assert status == 0
        return [record["seq"] for record in records(out) if "type" in record]

    assert seqs("--tail", "2") == [9, 10]
    assert seqs("--turn", "1") == [0, 1, 2, 3, 4, 5]
    assert seqs("--turn", "2", "--tail", "3") == [8, 9, 10]
    assert seqs("--tail", "0") == []
    status, out, _err = run(capsys, "inspect", two_turns, "s", "--tail", "1")
    assert status == 0
    assert "(10 of 11 events not shown)" in out
    assert "  10  assistant/chunk" in out


def records(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def test_json_has_the_header_and_the_torn_tail_as_records_no_reader_takes_for_events(
    two_turns: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _err = run(capsys, "inspect", two_turns, "s", "--json")
    assert status == 0
    header, *rest = records(out)
    stored_header = find_log(two_turns, "s").read_bytes().split(b"\n", 1)[0]
    assert header == {"header": json.loads(stored_header)}
    events_only = [record for record in rest if "type" in record]
    assert [record["seq"] for record in events_only] == list(range(11))
    assert rest[11:] == [
        {"torn": {"bytes": 14, "cut": False}},
        {
            "repair": {
                "type": "step/end",
                "seq": 11,
                "time": rest[10]["time"],
                "data": {"turn": 2, "step": 1},
            }
        },
        {
            "repair": {
                "type": "turn/end",
                "seq": 12,
                "time": rest[10]["time"],
                "data": {"turn": 2, "reason": {"kind": "interrupted"}},
            }
        },
    ]
    status, out, _err = run(capsys, "recover", two_turns, "s", "--json")
    assert status == 0
    header, *rest = records(out)
    assert [record.get("type") for record in rest][-3:] == [None, "step/end", "turn/end"]
    assert rest[-3] == {"torn": {"bytes": 14, "cut": True}}


def test_list_in_json(two_turns: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_log(two_turns, "t", log_bytes("t", events(*COMPLETE_TURN)))
    status, out, err = run(capsys, "list", two_turns, "--json")
    assert (status, err) == (0, "")
    assert records(out) == [
        {"id": "s", "createdAt": 1_700_000_000_000, "version": 0},
        {"id": "t", "createdAt": 1_700_000_000_000, "version": 0},
    ]


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def test_a_long_listing_is_written_without_a_flush_per_line(tmp_path: Path) -> None:
    chunk: JSONObject = {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "text": "x"}}
    write_log(tmp_path, "long", log_bytes("long", events(*[("assistant/chunk", chunk)] * 5000)))
    log = anyio.run(JsonlSessionPersistence(tmp_path).inspect, "long")
    stream = CountingStream()
    output.print_log(log, added_on_disk=False, stream=stream, view=output.LogView())
    assert stream.getvalue().count("\n") == 5002  # the header, the events, the closing note
    assert stream.flushes == 0  # the stream's own buffering decides; stdout writes in blocks


def read_all(fd: int) -> bytes:
    chunks = []
    while select.select([fd], [], [], 10)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the other side closed: EIO on Linux
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_progress_appears_on_a_terminal_and_is_erased(two_turns: Path) -> None:
    parent, child_side = pty.openpty()
    environment = {**os.environ, cli.PROGRESS_DELAY_ENV: "0"}
    with subprocess.Popen(
        [*COMMAND, "inspect", str(two_turns), "s", "--summary"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=child_side,
        env=environment,
    ) as child:
        os.close(child_side)
        terminal = read_all(parent)
        out = child.stdout.read() if child.stdout else b""
        assert child.wait(30) == 0
    os.close(parent)
    assert terminal.startswith(b"\r\x1b[Kkai-checkpoint: reading s... 0 s")
    assert terminal.endswith(b"\r\x1b[K")  # nothing of it stays on the screen
    assert b"11 events in 2 turns" in out


def on_a_terminal(*args: str | Path) -> bytes:
    """What the command writes to a terminal that is both its standard output and error."""
    parent, child_side = pty.openpty()
    environment = {**os.environ, cli.PROGRESS_DELAY_ENV: "0"}
    with subprocess.Popen(
        [*COMMAND, *map(str, args)],
        stdin=subprocess.DEVNULL,
        stdout=child_side,
        stderr=child_side,
        env=environment,
    ) as child:
        os.close(child_side)
        terminal = read_all(parent)
        assert child.wait(30) == 0
    os.close(parent)
    return terminal.replace(b"\r\n", b"\n")


def test_progress_on_the_terminal_of_the_output_stops_where_the_output_starts(
    two_turns: Path,
) -> None:
    terminal = on_a_terminal("inspect", two_turns, "s", "--summary")
    progress, erased, output = terminal.rpartition(b"\r\x1b[K")
    assert progress.startswith(b"\r\x1b[Kkai-checkpoint: reading s... 0 s")
    assert erased
    assert output.startswith(b"\x1b[1msession s\x1b[0m")
    assert b"kai-checkpoint:" not in output
    assert b"11 events in 2 turns\n" in output
    # JSON written as it is read is its own progress: no line over it.
    terminal = on_a_terminal("inspect", two_turns, "s", "--json")
    assert b"\x1b[K" not in terminal
    assert terminal.startswith(b'{"header":')


def test_no_progress_when_standard_error_is_not_a_terminal(two_turns: Path) -> None:
    environment = {**os.environ, cli.PROGRESS_DELAY_ENV: "0"}
    completed = subprocess.run(
        [*COMMAND, "inspect", str(two_turns), "s", "--summary"],
        capture_output=True,
        env=environment,
        timeout=60,
        check=True,
    )
    assert completed.stderr == b""


@pytest.mark.parametrize(
    ("ending", "expected"),
    [
        ("closed", "every turn is closed"),
        ("open", "turn 2 is open (2 events)"),
        ("recovered", "every turn is closed"),
        ("empty", "every turn is closed"),
    ],
)
def test_a_summary_tells_an_open_turn_from_a_closed_one_in_every_end_state(
    ending: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logged = {
        "closed": events(*COMPLETE_TURN),
        "open": events(*COMPLETE_TURN, *OPEN_TURN[:2]),
        "recovered": events(*COMPLETE_TURN, *OPEN_TURN[:2]),
        "empty": [],
    }[ending]
    write_log(tmp_path, "s", log_bytes("s", logged))
    if ending == "recovered":
        assert run(capsys, "recover", tmp_path, "s")[0] == 0
    status, out, err = run(capsys, "inspect", tmp_path, "s", "--summary")
    assert (status, err) == (0, "")
    assert expected in out.splitlines()


def test_a_turn_the_log_does_not_hold_is_named_as_missing(
    two_turns: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for turn in ("3", "9"):
        status, out, err = run(capsys, "inspect", two_turns, "s", "--turn", turn, "--json")
        assert (status, out) == (cli.EXIT_BAD_INPUT, "")
        assert err == f"kai-checkpoint: session s has no turn {turn}: it holds turns 1 to 2\n"


def made(stored: Sequence[SessionEvent]) -> int:
    """How many events of a stored log have been made objects (kept in the log)."""
    assert isinstance(stored, StoredEvents)
    return sum(type(item) is SessionEvent for item in stored._items)


TEXT: JSONObject = {"turn": 2, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "x"}}
PACKED_TURNS: list[tuple[str, JSONObject]] = [
    *COMPLETE_TURN,
    ("turn/start", {"turn": 2}),
    ("step/start", {"turn": 2, "step": 1}),
    *[("assistant/chunk", TEXT)] * 40,  # packed into one row
    ("step/end", {"turn": 2, "step": 1}),
    ("turn/end", {"turn": 2, "reason": {"kind": "completed"}}),
    ("turn/start", {"turn": 3}),
    ("step/start", {"turn": 3, "step": 1}),
]


@pytest.fixture
def packed(tmp_path: Path) -> Path:
    """Three turns, the second streaming 40 chunks packed into one row, the third open."""
    path = log_path(tmp_path, "p", "zstd")
    path.parent.mkdir(parents=True)
    header = compress_frame(encode_header(SessionHeader("p", T0)))
    logged = encode_events(events(*PACKED_TURNS), pack=True, compression="zstd")
    path.write_bytes(header + logged)
    return tmp_path


@pytest.mark.parametrize(
    "view",
    [
        output.LogView(),
        output.LogView(as_json=True),
        output.LogView(summary=True),
        output.LogView(tail=5),
        output.LogView(turn=2),
        output.LogView(turn=3),
        output.LogView(as_json=True, turn=2, tail=3),
        output.LogView(tail=0),
    ],
    ids=["all", "json", "summary", "tail", "turn", "open-turn", "json-turn-tail", "tail-0"],
)
@pytest.mark.parametrize("recovered", [False, True], ids=["inspected", "recovered"])
def test_printing_a_log_keeps_none_of_the_events_it_makes(
    packed: Path, view: output.LogView, recovered: bool
) -> None:
    backend = JsonlSessionPersistence(packed)
    log = anyio.run(backend.load if recovered else backend.inspect, "p")
    assert len(log.repair) == 2
    before = made(log.events)  # those with more envelope fields, and the repair if written
    assert before < 10
    printed = io.StringIO()
    output.print_log(log, added_on_disk=recovered, stream=printed, view=view)
    assert made(log.events) == before  # every other event was made, printed and let go
    # The same output as from a list of the same events, each made once and kept.
    listed = io.StringIO()
    output.print_log(
        replace(log, events=list(log.events)), added_on_disk=recovered, stream=listed, view=view
    )
    assert printed.getvalue() == listed.getvalue()


def test_the_events_printed_are_those_of_the_turn_then_the_tail(
    packed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def seqs(*options: str) -> list[int]:
        status, out, _err = run(capsys, "inspect", packed, "p", "--json", *options)
        assert status == 0
        return [record["seq"] for record in records(out) if "type" in record]

    assert seqs("--turn", "2") == list(range(6, 50))
    assert seqs("--turn", "2", "--tail", "3") == [47, 48, 49]
    assert seqs("--turn", "3") == [50, 51]
    assert seqs("--tail", "4") == [48, 49, 50, 51]
    assert seqs() == list(range(52))


def test_json_of_a_whole_log_is_written_as_it_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The events before damage are out before the damage is found (and reported)."""
    intact = events(*COMPLETE_TURN)
    damaged = intact[-1].replace(seq=3)  # a complete record, out of order: damage
    write_log(tmp_path, "s", log_bytes("s", [*intact, damaged]))
    status, out, err = run(capsys, "inspect", tmp_path, "s", "--json")
    assert status == cli.EXIT_BAD_INPUT
    assert [record.get("seq") for record in records(out)] == [None, 0, 1, 2, 3, 4, 5]
    path = find_log(tmp_path, "s")
    assert (
        err == f"kai-checkpoint: corrupt session log {path}, line 8: seq 3 where 6 was expected\n"
    )


def test_json_of_a_log_with_older_records_prints_them_converted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Events are written as they are read only up to the first older record, which the whole
    read converts: the output is the converted log, as without streaming."""
    first = events(*COMPLETE_TURN)
    older = [
        SessionEvent("turn/start", 6, first[-1].time + 1, {"turn": 2}, None, None),
        SessionEvent(
            "user/message",
            7,
            first[-1].time + 2,
            {"content": [{"type": "text", "text": "hi"}], "source": {"kind": "prompt"}},
            None,
            "append",
        ),
        SessionEvent(
            "turn/end", 8, first[-1].time + 3, {"turn": 2, "reason": {"kind": "completed"}}
        ),
    ]
    write_log(tmp_path, "s", log_bytes("s", [*first, *older]))
    status, out, _err = run(capsys, "inspect", tmp_path, "s", "--json")
    assert status == 0
    printed = [record for record in records(out) if "type" in record and "seq" in record]
    assert [record["seq"] for record in printed] == list(range(9))
    assert printed[7]["data"] == {
        "content": [{"type": "text", "text": "hi"}],
        "source": {"kind": "prompt"},
        "id": "legacy-message:s:7",
        "role": "user",
    }
    log = anyio.run(JsonlSessionPersistence(tmp_path).inspect, "s")
    assert printed == [json.loads(item.encode()) for item in log.events]
