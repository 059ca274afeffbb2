"""I/O fault injection: the Nth operation of a kind fails, once or for good, for N = 1, 2, ...

As in SQLite's I/O error tests, each kind of operation the file layer performs (open, write,
fsync, directory fsync, truncate, link, mkdir) is failed at its 1st, 2nd, 3rd... occurrence, once
and persistently, until a run completes without reaching that occurrence. Every run uses the
simulated layer, so after it the durable state at every moment and every crash image of its
final state can be recovered and checked. Besides the recovery invariants, each run must be
fail-closed: a boundary whose checkpoint failed never dispatched (no model request, no tool
body), no file is left open once the host closed, and, after a fault that happened once, the
session becomes durable again without a restart.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Final

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_session_checkpoint_policy import Host
from kai_session_checkpoint_policy.persistence import (
    JsonlSessionPersistence,
    OsFiles,
    PersistenceError,
    StoredLog,
)
from kai_session_checkpoint_policy.persistence.jsonl import files as files_module
from kai_session_checkpoint_policy.persistence.jsonl.format import log_name

from ..support import figures
from ..support.crash_child import (
    CRASH_TURN,
    Append,
    Flush,
    MemoryRecorder,
    SessionPlan,
    Step,
    Workload,
    run_workload,
)
from ..support.invariants import Expected, dispatch_problems
from ..support.simfs import (
    FAULT_KINDS,
    STORE,
    CrashImage,
    Explorer,
    FaultKind,
    FaultPlan,
    RecordingOs,
    SimFiles,
    crash_images,
    durable_image_of,
    normalized,
)
from ..support.strategies import workloads

LONG: Final = bool(os.environ.get("KAI_LONG_RELIABILITY"))
EXAMPLES: Final = 150 if LONG else 10
MAX_NTH: Final = 500

FAULT_WORKLOAD: Final = Workload(
    (
        SessionPlan("s0", (CRASH_TURN, Flush(), Flush())),
        SessionPlan(
            "s1",
            (
                Append(2),
                Flush(2),
                (Step(("paying",), (("pay-1", "write"),)), Step(("paid",))),
                Flush(),
                Flush(),
            ),
        ),
    ),
)
"""Two sessions at once: the crash matrix turn, and a short turn with one side effect. Each
ends with two flushes, so that a fault that happens once is followed by more of them."""


@dataclass(frozen=True)
class FaultRun:
    plans: tuple[FaultPlan, ...]
    injected: int
    images: int
    checks: int
    refusals: int
    problems: list[str]


def run_with_faults(
    workload: Workload, plans: tuple[FaultPlan, ...], backend: str, seed: int = 0
) -> FaultRun:
    """Run *workload* under *plans*, then check fail-closed dispatch and every recovery."""
    with tempfile.TemporaryDirectory() as scratch:
        live, recover = Path(scratch) / "live", Path(scratch) / "recover"
        live.mkdir()
        recover.mkdir()
        sim = SimFiles(live, seed=seed, faults=plans, record=True)
        recorder = MemoryRecorder(clock=sim.now)
        run = partial(run_workload, workload, live / STORE, recorder, files=sim)
        closing = anyio.run(run, backend=backend)
        problems = dispatch_problems(recorder.names())
        if sim.open_handles():
            problems.append(f"files left open after the host closed: {sim.open_handles()}")
        explorer = Explorer(recover, recorder)

        async def check_every_moment() -> None:
            for state in reversed(sim.states):
                image = durable_image_of(state)
                how = f"durable after change {state.clock}"
                await explorer.check(image, explorer.expected(state.clock), how)
            last = sim.states[-1]
            for how, image in crash_images(last, seed):
                await explorer.check(image, explorer.expected(last.clock), f"end: {how}")

        anyio.run(check_every_moment)
        problems += explorer.violations
        if sim.injected and not any(plan.persistent for plan in plans):
            # Faults that passed: closing the host drains every session, durably.
            if closing is not None:
                problems.append(f"closing the host failed after a passing fault: {closing!r}")
            final = SimFiles(recover, image=sim.durable_image(), mirror=explorer.mirror)
            for session_id, log in anyio.run(explorer.load_all, final).items():
                events = recorder.events[session_id]
                if not isinstance(log, StoredLog) or log.events != tuple(events):
                    problems.append(f"{session_id}: not every event became durable: {log}")
    return FaultRun(
        plans, sim.injected, explorer.images, explorer.checks, explorer.refusals, problems
    )


def triggers(kind: FaultKind) -> tuple[FaultPlan, ...]:
    """Truncation happens only when a failed append is rolled back: make two of them fail.

    The plans count appends to logs only, so they fail appends however the sessions interleave.
    """
    if kind != "truncate":
        return ()
    name = log_name(FAULT_WORKLOAD.compression)
    return (FaultPlan("write", 1, name=name), FaultPlan("fsync", 2, name=name))


def describe(plans: tuple[FaultPlan, ...]) -> str:
    return " + ".join(map(str, plans))


@pytest.mark.parametrize("persistent", [False, True], ids=["once", "persistent"])
@pytest.mark.parametrize("kind", FAULT_KINDS)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_every_failing_operation_is_fail_closed(
    backend: str, kind: FaultKind, persistent: bool, request: pytest.FixtureRequest
) -> None:
    runs: list[FaultRun] = []
    # A failed sync leaves nothing of its changes on disk (even seed) or some of them (odd).
    seeds = range(4) if LONG else (0, 1) if kind in ("fsync", "fsync_dir") else (0,)
    for seed in seeds:
        for nth in range(1, MAX_NTH + 1):
            plans = (*triggers(kind), FaultPlan(kind, nth, persistent))
            run = run_with_faults(FAULT_WORKLOAD, plans, backend, seed)
            if run.injected <= len(triggers(kind)):
                break  # the workload performs fewer than nth operations of this kind
            runs.append(run)
        else:
            pytest.fail(f"more than {MAX_NTH} {kind} operations")
    problems = [f"{describe(run.plans)}: {problem}" for run in runs for problem in run.problems]
    figures.add(
        request,
        faults_injected=sum(run.injected for run in runs),
        fault_runs=len(runs),
        crash_states_explored=sum(run.images for run in runs),
        recoveries_checked=sum(run.checks for run in runs),
        refused_as_corrupt=sum(run.refusals for run in runs),
        violations=len(problems),
    )
    assert runs, f"the workload performs no {kind} operation"
    assert problems == []


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workload=workloads(),
    kind=st.sampled_from(FAULT_KINDS),
    nth=st.integers(1, 40),
    persistent=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_generated_workloads_are_fail_closed_under_any_fault(
    workload: Workload,
    kind: FaultKind,
    nth: int,
    persistent: bool,
    seed: int,
    request: pytest.FixtureRequest,
) -> None:
    # Two final flushes, so that a fault that happens once is followed by a flush.
    sessions = tuple(
        SessionPlan(plan.session_id, (*plan.actions, Flush(), Flush()))
        for plan in workload.sessions
    )
    plans = (FaultPlan(kind, nth, persistent),)
    run = run_with_faults(Workload(sessions, workload.batch_window), plans, "asyncio", seed)
    figures.add(
        request,
        faults_injected=run.injected,
        fault_runs=1,
        crash_states_explored=run.images,
        recoveries_checked=run.checks,
        refused_as_corrupt=run.refusals,
        violations=len(run.problems),
    )
    assert run.problems == []


class FirstOpenFails(OsFiles):
    """The real file layer, except that the first ``open_append`` fails (``EMFILE``)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def open_append(self, path: Path) -> int:
        if not self.failed:
            self.failed = True
            raise OSError(errno.EMFILE, "Too many open files (injected)", str(path))
        return super().open_append(path)


