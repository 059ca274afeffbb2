"""``list --needs-attention`` and ``stats``: the sessions that need a person, and a store's size.

Both backends: a directory of JSONL logs, and a PostgreSQL database.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from kai_session_checkpoint_policy import cli
from kai_session_checkpoint_policy.persistence import interrupted_turn_closers, open_store

from .support.persistence_helpers import (
    COMPLETE_TURN,
    T0,
    assistant,
    events,
    find_log,
    log_bytes,
    tool_call,
    write_log,
)

if TYPE_CHECKING:
    from kai_session_checkpoint_policy import JSONObject, SessionEvent

OPEN: list[tuple[str, JSONObject]] = [
    *COMPLETE_TURN,
    ("turn/start", {"turn": 2}),
    ("step/start", {"turn": 2, "step": 1}),
    assistant(2, 1, "call-7"),
    tool_call(2, 1, "call-7"),
]
"""Turn 2 is open, its call's outcome unknown (seqs 6 to 9)."""


def recovered() -> list[SessionEvent]:
    """:data:`OPEN` closed by recovery: ``call-7`` answered ``TOOL_OUTCOME_UNKNOWN``."""
    logged = events(*OPEN)
    return [*logged, *interrupted_turn_closers(logged)]


def answered() -> list[SessionEvent]:
    """:func:`recovered`, then a turn in which the model answered."""
    logged = recovered()
    first = len(logged)
    later = [e.replace(seq=first + e.seq, time=T0 + first + e.seq) for e in events(*COMPLETE_TURN)]
    return [*logged, *later]


@pytest.fixture(params=["jsonl", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store holding four sessions: one closed, one open, one recovered and not answered
    since, and one answered since."""
    url = str(tmp_path) if request.param == "jsonl" else request.getfixturevalue("postgres_dsn")
    logs = {
        "a-closed": events(*COMPLETE_TURN),
        "b-open": events(*OPEN),
        "c-recovered": recovered(),
        "d-answered": answered(),
    }

    async def seed() -> None:
        backend = open_store(url)
        try:
            for session_id, logged in logs.items():
                await backend.write_log(session_id, logged)
        finally:
            await backend.aclose()

    anyio.run(seed)
    return url


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


CREATED = "2023-11-14T22:13:20Z"  # T0


def test_needs_attention_lists_an_open_turn_and_an_unknown_outcome_not_yet_answered(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, "list", store, "--needs-attention")
    assert (status, err) == (0, "")
    assert out == (
        f"b-open\t{CREATED}\tturn 2 is open\n"
        f"c-recovered\t{CREATED}\tunknown outcome of call-7 not yet answered\n"
    )
    status, out, err = run(capsys, "list", store, "--needs-attention", "--json")
    assert (status, err) == (0, "")
    assert [json.loads(line) for line in out.splitlines()] == [
        {
            "id": "b-open",
            "createdAt": T0,
            "version": 0,
            "openTurn": 2,
            "turnOpen": True,
            "unanswered": [],
        },
        {
            "id": "c-recovered",
            "createdAt": T0,
            "version": 0,
            "openTurn": None,
            "turnOpen": False,
            "unanswered": ["call-7"],
        },
    ]


def test_stats_counts_sessions_events_and_bytes_and_names_the_oldest_open_turn(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    everything = {
        "a-closed": events(*COMPLETE_TURN),
        "b-open": events(*OPEN),
        "c-recovered": recovered(),
        "d-answered": answered(),
    }
    count = sum(map(len, everything.values()))
    if store.startswith("postgresql://"):
        size = sum(len(event.encode()) for logged in everything.values() for event in logged)
    else:
        size = sum(find_log(Path(store), s).stat().st_size for s in everything)
    status, out, err = run(capsys, "stats", store)
    assert (status, err) == (0, "")
    assert out == (
        "sessions          4\n"
        f"events            {count}\n"
        f"bytes             {size}\n"
        "open turns        1\n"
        "oldest open turn  turn 2 of session b-open, started 2023-11-14T22:13:20Z\n"
    )
    status, out, err = run(capsys, "stats", store, "--json")
    assert (status, err) == (0, "")
    assert json.loads(out) == {
        "sessions": 4,
        "unreadable": 0,
        "events": count,
        "bytes": size,
        "openTurns": 1,
        "oldestOpenTurn": {"session": "b-open", "turn": 2, "startedAt": T0 + 6},
    }


def test_an_unreadable_session_is_one_line_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_log(tmp_path, "open", log_bytes("open", events(*OPEN)))
    damaged = log_bytes("bad", events(*COMPLETE_TURN)) + b'{"type":"turn/end","seq":9}\n'
    write_log(tmp_path, "bad", damaged)
    path = find_log(tmp_path, "bad")
    problem = f"corrupt session log {path}, line 8: "
    status, out, err = run(capsys, "list", str(tmp_path), "--needs-attention")
    assert status == cli.EXIT_BAD_INPUT
    assert out == f"open\t{CREATED}\tturn 2 is open\n"
    assert err.startswith(f"kai-checkpoint: cannot read session bad: {problem}")
    status, out, err = run(capsys, "stats", str(tmp_path))
    assert status == cli.EXIT_BAD_INPUT
    assert out.splitlines()[:2] == ["sessions          1", "unreadable        1"]
    assert err.startswith(f"kai-checkpoint: cannot count session bad: {problem}")
