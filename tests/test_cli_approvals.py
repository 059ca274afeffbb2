"""``kai-checkpoint agent --ask``: the question on the terminal, killed or stopped there, resumed.

Each test runs the command as a real child process with its standard input and standard error
on pipes: it reads the question from the child's standard error (the handshake: the question is
durable before it is shown) and then kills it (SIGKILL), stops it (SIGINT, as Ctrl-C does), or
answers it. Running the command again on the same session resumes it.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio
import pytest

from kai_session_checkpoint_policy import cli
from kai_session_checkpoint_policy.demo import CALL_ID, PAYMENT, TOOL_NAME
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence

from .support.markers import MARKER_TIMEOUT, kill_at_marker, reap

if TYPE_CHECKING:
    from kai_session_checkpoint_policy import JSONObject

pytestmark = [
    pytest.mark.crash,
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL and SIGINT are POSIX"),
]

SESSION: Final = "asked"
ARGUMENTS: Final = json.dumps(PAYMENT)
QUESTION: Final = f"approval needed: {TOOL_NAME} {ARGUMENTS}\napprove? [y/N] "
FIRST_ASK: Final = f"approval-{CALL_ID}-10"  # asked right after the assistant/message at seq 9
SECOND_CALL: Final = f"{CALL_ID}-2"
PENDING: Final = (
    f"pending approval {FIRST_ASK} (asked before and never answered): {TOOL_NAME} {ARGUMENTS}\n"
)
ASKED_AGAIN: Final = (
    f"approval needed: {TOOL_NAME} {ARGUMENTS}\n"
    f"(asked again: {FIRST_ASK} was never answered)\n"
    "approve? [y/N] "
)
PAID: Final = f"sent 120.00 EUR to ACME Corp for invoice 1042, receipt R-{SECOND_CALL}"


def command(tmp_path: Path, *options: str) -> list[str]:
    root, ledger = tmp_path / "sessions", tmp_path / "ledger.jsonl"
    base = [sys.executable, "-m", "kai_session_checkpoint_policy", "agent", "--ask"]
    return [*base, "--root", str(root), "--session", SESSION, "--ledger", str(ledger), *options]


def start(tmp_path: Path, *options: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command(tmp_path, *options),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def read_until(child: subprocess.Popen[bytes], expected: str) -> str:
    """Read the child's standard error until it holds exactly *expected*; fail on anything
    else, on the child's exit, or after the deadline."""
    assert child.stderr is not None
    deadline = time.monotonic() + MARKER_TIMEOUT
    seen = b""
    with selectors.DefaultSelector() as selector:
        selector.register(child.stderr, selectors.EVENT_READ)
        while seen.decode(errors="replace") != expected:
            assert expected.startswith(seen.decode(errors="replace")), seen
            left = deadline - time.monotonic()
            assert left > 0, f"the child never showed {expected!r}: {seen!r}"
            if selector.select(left):
                chunk = os.read(child.stderr.fileno(), 4096)
                assert chunk, f"the child exited ({child.wait()}) after {seen!r}"
                seen += chunk
    return seen.decode()


def again(tmp_path: Path, answer: bytes) -> subprocess.CompletedProcess[str]:
    """Run the command again on the same session, with *answer* on its standard input."""
    return subprocess.run(
        command(tmp_path), input=answer.decode(), capture_output=True, text=True, check=False
    )


def payments(tmp_path: Path) -> list[str]:
    ledger = tmp_path / "ledger.jsonl"
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    return [json.loads(line)["idempotencyKey"] for line in lines]


def approvals(tmp_path: Path) -> list[tuple[str, JSONObject | str]]:
    """The approval events of the stored log, and each tool result's error code (or ok)."""
    log = anyio.run(JsonlSessionPersistence(tmp_path / "sessions").inspect, SESSION)
    shown: list[tuple[str, JSONObject | str]] = []
    for event in log.events:
        if event.type.startswith("approval/"):
            shown.append((event.type, dict(event.data)))
        elif event.type == "tool/result":
            error = event.data.get("error")
            shown.append((event.type, str(error["code"]) if isinstance(error, dict) else "ok"))
        elif event.type == "turn/end":
            reason = event.data.get("reason")
            shown.append((event.type, str(reason["kind"]) if isinstance(reason, dict) else ""))
    return shown


def asked(question_id: str, call_id: str, **more: str) -> tuple[str, JSONObject]:
    data: JSONObject = {"id": question_id, "toolName": TOOL_NAME, "callId": call_id}
    return "approval/asked", {**data, "arguments": ARGUMENTS, **more}


def decided(question_id: str, outcome: str) -> tuple[str, JSONObject]:
    return "approval/decided", {"id": question_id, "outcome": outcome}


def reasked(question_id: str) -> tuple[str, JSONObject]:
    return asked(
        question_id, SECOND_CALL, reason=f"asked again after a restart (first as {FIRST_ASK})"
    )


