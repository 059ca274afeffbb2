"""``kai-checkpoint``: the demo agent as a real child killed with SIGKILL, and reading logs.

Crash tests run ``python -m kai_session_checkpoint_policy agent --hang-at ...`` as a child
process, wait until the marker file's *content* says the child reached the point, kill it with
SIGKILL from outside, and then recover the session through the command line.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import unicodedata
from typing import TYPE_CHECKING, Any, Final, cast

import anyio
import pytest

from kai_session_checkpoint_policy import TOOL_OUTCOME_UNKNOWN, TextBlock, ToolResult, cli, output
from kai_session_checkpoint_policy.demo import CALL_ID, MARKERS, PAYMENT, TOOL_NAME
from kai_session_checkpoint_policy.effects import idempotency_key
from kai_session_checkpoint_policy.eventdata import tool_result as tool_result_data
from kai_session_checkpoint_policy.output import Console
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence
from kai_session_checkpoint_policy.persistence.ids import encode_session_id
from kai_session_checkpoint_policy.persistence.jsonl.format import compress_frame

from .support.markers import kill_at_marker, reap, start_agent
from .support.persistence_helpers import (
    COMPLETE_TURN,
    events,
    find_log,
    log_bytes,
    stored_events,
    tree,
    write_log,
)

if TYPE_CHECKING:
    from pathlib import Path

    from kai_session_checkpoint_policy import JSONObject, SessionEvent

pytestmark = pytest.mark.skipif(
    sys.platform == "win32", reason="the crash tests need POSIX signals"
)

COMMAND = [sys.executable, "-m", "kai_session_checkpoint_policy"]


def run_cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    """Run ``kai-checkpoint`` in this process; return the status, stdout and stderr."""
    status = cli.main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def json_records(text: str) -> list[dict[str, Any]]:
    """Parse one JSON object per line (``Any``: tests index into it freely)."""
    records = [json.loads(line) for line in text.splitlines()]
    assert all(isinstance(record, dict) for record in records)
    return records


def json_lines(text: str) -> list[dict[str, Any]]:
    """The records of ``--json`` output after its header record: events, torn tail, repair."""
    header, *records = json_records(text)
    assert set(header) == {"header"}
    return records


# -------------------------------------------------------------------------------------------
# The agent, killed from outside
# -------------------------------------------------------------------------------------------


@pytest.mark.crash
def test_sigkill_inside_the_tool_recovers_as_outcome_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    child, marker = start_agent(tmp_path, "killed-in-tool", "tool")
    kill_at_marker(child, marker, MARKERS["tool"])

    ledger = (tmp_path / "ledger.jsonl").read_text().splitlines()
    assert [json.loads(line)["idempotencyKey"] for line in ledger] == [CALL_ID]

    status, out, err = run_cli(capsys, "recover", tmp_path / "sessions", "killed-in-tool", "--json")
    assert (status, err) == (0, "")
    events = json_lines(out)
    assert [event["seq"] for event in events] == list(range(len(events)))
    # Exactly as stored: the envelope, and the surface fields of the three message types.
    surface = {"user/message", "assistant/message", "tool/result"}
    assert all(
        event.keys() == {"type", "seq", "time", "data"}
        or (event["type"] in surface and event.keys() - {"sourceEventSeqs"} >= {"surfaceOp"})
        for event in events
    )
    calls = [event for event in events if event["type"] == "tool/call"]
    assert [call["data"] for call in calls] == [
        {
            "turn": 1,
            "step": 1,
            "callId": CALL_ID,
            "name": TOOL_NAME,
            "arguments": json.dumps(PAYMENT),  # as the scripted model asked
            "effect": "side-effecting",
            "idempotencyKey": idempotency_key("killed-in-tool", CALL_ID),
        }
    ]
    results = [event for event in events if event["type"] == "tool/result"]
    assert len(results) == 1
    (result,) = results
    assert result["data"]["error"] == {
        "name": "ToolOutcomeUnknownError",
        "code": TOOL_OUTCOME_UNKNOWN,
    }
    message = result["data"]["message"]
    assert message["source"] == {"kind": "tool", "callId": CALL_ID}
    (block,) = message["content"]
    assert block["isError"] is True
    assert "First verify whether the change happened" in block["content"][0]["text"]
    assert result["data"]["effect"] == {
        "class": "side-effecting",
        "idempotencyKey": idempotency_key("killed-in-tool", CALL_ID),
    }
    assert [event["type"] for event in events[-3:]] == ["tool/result", "step/end", "turn/end"]
    assert events[-1]["data"] == {"turn": 1, "reason": {"kind": "interrupted"}}
    assert calls[0]["seq"] < result["seq"]
    assert message["id"] == f"interrupted-tool-result-{CALL_ID}-{result['seq']}"
    assert (result["surfaceOp"], result["sourceEventSeqs"]) == ("append", [calls[0]["seq"]])

    # The repair is on disk now: a second recovery adds nothing, and reads the same log.
    status, again, err = run_cli(
        capsys, "recover", tmp_path / "sessions", "killed-in-tool", "--json"
    )
    assert (status, again, err) == (0, out, "")


@pytest.mark.crash
def test_sigkill_inside_the_model_request_keeps_the_whole_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    child, marker = start_agent(tmp_path, "killed-in-request", "request")
    kill_at_marker(child, marker, MARKERS["request"])

    status, out, err = run_cli(
        capsys, "recover", tmp_path / "sessions", "killed-in-request", "--json"
    )
    assert (status, err) == (0, "")
    events = json_lines(out)
    assert [event["type"] for event in events] == [
        "turn/start",
        "step/start",
        "user/message",
        "request/header",
        "request/context",
        "step/end",
        "turn/end",
    ]
    assert [event["seq"] for event in events] == list(range(7))
    assert events[-1]["data"] == {"turn": 1, "reason": {"kind": "interrupted"}}
    assert not (tmp_path / "ledger.jsonl").exists()


@pytest.mark.crash
def test_without_the_policy_the_side_effect_outruns_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Without checkpoints the turn waits in the backend's batch window, here longer than the
    # test: the payment is made, and no log at all says the model asked for it.
    options = ("--batch-window", "3600")
    child, marker = start_agent(tmp_path, "no-policy", "tool", *options, use_policy=False)
    kill_at_marker(child, marker, MARKERS["tool"])

    assert len((tmp_path / "ledger.jsonl").read_text().splitlines()) == 1
    root = tmp_path / "sessions"
    status, out, err = run_cli(capsys, "recover", root, "no-policy", "--json")
    assert (status, out) == (cli.EXIT_BAD_INPUT, "")
    assert err == f"kai-checkpoint: session root {root} does not exist\n"


def test_agent_runs_a_whole_turn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "sessions"
    status, out, err = run_cli(capsys, "agent", "--root", root, "--session", "whole")
    assert (status, err) == (0, "")
    assert 'turn 1: {"kind":"completed"}' in out
    assert f"{TOOL_NAME} moved 120.00 EUR to ACME Corp" in out

    status, out, err = run_cli(capsys, "inspect", root, "whole", "--json")
    assert (status, err) == (0, "")
    events = json_lines(out)
    assert events[-1]["type"] == "turn/end"
    assert events[-1]["data"] == {"turn": 1, "reason": {"kind": "completed"}}
    results = [event for event in events if event["type"] == "tool/result"]
    assert len(results) == 1
    assert "error" not in results[0]["data"]

    status, out, err = run_cli(capsys, "agent", "--root", root, "--session", "whole")
    assert (status, out) == (cli.EXIT_BAD_INPUT, "")
    assert err == f"kai-checkpoint: session whole already exists under {root}\n"


# -------------------------------------------------------------------------------------------
# Reading logs
# -------------------------------------------------------------------------------------------


TORN_FRAME: Final = compress_frame(b'{"type":"tool/result","seq":9,"ti')[:-3]
"""A batch frame whose write was cut short, in its checksum: nothing whole can be salvaged."""


@pytest.fixture(scope="module")
def crashed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root with one complete session and one killed inside the tool, with a torn tail."""
    tmp_path = tmp_path_factory.mktemp("crashed")
    root = tmp_path / "sessions"
    assert cli.main(["agent", "--root", str(root), "--session", "complete"]) == 0
    child, marker = start_agent(tmp_path, "crashed", "tool")
    kill_at_marker(child, marker, MARKERS["tool"])
    with open(find_log(root, "crashed"), "ab") as log:
        log.write(TORN_FRAME)
    for lock in root.glob("*/*/session.lock"):
        lock.unlink()  # so that a reader creating a lock file would show in the digest
    return root