@pytest.mark.anyio
async def test_a_failed_open_after_the_log_is_created_does_not_wedge_it(tmp_path: Path) -> None:
    """Creating the log made its first batch durable; failing to reopen it must not undo that.

    An ``open`` that fails once (too many open files) right after the log was published used to
    leave the writer believing the log did not exist: every later flush tried to create it
    again and failed with ``FileExistsError``, for as long as the process lived.
    """
    backend = JsonlSessionPersistence(tmp_path, files=FirstOpenFails())
    async with Host([backend]) as host:
        session = host.sessions.create("s")
        for flush in range(3):
            session.append("note", {"flush": flush}, ignorable=True)
            with contextlib.suppress(OSError):  # the failing open may hit any one of them
                await host.sessions.flush(session)
        session.append("note", {"flush": 3}, ignorable=True)
        await host.sessions.flush(session)
    loaded = await JsonlSessionPersistence(tmp_path).load("s")
    assert loaded.events == session.events


class FirstDirectorySyncFails(OsFiles):
    """The real file layer, except that the first directory fsync fails (``EIO``)."""

    def __init__(self) -> None:
        super().__init__()
        self.synced: list[Path] = []

    def fsync_dir(self, path: Path) -> None:
        if not self.synced:
            self.synced.append(path)
            raise OSError(errno.EIO, "Input/output error (injected)", str(path))
        super().fsync_dir(path)
        self.synced.append(path)


@pytest.mark.anyio
async def test_a_directory_whose_creation_was_not_made_durable_is_made_durable_later(
    tmp_path: Path,
) -> None:
    """A failed directory fsync may have dropped the new entry for good (as a failed file
    fsync may drop its pages): the next attempt must create and sync it again, or a power loss
    takes the whole session, acknowledged events included, with it.

    The first attempt used to leave the directory behind; the next saw it, skipped it, and
    never synced its parent again.
    """
    root = tmp_path / "root"
    files = FirstDirectorySyncFails()
    backend = JsonlSessionPersistence(root, files=files)
    async with Host([backend]) as host:
        session = host.sessions.create("s")
        session.append("note", {}, ignorable=True)
        with pytest.raises(OSError, match="injected"):
            await host.sessions.flush(session)
        await host.sessions.flush(session)
    assert files.synced[0] == tmp_path  # the failed sync of the root's new entry
    assert files.synced[1:].count(tmp_path) == 1  # synced again, successfully
    loaded = await JsonlSessionPersistence(root).load("s")
    assert loaded.events == session.events