def test_sigkill_at_the_question_leaves_it_pending_and_the_next_run_asks_it_again(
    tmp_path: Path,
) -> None:
    child = start(tmp_path)
    try:
        assert read_until(child, QUESTION) == QUESTION
        child.send_signal(signal.SIGKILL)
        assert child.wait(MARKER_TIMEOUT) == -signal.SIGKILL
    finally:
        reap(child)
    assert payments(tmp_path) == []
    assert approvals(tmp_path) == [asked(FIRST_ASK, CALL_ID)]  # durable before it was shown

    resumed = again(tmp_path, b"y\n")

    assert (resumed.returncode, resumed.stderr) == (0, PENDING + ASKED_AGAIN)
    assert resumed.stdout == (
        f'session {SESSION}, turn 2: {{"kind":"completed"}}\n'
        f"assistant: Invoice 1042 is paid: {PAID}.\n"
    )
    assert approvals(tmp_path) == [
        asked(FIRST_ASK, CALL_ID),
        ("tool/result", "TOOL_NOT_STARTED"),  # recovery: the call never started
        ("turn/end", "interrupted"),
        reasked(f"approval-{SECOND_CALL}-24"),  # the resumed turn's message is at seq 23
        decided(f"approval-{SECOND_CALL}-24", "allowed-once"),
        ("tool/result", "ok"),
        ("turn/end", "completed"),
    ]
    assert payments(tmp_path) == [SECOND_CALL]


def test_ctrl_c_at_the_question_records_the_stop_and_a_no_after_it_pays_nothing(
    tmp_path: Path,
) -> None:
    child = start(tmp_path)
    try:
        read_until(child, QUESTION)
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=MARKER_TIMEOUT)
    finally:
        reap(child)
    assert (child.returncode, stdout) == (130, b"")
    assert stderr == b"\nstopped while waiting for an answer: the question stays pending\n"
    stopped = [
        asked(FIRST_ASK, CALL_ID),
        decided(FIRST_ASK, "cancelled"),
        ("tool/result", "ABORTED_BEFORE_DISPATCH"),
        ("turn/end", "aborted"),
    ]
    assert approvals(tmp_path) == stopped

    resumed = again(tmp_path, b"n\n")

    assert (resumed.returncode, resumed.stderr) == (0, PENDING + ASKED_AGAIN)
    assert approvals(tmp_path) == [
        *stopped,
        reasked(f"approval-{SECOND_CALL}-25"),  # one event more: the decision "cancelled"
        decided(f"approval-{SECOND_CALL}-25", "rejected"),
        ("tool/result", "APPROVAL_REJECTED"),
        ("turn/end", "completed"),
    ]
    assert payments(tmp_path) == []


def test_a_yes_made_durable_before_a_sigkill_is_used_once_and_not_asked_again(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "marker"
    marker.write_bytes(b"")
    options = ("--hang-at", "approved", "--marker", str(marker), "--batch-window", "3600")
    child = start(tmp_path, *options)
    try:
        read_until(child, QUESTION)
        assert child.stdin is not None
        child.stdin.write(b"y\n")
        child.stdin.flush()
    finally:
        kill_at_marker(child, marker, "approval-decided")
    yes = [asked(FIRST_ASK, CALL_ID), decided(FIRST_ASK, "allowed-once")]
    assert approvals(tmp_path) == yes  # the yes is on disk; the call had not started
    assert payments(tmp_path) == []

    # Nobody is there to answer (standard input is empty): none is needed.
    resumed = again(tmp_path, b"")

    assert (resumed.returncode, resumed.stderr) == (0, "")
    assert resumed.stdout.endswith(f"assistant: Invoice 1042 is paid: {PAID}.\n")
    assert approvals(tmp_path) == [
        *yes,
        ("tool/result", "TOOL_NOT_STARTED"),
        ("turn/end", "interrupted"),
        ("tool/result", "ok"),
        ("turn/end", "completed"),
    ]
    assert payments(tmp_path) == [SECOND_CALL]


def test_without_an_answer_the_question_stays_pending(tmp_path: Path) -> None:
    first = again(tmp_path, b"")  # standard input ends at once

    assert (first.returncode, first.stderr) == (0, QUESTION + "\n")
    assert approvals(tmp_path) == [
        asked(FIRST_ASK, CALL_ID),
        decided(FIRST_ASK, "unavailable"),
        ("tool/result", "APPROVAL_UNAVAILABLE"),
        ("turn/end", "completed"),
    ]
    assert payments(tmp_path) == []


def test_hang_at_approved_needs_ask(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    arguments = ["agent", "--root", str(tmp_path), "--session", "s", "--hang-at", "approved"]
    status = cli.main([*arguments, "--marker", str(tmp_path / "m")])
    assert (status, capsys.readouterr().err) == (
        2,
        "kai-checkpoint: --hang-at approved goes with --ask\n",
    )
