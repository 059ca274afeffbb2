"""A time no log can hold is refused when appended or written, never acknowledged.

A log refuses to be read with an event before 1970, after the year 9999, or at a time that is
not an integer of epoch milliseconds. Were such an event appended and flushed, the turn would
pay and the session could never be loaded, resumed or copied again. So the host refuses it at
``append``, before any checkpoint or tool body sees it, and every backend refuses it in a batch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest

from kai_session_checkpoint_policy import Agent, Host, SessionEvent, invariant, policy
from kai_session_checkpoint_policy.cli import EXIT_FAILURE
from kai_session_checkpoint_policy.demo import (
    MODEL,
    PROMPT,
    PROVIDER,
    ScriptedModel,
    make_payment_tool,
)
from kai_session_checkpoint_policy.events import MAX_TIME
from kai_session_checkpoint_policy.host import SessionError
from kai_session_checkpoint_policy.persistence import (
    EventTimeError,
    JsonlSessionPersistence,
    PostgresSessionPersistence,
    SessionNotFoundError,
)

from ..support import figures

if TYPE_CHECKING:
    from collections.abc import Callable

    from kai_session_checkpoint_policy.persistence import Store

pytestmark = pytest.mark.anyio

NOW: Final = 1_764_640_000_000
CLOCKS: Final[dict[str, Callable[[], object]]] = {
    "the year 10000": lambda: MAX_TIME + 1,
    "before 1970": lambda: -1,
    "microseconds": lambda: NOW * 1000,
    "float milliseconds": lambda: 1.5,
    "seconds as a float": lambda: NOW / 1000,
}


@pytest.fixture(params=["jsonl", "postgres"])
def new_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Store]:
    """Makes a new backend of one store each time it is called."""
    if request.param == "jsonl":
        return lambda: JsonlSessionPersistence(tmp_path / "sessions")
    dsn: str = request.getfixturevalue("postgres_dsn")
    return lambda: PostgresSessionPersistence(dsn)


@pytest.mark.parametrize("clock", sorted(CLOCKS))
async def test_a_turn_with_a_clock_no_log_can_hold_pays_nothing_and_stores_nothing(
    clock: str, new_backend: Callable[[], Store], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    figures.add(request, clock_cases=1, clock_violations=1)  # taken back below if all holds
    ledger = tmp_path / "ledger.jsonl"
    plugins = [new_backend(), policy, invariant]
    async with Host(plugins, clock=CLOCKS[clock]) as host:  # type: ignore[arg-type]
        host.llm.register_adapter(PROVIDER, ScriptedModel())
        host.tools.register(make_payment_tool(ledger=ledger, announce=lambda text: None))
        session = host.sessions.create("clock")
        with pytest.raises(SessionError, match=r"session 'clock', seq 0: the time "):
            await Agent(host, session, provider=PROVIDER, model=MODEL).run_turn(PROMPT)
        assert list(session.events) == []
    assert not ledger.exists()
    reader = new_backend()
    with pytest.raises(SessionNotFoundError):
        await reader.inspect("clock")
    await reader.aclose()
    figures.add(request, clock_violations=-1)


@pytest.mark.parametrize("time", [MAX_TIME + 1, -1, 1.5])
async def test_every_backend_refuses_a_batch_holding_a_time_no_log_can_hold(
    time: object, new_backend: Callable[[], Store], request: pytest.FixtureRequest
) -> None:
    figures.add(request, clock_cases=1, clock_violations=1)  # taken back below if all holds
    backend = new_backend()
    event = SessionEvent("turn/start", 0, time, {"turn": 1})  # type: ignore[arg-type]
    with pytest.raises(EventTimeError, match=r"refusing to write seq 0: the time "):
        await backend.write_log("written", [event])
    assert not backend.session_exists("written")
    await backend.aclose()
    figures.add(request, clock_violations=-1)


@pytest.mark.parametrize("store", ["jsonl", "postgres"])
def test_the_command_line_fails_in_one_line_when_the_clock_jumps_past_the_year_9999(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    script = (
        "import sys, time\n"
        f"time.time_ns = lambda: {(MAX_TIME + 1) * 10**6}\n"
        "from kai_session_checkpoint_policy.cli import main\n"
        "raise SystemExit(main(sys.argv[1:]))\n"
    )
    ledger = tmp_path / "ledger.jsonl"
    root = str(tmp_path / "sessions")
    if store == "postgres":
        root = request.getfixturevalue("postgres_dsn")
    command = ["agent", "--root", root, "--session", "s", "--ledger", str(ledger)]
    done = subprocess.run(
        [sys.executable, "-c", script, *command],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout) == (EXIT_FAILURE, "")
    assert done.stderr == (
        f"kai-checkpoint: session 's', seq 0: the time {MAX_TIME + 1} is outside 0 to "
        f"{MAX_TIME}: before 1970 or after the year 9999 in epoch milliseconds (a clock that "
        "jumped, or in another unit?)\n"
    )
    assert not ledger.exists()