ONE_SESSION: Final = Workload((SessionPlan("s0", (Append(2), Flush(), CRASH_TURN, Flush())),))


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_the_simulated_layer_fails_like_the_real_one(
    kind: FaultKind, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fault loop runs on the simulated layer; this pins it to the real one: the same
    workload under the same fault makes the same calls, in the same order, through both."""
    for nth in range(1, MAX_NTH + 1):
        plans = (*triggers(kind), FaultPlan(kind, nth))
        real_base, sim_base = tmp_path / f"real-{nth}", tmp_path / f"sim-{nth}"
        real_base.mkdir()
        sim_base.mkdir()
        recording = RecordingOs(real_base, plans)
        monkeypatch.setattr(files_module, "os", recording)
        sim = SimFiles(sim_base, faults=plans)
        for base, files in ((real_base, OsFiles()), (sim_base, sim)):
            run = partial(run_workload, ONE_SESSION, base / STORE, MemoryRecorder(), files=files)
            anyio.run(run)
        assert normalized(sim.trace) == normalized(recording.trace), describe(plans)
        if sim.injected <= len(triggers(kind)):
            break


@functools.cache
def crashed_logs() -> tuple[MemoryRecorder, tuple[tuple[CrashImage, dict[str, Expected]], ...]]:
    """Crash images of one turn whose recovery both cuts a torn tail and closes the turn."""
    with tempfile.TemporaryDirectory() as scratch:
        live, recover = Path(scratch) / "live", Path(scratch) / "recover"
        live.mkdir()
        recover.mkdir()
        sim = SimFiles(live, record=True)
        recorder = MemoryRecorder(clock=sim.now)
        anyio.run(partial(run_workload, ONE_SESSION, live / STORE, recorder, files=sim))
        explorer = Explorer(recover, recorder)
        anyio.run(explorer.explore, sim.states, 0)
    chosen = []
    for image, expected, _, recovered in explorer.recoveries:
        log = recovered.get("s0")
        if log is not None and log.torn_bytes and any(e.type == "tool/result" for e in log.repair):
            chosen.append((image, Explorer.as_written(expected, recovered)))
    return recorder, tuple(chosen if LONG else chosen[:: max(1, len(chosen) // 3)][:3])


@pytest.mark.parametrize("persistent", [False, True], ids=["once", "persistent"])
@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_a_failed_recovery_leaves_a_log_that_recovers_the_same(
    kind: FaultKind, persistent: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Recovery cuts a torn tail (keeping it beside the log) and appends closers: fail each of
    its operations, once or for good. A load that fails must raise, and then a retry in the same
    process, a restart, and a restart after a power loss must all recover the same log that an
    undisturbed recovery gives."""
    recorder, chosen = crashed_logs()
    assert chosen, "the workload must leave torn logs with open tool calls"
    explorer = Explorer(tmp_path, recorder)
    problems: list[str] = []
    runs = injected = 0

    async def attempt(image: CrashImage, expected: dict[str, Expected], plan: FaultPlan) -> int:
        undisturbed = SimFiles(explorer.base, image=image, mirror=explorer.mirror)
        want = (await explorer.load_all(undisturbed))["s0"]
        assert isinstance(want, StoredLog)
        sim = SimFiles(explorer.base, image=image, mirror=explorer.mirror, faults=(plan,))
        backend = JsonlSessionPersistence(explorer.base / STORE, files=sim)
        try:
            got = await backend.load("s0")
        except (OSError, PersistenceError):
            pass
        else:
            if got.events != want.events:
                problems.append(f"{plan}: a load that did not fail gave another log")
        if not sim.injected:
            return 0
        if not persistent:
            again = await backend.load("s0")
            if again.events != want.events:
                problems.append(f"{plan}: retrying in the same process gave another log")
        restarts = {"restart": sim.cache_image(), "power loss": sim.durable_image()}
        for how, crashed in restarts.items():
            await explorer.check(crashed, expected, f"{plan}, {how}", exact={"s0": want})
        return sim.injected

    for image, expected in chosen:
        for nth in range(1, MAX_NTH + 1):
            count = anyio.run(attempt, image, expected, FaultPlan(kind, nth, persistent))
            if not count:
                break
            runs += 1
            injected += count
    problems += explorer.violations
    figures.add(
        request,
        faults_injected=injected,
        fault_runs=runs,
        crash_states_explored=explorer.images,
        recoveries_checked=explorer.checks,
        refused_as_corrupt=explorer.refusals,
        violations=len(problems),
    )
    assert problems == []