@pytest.mark.crash
@pytest.mark.parametrize(
    "args",
    [
        ("list", "{root}"),
        ("inspect", "{root}", "crashed"),
        ("inspect", "{root}", "crashed", "--json"),
        ("inspect", "{root}", "complete"),
        ("inspect", "{root}", "missing"),
    ],
)
def test_list_and_inspect_change_nothing_on_disk(
    crashed_root: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    before = tree(crashed_root)
    cli.main([arg.format(root=crashed_root) for arg in args])
    capsys.readouterr()
    assert tree(crashed_root) == before


@pytest.mark.crash
def test_list_names_every_session(crashed_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(capsys, "list", crashed_root)
    assert (status, err) == (0, "")
    assert [line.split("\t")[0] for line in out.splitlines()] == ["complete", "crashed"]


@pytest.mark.crash
def test_inspect_marks_the_repair_it_would_add(
    crashed_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run_cli(capsys, "inspect", crashed_root, "crashed")
    assert (status, err) == (0, "")
    assert f"a torn tail of {len(TORN_FRAME)} bytes would be cut off" in out
    stored, marked, repair = out.partition("recovery would add (not on disk")
    assert marked
    assert "tool/call" in stored
    assert "TOOL_OUTCOME_UNKNOWN" not in stored
    repair_lines = repair.splitlines()[1:]
    assert [line.split()[:3] for line in repair_lines] == [
        ["+", "11", "tool/result"],
        ["+", "12", "step/end"],
        ["+", "13", "turn/end"],
    ]
    assert "TOOL_OUTCOME_UNKNOWN" in repair_lines[0]

    status, out, err = run_cli(capsys, "inspect", crashed_root, "crashed", "--json")
    assert (status, err) == (0, "")
    records = json_lines(out)
    stored_events = [record for record in records if "type" in record]
    pending = [record["repair"] for record in records if "repair" in record]
    assert [event["seq"] for event in stored_events] == list(range(11))
    assert {"torn": {"bytes": len(TORN_FRAME), "cut": False}} in records
    assert [event["type"] for event in pending] == [
        "tool/result",
        "step/end",
        "turn/end",
    ]


def test_recover_prints_what_it_added(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "sessions"
    assert cli.main(["agent", "--root", str(root), "--session", "open"]) == 0
    log = find_log(root, "open")
    opened = stored_events(log)[:2]  # turn/start, step/start: an open step
    log.unlink()
    write_log(root, "open", log_bytes("open", opened), compression="zstd")
    capsys.readouterr()

    status, out, err = run_cli(capsys, "recover", root, "open")
    assert (status, err) == (0, "")
    stored, marked, added = out.partition("added by this recovery, now on disk:")
    assert marked
    assert [line.split()[:2] for line in stored.splitlines()[1:]] == [
        ["0", "turn/start"],
        ["1", "step/start"],
    ]
    assert [line.split()[:3] for line in added.splitlines()[1:]] == [
        ["+", "2", "step/end"],
        ["+", "3", "turn/end"],
    ]
    status, out, err = run_cli(capsys, "inspect", root, "open")
    assert "recovery would add nothing" in out


# -------------------------------------------------------------------------------------------
# Bad input
# -------------------------------------------------------------------------------------------


def _write_log(root: Path, session_id: str, lines: list[str]) -> None:
    directory = root / session_id
    directory.mkdir(parents=True)
    (directory / "session.jsonl").write_text("".join(f"{line}\n" for line in lines))


HEADER = '{"format":"kai-session","version":1,"id":"%s","createdAt":1700000000000}'
TURN = [
    '{"type":"turn/start","seq":0,"time":1700000000000,"data":{"turn":1}}',
    '{"type":"turn/end","seq":1,"time":1700000000000,"data":{"turn":1,"reason":{"kind":"completed"}}}',
]


@pytest.fixture
def bad_root(tmp_path: Path) -> Path:
    root = tmp_path / "sessions"
    _write_log(root, "good", [HEADER % "good", *TURN])
    _write_log(root, "corrupt", [HEADER % "corrupt", "{not json", TURN[1]])
    newer = HEADER.replace('"version":1', '"version":2')
    _write_log(root, "newer", [newer % "newer", *TURN])
    (tmp_path / "a-file").write_text("")
    return root


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (("list", "{tmp}/nowhere"), "session root {tmp}/nowhere does not exist"),
        (("list", "{tmp}/a-file"), "session root {tmp}/a-file is not a directory"),
        (("inspect", "{tmp}/nowhere", "good"), "session root {tmp}/nowhere does not exist"),
        (("recover", "{tmp}/nowhere", "good"), "session root {tmp}/nowhere does not exist"),
        (("inspect", "{root}", "absent"), "no session 'absent' under {root}"),
        (("recover", "{root}", "absent", "--json"), "no session 'absent' under {root}"),
        (("inspect", "{root}", ""), "a session id must be a non-empty string"),
        (
            ("inspect", "{root}", "corrupt"),
            "corrupt session log {root}/corrupt/session.jsonl, line 2: not valid JSON",
        ),
        (
            ("recover", "{root}", "corrupt", "--json"),
            "corrupt session log {root}/corrupt/session.jsonl, line 2: not valid JSON",
        ),
        (("inspect", "{root}", "newer"), "session format version 2, newer than version 1"),
        (("recover", "{root}", "newer"), "session format version 2, newer than version 1"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
        (("inspect", "{root}"), "the following arguments are required: SESSION"),
        (("list", "{root}", "\x1b[2J\rx"), r"unrecognized arguments: \x1b[2J\rx (see"),
        (
            ("agent", "--root", "{root}", "--session", "x", "--hang-at", "tool"),
            "--hang-at and --marker go together",
        ),
    ],
)
def test_bad_input_is_one_line_and_status_2(
    bad_root: Path, args: tuple[str, ...], problem: str
) -> None:
    tmp = bad_root.parent
    completed = subprocess.run(
        [*COMMAND, *(arg.format(root=bad_root, tmp=tmp) for arg in args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 2
    assert completed.stdout == ""
    assert "Traceback" not in completed.stderr
    lines = completed.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("kai-checkpoint")
    assert problem.format(root=bad_root, tmp=tmp) in lines[0]


def test_damaged_data_is_named_when_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reading a log checks each event's envelope; its data is checked as it is printed."""
    logged = events(("turn/start", {"turn": 1}), ("plan/mode", {"v": 1}), ("turn/end", {"turn": 1}))
    data = log_bytes("s", logged).replace(b'{"v":1}', b'{"v":1e999}')
    write_log(tmp_path, "s", data)
    for command in ("inspect", "recover"):
        status, out, err = run_cli(capsys, command, tmp_path, "s")
        assert status == 2
        assert "turn/start" in out
        assert err == (
            "kai-checkpoint: the data of the stored 'plan/mode' event (seq 1): 1e999 is not a "
            "finite number\n"
        )
    assert (tmp_path / "_no-cwd" / "s" / "session.jsonl").read_bytes() == data


def test_help_and_module_entry_point() -> None:
    completed = subprocess.run(
        [*COMMAND, "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    for command in ("demo", "agent", "list", "inspect", "recover", "copy"):
        assert command in completed.stdout


# -------------------------------------------------------------------------------------------
# Output
# -------------------------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("tty", "env", "color"),
    [
        (True, {}, True),
        (True, {"NO_COLOR": "1"}, False),
        (True, {"NO_COLOR": ""}, True),
        (True, {"TERM": "dumb"}, False),
        (False, {}, False),
    ],
)
def test_colour_only_on_a_terminal_that_wants_it(
    monkeypatch: pytest.MonkeyPatch, tty: bool, env: dict[str, str], color: bool
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    console = Console.for_stream(_Terminal() if tty else io.StringIO())
    assert console.color is color
    assert ("\033[" in console.bold("x")) is color


@pytest.mark.crash
def test_demo_tells_the_three_parts(tmp_path: Path) -> None:
    started = time.monotonic()
    completed = subprocess.run(
        [*COMMAND, "demo", "--root", str(tmp_path / "sessions")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert (completed.returncode, completed.stderr) == (0, "")
    out = completed.stdout
    assert "\033[" not in out  # not a terminal: no colour
    part_1, _, rest = out.partition("2. The same turn, killed with SIGKILL inside send_payment")
    part_2, _, part_3 = rest.partition("3. The same crash without the checkpoint policy")
    assert "1. A normal turn, with every checkpoint as it happens" in part_1
    for boundary in ("agent_pre_step", "llm_stream", "tools_execute"):
        assert f"({boundary}): seq" in part_1
    assert "The model answered: Invoice 1042 is paid" in part_1
    for part in (part_2, part_3):
        assert "died by SIGKILL" in part
        assert "the ledger holds 1 payment(s)" in part
    assert "TOOL_OUTCOME_UNKNOWN" in part_2
    assert '"isError": true' in part_2
    assert "First verify whether the change happened" in part_2
    assert "TOOL_OUTCOME_UNKNOWN" not in part_3
    assert "The tool call was lost" in part_3 or "happened to write the tool call" in part_3
    assert elapsed < 30

    listed = subprocess.run(
        [*COMMAND, "list", str(tmp_path / "sessions")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    names = [line.split("\t")[0] for line in listed.stdout.splitlines()]
    assert [name.rsplit("-", 1)[0] for name in names][:2] == ["pay-invoice", "crash"]


@pytest.mark.crash
def test_demo_keeps_its_temporary_directory_when_asked_and_says_where(tmp_path: Path) -> None:
    completed = subprocess.run(
        [*COMMAND, "demo", "--keep"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert (completed.returncode, completed.stderr) == (0, "")
    lines = completed.stdout.splitlines()
    assert any(line.endswith("; $ the tool's effect on the world") for line in lines)
    (kept,) = tmp_path.glob("kai-checkpoint-demo-*/sessions")
    assert lines[-1] == f"The sessions stay in {kept}: try 'kai-checkpoint list {kept}'."
    listed = subprocess.run(
        [*COMMAND, "list", str(kept)], capture_output=True, text=True, timeout=60, check=True
    )
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()][:2] == [
        "pay-invoice",
        "crash",
    ]


# -------------------------------------------------------------------------------------------
# Untrusted text in human-readable output
# -------------------------------------------------------------------------------------------

BIDI: Final = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def raw_controls(text: str) -> list[str]:
    """The characters of *text* a terminal would act on, or that UTF-8 cannot encode."""
    return [
        char
        for char in text
        if unicodedata.category(char) in {"Cc", "Cs", "Zl", "Zp"} or char in BIDI
    ]


FORGED: Final = "\n   9  tool/result        [call-1] error TOOL_OUTCOME_UNKNOWN: forged"
HOSTILE: Final = (
    "\x1b[2J\x1b[H"  # clear the screen, cursor home
    "\x1b]0;owned\x07"  # set the window title
    "\r\x1b[1A\x1b[2K"  # back to the start of the line, up one line, erase it
    f"{FORGED}"
    "\x9b2J\x85\u2028\u2029"  # C1 CSI, next line, line and paragraph separators
    "\u202etxt.exe\u2066\u2069"  # a bidi override, isolates
    "\x7f\x00\udcff\ud800"  # DEL, NUL, lone surrogates (low first: not a pair)
)
HOSTILE_ID: Final = "evil\x1b[2J\r\n\u202e\x85\ud800"
PIECES: Final = (
    "\x1b[2J",
    "\x1b]0;owned\x07",
    "\r\x1b[1A",
    FORGED,
    "\x9b2J\x85",
    "\u2028\u2029",
    "\u202e\u2066",
    "\x7f\x00\udcff\ud800",
)


def hostile_log(root: Path, session_id: str = HOSTILE_ID) -> list[SessionEvent]:
    """A session whose id, event types and data carry terminal controls; its turn is open."""
    records: list[tuple[str, JSONObject]] = [
        ("turn/start", {"turn": 1}),
        ("step/start", {"turn": 1, "step": 1}),
        ("user/message", {"role": "user", "content": [{"type": "text", "text": HOSTILE}]}),
    ]
    for index, piece in enumerate(PIECES):
        call_id = f"call-{index}{piece}"
        records += [
            ("assistant/chunk", {"chunk": {"type": "text-delta", "text": piece}}),
            (
                "assistant/chunk",
                {"chunk": {"type": "tool-call", "name": piece, "arguments": piece}},
            ),
            (
                "assistant/message",
                {"message": {"content": [{"type": "tool-call", "id": call_id, "name": piece}]}},
            ),
            (
                "tool/call",
                {"turn": 1, "step": 1, "callId": call_id, "name": piece, "arguments": ""},
            ),
            (
                "tool/result",
                cast(
                    "JSONObject",
                    tool_result_data(1, 1, call_id, ToolResult((TextBlock(piece),), is_error=True)),
                ),
            ),
            (f"note{piece}", {"note": piece}),
        ]
    asked: JSONObject = {
        "message": {"content": [{"type": "tool-call", "id": HOSTILE, "name": "w"}]}
    }
    records.append(("assistant/message", asked))
    records.append(("tool/call", {"turn": 1, "step": 1, "callId": HOSTILE, "name": "w"}))
    logged = [  # events of other types than the format's, as a reader may skip them
        event.replace(ignorable=event.type.startswith("note")) for event in events(*records)
    ]
    write_log(root, session_id, log_bytes(session_id, logged))
    return logged


def check_printable(out: str, separator: str = "") -> list[str]:
    """Check that *out* holds no raw control character but *separator*; return its lines."""
    assert (
        raw_controls(
            out.replace("\n", "").replace(separator, "") if separator else out.replace("\n", "")
        )
        == []
    )
    assert out.endswith("\n")
    lines = out.split("\n")[:-1]
    assert out.splitlines() == lines
    return lines


def test_inspect_escapes_every_control_character(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logged = hostile_log(tmp_path)
    status, out, err = run_cli(capsys, "inspect", tmp_path, HOSTILE_ID)
    assert (status, err) == (0, "")
    lines = check_printable(out)
    escaped_id = r"evil\x1b[2J\r\n\u202e\x85\ud800"
    assert lines[0].startswith(f"session {escaped_id}  created 2023-11-14T22:13:20Z")
    seqs = [int(match[1]) for line in lines if (match := re.match(r"[ +] *(\d+)  ", line))]
    repair = len(anyio.run(JsonlSessionPersistence(tmp_path).inspect, HOSTILE_ID).repair)
    assert seqs == list(range(len(logged) + repair))  # one line per event: none forged
    assert len(lines) == 1 + len(seqs) + 1  # and the note that marks the repair
    for shown in (r"\x1b[2J", r"\x1b]0;owned\x07", r"\r\x1b[1A", r"\n   9  tool/result"):
        assert shown in out
    for shown in (r"\x9b2J\x85", r"\u202e\u2066", r"\x7f\x00\udcff\ud800", r"\u2028\u2029"):
        assert shown in out
    assert r"note\x1b]0;owned\x07" in out  # an event type
    repaired = [line.split()[2] for line in lines if line.startswith("+")]
    assert repaired == ["tool/result", "step/end", "turn/end"]  # the forged one is no line


def test_recover_escapes_every_control_character(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logged = hostile_log(tmp_path)
    status, out, err = run_cli(capsys, "recover", tmp_path, HOSTILE_ID)
    assert (status, err) == (0, "")
    lines = check_printable(out)
    added = [line for line in lines if line.startswith("+")]
    assert [line.split()[:2] for line in added] == [
        ["+", str(len(logged))],
        ["+", str(len(logged) + 1)],
        ["+", str(len(logged) + 2)],
    ]
    assert r"[\x1b[2J\x1b[H\x1b]0;owned\x07\r\x1b[1A" in added[0]  # the call id it answers


def test_colour_stays_and_nothing_else_reaches_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    hostile_log(tmp_path)
    log = anyio.run(JsonlSessionPersistence(tmp_path).inspect, HOSTILE_ID)
    terminal = _Terminal()
    output.print_log(log, added_on_disk=False, stream=terminal, view=output.LogView())
    out = terminal.getvalue()
    codes = re.findall(r"\x1b\[(\d+)m", out)
    assert set(codes) == {"0", "1", "2", "33"}  # bold, dim, the repair's colour, reset
    assert out.count("\x1b") == len(codes)
    check_printable(re.sub(r"\x1b\[\d+m", "", out))


def test_list_prints_one_line_per_session_whatever_its_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = {
        "two\nlines": r"two\nlines",
        "tab\there": r"tab\there",
        "\rcarriage": r"\rcarriage",
        "\x1b[2Jclear": r"\x1b[2Jclear",
        "\x9b\x85c1": r"\x9b\x85c1",
        "\u202erevo\u2066": r"\u202erevo\u2066",
        "\u2028sep": r"\u2028sep",
        "\ud800lone": r"\ud800lone",
    }
    for session_id in shown:
        write_log(tmp_path, session_id, log_bytes(session_id, events(*COMPLETE_TURN)))
    status, out, err = run_cli(capsys, "list", tmp_path)
    assert (status, err) == (0, "")
    lines = check_printable(out, separator="\t")
    assert lines == [
        f"{shown[session_id]}\t2023-11-14T22:13:20Z\t_no-cwd/{escaped}/session.jsonl"
        for session_id in sorted(shown)
        if (escaped := encode_session_id(session_id))
    ]


def test_agent_escapes_the_session_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(capsys, "agent", "--root", tmp_path, "--session", "\x1b[2J\nx")
    assert (status, err) == (0, "")
    assert 'session \\x1b[2J\\nx, turn 1: {"kind":"completed"}\n' in out
    check_printable(out)


def test_error_messages_escape_what_they_quote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root\x1b[2J\n"
    root.mkdir()
    status, out, err = run_cli(capsys, "inspect", root, "\x1b]0;x\x07")
    assert (status, out) == (cli.EXIT_BAD_INPUT, "")
    assert err == f"kai-checkpoint: no session '\\x1b]0;x\\x07' under {tmp_path}/root\\x1b[2J\\n\n"


def test_json_output_is_ascii_and_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logged = hostile_log(tmp_path)
    status, out, err = run_cli(capsys, "inspect", tmp_path, HOSTILE_ID, "--json")
    assert (status, err) == (0, "")
    assert out.isascii()
    assert raw_controls(out.replace("\n", "")) == []
    records = json_lines(out)
    assert [(r["type"], r["seq"], r["time"], r["data"]) for r in records[: len(logged)]] == [
        (event.type, event.seq, event.time, event.data) for event in logged
    ]


STRICT_UTF8: Final = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}


def test_surrogates_and_invalid_utf8_never_fail_a_strict_utf8_output(tmp_path: Path) -> None:
    hostile_log(tmp_path)
    hostile_log(tmp_path, "plain")  # an id the command line can carry
    write_log(tmp_path, "\udcff", log_bytes("\udcff", events(*COMPLETE_TURN)))
    raw_name = os.fsencode(tmp_path) + b"/_no-cwd/\xfd"  # a directory name that is not UTF-8
    os.mkdir(raw_name)
    with open(raw_name + b"/session.jsonl", "wb") as log:
        log.write(b"not a header\n")
    runs = {
        args: subprocess.run(
            [*COMMAND, *args],
            capture_output=True,
            env=STRICT_UTF8,
            timeout=60,
            check=False,
        )
        for args in (("list", str(tmp_path)), ("inspect", str(tmp_path), "plain"))
    }
    listed = runs["list", str(tmp_path)]
    assert listed.returncode == cli.EXIT_BAD_INPUT
    assert listed.stdout.decode("utf-8").splitlines() == [
        f"{name}\t2023-11-14T22:13:20Z\t_no-cwd/{directory}/session.jsonl"
        for name, directory in (
            (r"evil\x1b[2J\r\n\u202e\x85\ud800", encode_session_id(HOSTILE_ID)),
            ("plain", "plain"),
            (r"\udcff", "~DCFF"),
        )
    ]
    assert listed.stderr.decode("utf-8") == (
        f"kai-checkpoint: cannot list {tmp_path}/_no-cwd/\\udcfd: corrupt session log "
        f"{tmp_path}/_no-cwd/\\udcfd/session.jsonl, line 1: the header line is not valid JSON\n"
    )
    inspected = runs["inspect", str(tmp_path), "plain"]
    assert (inspected.returncode, inspected.stderr) == (0, b"")
    text = inspected.stdout.decode("utf-8")
    assert r"\udcff\ud800" in text
    check_printable(text)


# -------------------------------------------------------------------------------------------
# Listing a root with bad sessions, files that are not regular files, closed pipes
# -------------------------------------------------------------------------------------------


def run_child(*args: str | Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``kai-checkpoint`` as a child process (killed after a minute, so nothing hangs)."""
    completed = subprocess.run(
        [*COMMAND, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    return completed.returncode, completed.stdout, completed.stderr


@pytest.fixture
def mixed_root(tmp_path: Path) -> Path:
    """Two intact sessions, four bad ones, and entries of the root that are no sessions."""
    root = tmp_path / "sessions"
    for session_id in ("b", "a"):
        write_log(root, session_id, log_bytes(session_id, events(*COMPLETE_TURN)))
    write_log(root, "torn-header", b'{"type":"sess')
    newer = log_bytes("newer", events(*COMPLETE_TURN)).replace(b'"version":0', b'"version":1')
    write_log(root, "newer", newer)
    (root / "_no-cwd" / "fifo").mkdir()
    os.mkfifo(root / "_no-cwd" / "fifo" / "session.jsonl")
    write_log(tmp_path, "elsewhere", log_bytes("link", events(*COMPLETE_TURN)))
    (root / "_no-cwd" / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (root / "_no-cwd" / "never-published").mkdir()  # a writer died before the log existed
    (root / "README").write_text("not a session\n")
    return root


def test_list_shows_the_intact_sessions_and_names_each_bad_one(mixed_root: Path) -> None:
    root = mixed_root
    status, out, err = run_child("list", root)
    assert status == cli.EXIT_BAD_INPUT
    assert out.splitlines() == [
        f"{name}\t2023-11-14T22:13:20Z\t_no-cwd/{name}/session.jsonl" for name in ("a", "b")
    ]
    here = root / "_no-cwd"
    assert err.splitlines() == [
        f"kai-checkpoint: cannot list {here}/fifo: {here}/fifo/session.jsonl is a FIFO, "
        "not a regular file; refusing to open it",
        f"kai-checkpoint: cannot list {here}/link: {here}/link is a symbolic link; refusing to "
        "follow it out of the root",
        f"kai-checkpoint: cannot list {here}/newer: {here}/newer/session.jsonl was written in "
        "session format version 1, newer than version 0 which this release reads; upgrade "
        "kai-session-checkpoint-policy",
        f"kai-checkpoint: cannot list {here}/torn-header: corrupt session log "
        f"{here}/torn-header/session.jsonl, line 1: the header line is incomplete",
    ]


def torn_log(root: Path) -> tuple[Path, int]:
    """A session ``s`` its writer left with a torn tail; its log and the committed size."""
    data = log_bytes("s", events(*COMPLETE_TURN))
    path = write_log(root, "s", data + b'{"type":"turn/start","se')
    path.with_name("session.lock").write_bytes(b"")
    return path, len(data)


@pytest.mark.parametrize(
    ("command", "fifo"),
    [
        (("inspect", "{root}", "s"), "session.jsonl"),
        (("recover", "{root}", "s"), "session.jsonl"),
        (("agent", "--root", "{root}", "--session", "s"), "session.jsonl"),
        (("list", "{root}"), "session.jsonl"),
        (("recover", "{root}", "s"), "session.jsonl.torn-{committed}"),
        (("recover", "{root}", "s"), "session.lock"),
    ],
)
def test_a_fifo_is_refused_naming_it_and_nothing_hangs(
    tmp_path: Path, command: tuple[str, ...], fifo: str
) -> None:
    path, committed = torn_log(tmp_path)
    fifo_path = path.with_name(fifo.format(committed=committed))
    fifo_path.unlink(missing_ok=True)
    os.mkfifo(fifo_path)
    before = tree(tmp_path)
    status, out, err = run_child(*(arg.format(root=tmp_path) for arg in command))
    problem = f"{fifo_path} is a FIFO, not a regular file; refusing to open it"
    if command[0] == "list":
        problem = f"cannot list {fifo_path.parent}: {problem}"
    assert (status, out, err) == (cli.EXIT_BAD_INPUT, "", f"kai-checkpoint: {problem}\n")
    assert tree(tmp_path) == before


def test_a_closed_pipe_ends_the_output_quietly(tmp_path: Path) -> None:
    chunk: JSONObject = {"chunk": {"type": "text-delta", "text": "x" * 40}}
    chunks = [("assistant/chunk", chunk)] * 20_000
    write_log(tmp_path, "long", log_bytes("long", events(*chunks)))  # far more than a pipe holds
    for options in ((), ("--json",)):
        child = subprocess.Popen(
            [*COMMAND, "inspect", str(tmp_path), "long", *options],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert child.stdout is not None
        assert child.stderr is not None
        try:
            first = child.stdout.readline()
            child.stdout.close()  # as 'head -1' does once it has its line
            errors = child.stderr.read()
            assert child.wait(60) == cli.EXIT_BROKEN_PIPE == 141
        finally:
            reap(child)
        assert first.startswith(b'{"header":{' if options else b"session long ")
        assert errors == b""


def test_ctrl_c_stops_a_long_output_at_once(tmp_path: Path) -> None:
    chunk: JSONObject = {"chunk": {"type": "text-delta", "text": "x" * 40}}
    chunks = [("assistant/chunk", chunk)] * 200_000
    # Far more than a pipe holds: the output blocks until it is read, and takes a while then.
    write_log(tmp_path, "long", log_bytes("long", events(*chunks)))
    for options in ((), ("--json",)):
        child = subprocess.Popen(
            [*COMMAND, "inspect", str(tmp_path), "long", *options],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert child.stdout is not None
        assert child.stderr is not None
        try:
            first = child.stdout.readline()  # the output has started, and fills the pipe
            child.send_signal(signal.SIGINT)
            rest = child.stdout.read()
            errors = child.stderr.read()
            assert child.wait(60) == 130
        finally:
            reap(child)
        assert first
        assert (first + rest).count(b"\n") < 200_000 // 2  # stopped, not written to the end
        assert errors == b""


def _limit_file_size() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write beyond it fails with EFBIG


def test_a_session_another_process_writes_is_one_line_and_status_2(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    (root / "_no-cwd" / "busy").mkdir(parents=True)
    lock = os.open(root / "_no-cwd" / "busy" / "session.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ledger = tmp_path / "ledger.jsonl"
        command = [*COMMAND, "agent", "--root", str(root), "--session", "busy"]
        completed = subprocess.run(
            [*command, "--ledger", str(ledger)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(lock)
    assert (completed.returncode, completed.stdout) == (cli.EXIT_FAILURE, "")
    assert completed.stderr == (
        f"kai-checkpoint: session 'busy' is being written by another process "
        f"(it holds {root / '_no-cwd' / 'busy' / 'session.lock'})\n"
    )
    assert not ledger.exists()  # the checkpoint failed closed: no payment


def test_a_write_the_system_refuses_is_one_line_and_status_1(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    command = [*COMMAND, "agent", "--root", str(tmp_path / "sessions"), "--session", "s"]
    completed = subprocess.run(
        [*command, "--ledger", str(ledger)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=_limit_file_size,
    )
    assert (completed.returncode, completed.stdout) == (1, "")
    assert completed.stderr == "kai-checkpoint: [Errno 27] File too large\n"
    assert not ledger.exists()
