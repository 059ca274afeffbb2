"""Hosts as separate processes sharing one PostgreSQL database, and the command line on it.

The hosts are ``kai-checkpoint agent`` children: one is killed with SIGKILL inside its payment
tool and another recovers the session once the lease has expired; one is stopped with SIGSTOP
past its lease while another takes the session over, and continued. Children are synchronized
with marker files; waiting for a lease to expire polls the database's clock.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeAlias

import pytest

pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg")

import psycopg

from kai_session_checkpoint_policy import TOOL_OUTCOME_UNKNOWN, SessionEvent, cli
from kai_session_checkpoint_policy.demo import CALL_ID, MARKERS
from kai_session_checkpoint_policy.persistence.jsonl.format import read_header
from kai_session_checkpoint_policy.persistence.postgres.store import PostgresSessionStore

from ..support.markers import MARKER_TIMEOUT, kill_at_marker, reap, start_agent, wait_for_marker
from ..support.persistence_helpers import (
    assistant,
    events,
    find_log,
    stored_events,
    tool_call,
)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

Admin: TypeAlias = "psycopg.Connection[tuple[Any, ...]]"
WAIT = 10.0


@pytest.fixture
def admin(postgres_dsn: str) -> Any:
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        yield connection


def run_cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    status = cli.main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def json_lines(text: str) -> list[dict[str, Any]]:
    """The events of ``--json`` output: every record but the header (and a torn tail)."""
    records = [json.loads(line) for line in text.splitlines()]
    assert "header" in records[0]
    return [record for record in records[1:] if "torn" not in record]


def encoded(logged: Sequence[SessionEvent]) -> list[str]:
    return [event.encode() for event in logged]


def lease(admin: Admin, session_id: str) -> tuple[str, int, Any]:
    """The owner, epoch and expiry of the session's lease."""
    row = admin.execute(
        "SELECT owner, epoch, expires_at FROM kai_sessions.leases WHERE session_id = %s",
        (session_id,),
    ).fetchone()
    assert row is not None, f"no lease on {session_id!r}"
    return row[0], row[1], row[2]


def wait_until_expired(admin: Admin, session_id: str) -> None:
    """Poll the database's clock until the session's lease has expired (bounded)."""
    deadline = time.monotonic() + WAIT
    query = (
        "SELECT 1 FROM kai_sessions.leases "
        "WHERE session_id = %s AND expires_at <= clock_timestamp()"
    )
    while not admin.execute(query, (session_id,)).fetchall():
        assert time.monotonic() < deadline, f"the lease on {session_id!r} never expired"
        admin.execute("SELECT pg_sleep(0.01)")


# -- hosts in separate processes --------------------------------------------------------------


@pytest.mark.crash
def test_a_host_killed_inside_its_tool_is_recovered_by_another_once_its_lease_expired(
    tmp_path: Path, postgres_dsn: str, admin: Admin, capsys: pytest.CaptureFixture[str]
) -> None:
    child, marker = start_agent(tmp_path, "killed", "tool", "--lease-ttl", "2", root=postgres_dsn)
    kill_at_marker(child, marker, MARKERS["tool"])
    owner, epoch, _ = lease(admin, "killed")

    # The dead host's lease still holds: another host is refused.
    status, out, err = run_cli(capsys, "recover", postgres_dsn, "killed", "--json")
    assert (status, out) == (cli.EXIT_FAILURE, "")
    assert re.fullmatch(
        rf"kai-checkpoint: session 'killed' is held by '{re.escape(owner)}' \(lease epoch 1\), "
        r"whose lease expires at \S+ by the database's clock unless renewed\n",
        err,
    )
    wait_until_expired(admin, "killed")

    status, out, err = run_cli(capsys, "recover", postgres_dsn, "killed", "--json")

    assert (status, err) == (0, "")
    recovered = json_lines(out)
    assert [item["seq"] for item in recovered] == list(range(len(recovered)))
    (call,) = [item for item in recovered if item["type"] == "tool/call"]
    (result,) = [item for item in recovered if item["type"] == "tool/result"]
    assert call["data"]["callId"] == result["data"]["message"]["source"]["callId"] == CALL_ID
    assert result["data"]["error"]["code"] == TOOL_OUTCOME_UNKNOWN
    assert [item["type"] for item in recovered[-3:]] == ["tool/result", "step/end", "turn/end"]
    assert lease(admin, "killed")[:2] != (owner, epoch)  # taken over, with a new epoch
    ledger = (tmp_path / "ledger.jsonl").read_text().splitlines()
    assert [json.loads(line)["idempotencyKey"] for line in ledger] == [CALL_ID]
    status, again, _ = run_cli(capsys, "recover", postgres_dsn, "killed", "--json")
    assert (status, again) == (0, out)  # the repair is stored: nothing more to add


@pytest.mark.crash
def test_a_zombie_past_its_lease_fails_its_next_flush_and_leaves_nothing_after_the_takeover(
    tmp_path: Path, postgres_dsn: str, admin: Admin, capsys: pytest.CaptureFixture[str]
) -> None:
    # The agent stops inside the model request (after its checkpoint); the model then asks
    # for the payment, whose checkpoint comes next.
    options = ("--lease-ttl", "1", "--hang-for", "2")
    child, marker = start_agent(tmp_path, "zombie", "request", *options, root=postgres_dsn)
    try:
        wait_for_marker(child, marker, MARKERS["request"])
        child.send_signal(signal.SIGSTOP)  # a paused process is not a live owner
        owner, _, _ = lease(admin, "zombie")
        wait_until_expired(admin, "zombie")
        status, out, err = run_cli(capsys, "recover", postgres_dsn, "zombie", "--json")
        assert (status, err) == (0, "")
        recovered = json_lines(out)
        assert [item["type"] for item in recovered[-2:]] == ["step/end", "turn/end"]
        taker, epoch, _ = lease(admin, "zombie")
        assert (taker != owner, epoch) == (True, 2)

        child.send_signal(signal.SIGCONT)
        assert child.wait(MARKER_TIMEOUT) == cli.EXIT_FAILURE
        assert child.stderr is not None
        errors = child.stderr.read().decode().splitlines()
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
        reap(child)
    assert re.fullmatch(
        rf"kai-checkpoint: the lease of '{re.escape(owner)}' \(epoch 1\) on session 'zombie' "
        rf"was taken over by '{re.escape(taker)}' \(epoch 2\); "
        r"(cannot renew it|refusing to write)",
        errors[-1],
    )
    assert not (tmp_path / "ledger.jsonl").exists()  # the payment's body never ran
    status, after, _ = run_cli(capsys, "inspect", postgres_dsn, "zombie", "--json")
    assert (status, after) == (0, out)  # nothing of the zombie after the takeover


# -- the command line on a PostgreSQL store ----------------------------------------------------


def seed(dsn: str, session_id: str, logged: list[Any]) -> None:
    with PostgresSessionStore(dsn) as store:
        held = store.acquire(session_id, "crashed-host", 60)
        store.append(held, 0, logged)
        store.release(held)


def test_list_inspect_and_recover_take_a_postgres_uri(
    postgres_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run_cli(capsys, "list", postgres_dsn)
    assert (status, err) == (0, "")
    assert out.startswith("no sessions under postgresql:///")
    logged = events(
        ("turn/start", {"turn": 1}),
        ("step/start", {"turn": 1, "step": 1}),
        assistant(1, 1, "c1"),
        tool_call(1, 1, "c1"),
    )
    seed(postgres_dsn, "crashed", logged)

    status, out, err = run_cli(capsys, "list", postgres_dsn)
    assert (status, err, out.split("\t")[0]) == (0, "", "crashed")
    status, out, err = run_cli(capsys, "inspect", postgres_dsn, "crashed")
    assert (status, err) == (0, "")
    assert "schema 'kai_sessions', session 'crashed'" in out.splitlines()[0]
    assert "recovery would add (not on disk; run 'recover' to write it):" in out
    status, out, err = run_cli(capsys, "recover", postgres_dsn, "crashed", "--json")
    assert (status, err) == (0, "")
    assert [item["type"] for item in json_lines(out)[4:]] == [
        "tool/result",
        "step/end",
        "turn/end",
    ]
    status, out, err = run_cli(capsys, "inspect", postgres_dsn, "missing")
    assert (status, out) == (cli.EXIT_BAD_INPUT, "")
    assert err.startswith("kai-checkpoint: no session 'missing' in the PostgreSQL session store")


def test_copy_moves_sessions_between_stores_and_refuses_one_the_target_has(
    tmp_path: Path, postgres_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source, back = tmp_path / "source", tmp_path / "back"
    for session_id in ("a", "b"):
        assert cli.main(["agent", "--root", str(source), "--session", session_id]) == 0
    capsys.readouterr()

    status, out, err = run_cli(capsys, "copy", source, postgres_dsn)
    assert (status, err) == (0, "")
    assert out == "copied session a: 21 events\ncopied session b: 21 events\n"
    status, out, err = run_cli(capsys, "copy", postgres_dsn, back, "--session", "b")
    assert (status, err, out) == (0, "", "copied session b: 21 events\n")
    # JSONL to PostgreSQL and back: the same header and the same events, encoded alike.
    copied, original = find_log(back, "b"), find_log(source, "b")
    assert read_header(copied.read_bytes(), copied) == read_header(original.read_bytes(), original)
    assert encoded(stored_events(copied)) == encoded(stored_events(original))

    status, out, err = run_cli(capsys, "copy", postgres_dsn, back)
    assert (status, out) == (cli.EXIT_BAD_INPUT, "copied session a: 21 events\n")
    assert err == f"kai-checkpoint: not copying session b: {back} already has it\n"
    status, out, err = run_cli(capsys, "copy", source, postgres_dsn, "--session", "a")
    assert (status, out) == (cli.EXIT_BAD_INPUT, "")
    assert err == f"kai-checkpoint: not copying session a: {postgres_dsn} already has it\n"


@pytest.mark.crash
def test_the_demo_tells_its_story_on_a_postgres_store(
    postgres_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    command = [sys.executable, "-m", "kai_session_checkpoint_policy", "demo"]
    completed = subprocess.run(
        [*command, "--root", postgres_dsn], capture_output=True, text=True, timeout=120
    )

    assert (completed.returncode, completed.stderr) == (0, "")
    out = completed.stdout
    assert f"sessions in {postgres_dsn}" in out.splitlines()[0]
    _, _, recovered = out.partition("2. The same turn, killed with SIGKILL inside send_payment")
    assert "the killed agent's lease lasts 1 s" in recovered
    assert "error TOOL_OUTCOME_UNKNOWN" in recovered
    status, listed, _ = run_cli(capsys, "list", postgres_dsn)
    assert status == 0
    # (The session without the policy is listed too if a background batch beat the kill.)
    assert [line.split("\t")[0].rsplit("-", 1)[0] for line in listed.splitlines()][:2] == [
        "pay-invoice",
        "crash",
    ]
