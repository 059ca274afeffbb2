"""Lost writes: a power loss at any moment, simulated by a file layer that owns the bytes.

SIGKILL cannot lose a write the kernel accepted; a power loss can. Each Hypothesis example runs
a generated workload (agent turns through the real host and policy, concurrent explicit
flushes, direct appends, background batches) on a real event loop, with the JSONL backend
writing through :class:`~.simfs.SimFiles`, which records its state after every change. Every
recorded state is then a crash point: each image a power loss could leave there (unsynced data
dropped, cut short, zero-filled or garbage; unsynced directory entries lost or kept) is written
to a real directory, recovered by a fresh backend, loaded again from what recovery left durable,
and checked. A few recoveries are themselves crashed at every change they make, and recovered
again.
"""

from __future__ import annotations

import itertools
import os
import re
import tempfile
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Final

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_session_checkpoint_policy.persistence import (
    CorruptLogError,
    JsonlSessionPersistence,
    OsFiles,
    SessionNotFoundError,
    StoredLog,
)
from kai_session_checkpoint_policy.persistence import files as files_module

from . import figures
from .crash_child import (
    CRASH_SESSION,
    CRASH_TURN,
    Append,
    Flush,
    MemoryRecorder,
    SessionPlan,
    Step,
    Workload,
    run_workload,
)
from .invariants import Expected, check_recovery
from .simfs import CrashImage, Mirror, SimFiles, SimState, crash_images, materialize
from .strategies import workloads

LONG: Final = bool(os.environ.get("KAI_LONG_RELIABILITY"))
EXAMPLES: Final = 200 if LONG else 12
STORE: Final = "store"
CROSS_CHECK_EVERY: Final = 40


class Explorer:
    """Recovers the crash images of one workload run and checks each; counts what it did.

    Each image is recovered under the same real directory (only the names that differ from the
    previous image are touched there) by a fresh backend on a :class:`SimFiles` holding the
    image; the same layer then loses everything recovery left unsynced, and a second fresh
    backend loads the sessions again: recovery must have been durable and must not change
    anything the second time.
    """

    def __init__(self, base: Path, recorder: MemoryRecorder, *, sectors: bool = False) -> None:
        self.base = base
        self.mirror = Mirror(base)
        self.recorder = recorder
        self.sectors = sectors
        self.seen: set[tuple[tuple[str, bytes | None], ...]] = set()
        self.images = 0
        self.checks = 0
        self.tolerated = 0
        self.violations: list[str] = []
        self.samples: list[tuple[CrashImage, dict[str, StoredLog | None]]] = []
        self.recoveries: list[
            tuple[dict[str, Expected], list[SimState], dict[str, StoredLog | None]]
        ] = []

    def expected(self, clock: int) -> dict[str, Expected]:
        """What a crash after change *clock* of the live run must preserve, by session."""
        recorder = self.recorder
        return {
            session_id: Expected(
                tuple(events),
                recorder.acknowledged_at(session_id, clock),
                recorder.started_at(session_id, clock),
            )
            for session_id, events in recorder.events.items()
        }

    async def _load_all(self, sim: SimFiles) -> dict[str, StoredLog | CorruptLogError | None]:
        backend = JsonlSessionPersistence(self.base / STORE, files=sim)
        loaded: dict[str, StoredLog | CorruptLogError | None] = {}
        for session_id in self.recorder.events:
            try:
                loaded[session_id] = await backend.load(session_id)
            except SessionNotFoundError:
                loaded[session_id] = None
            except CorruptLogError as exc:
                loaded[session_id] = exc
        return loaded

    async def check(
        self,
        image: CrashImage,
        expected: dict[str, Expected],
        how: str,
        *,
        exact: dict[str, StoredLog | None] | None = None,
    ) -> None:
        """Recover every session from *image*, load it again, and check both loads.

        With *exact*, the recovered logs must also equal those (a recovery that was itself
        interrupted must end where an uninterrupted one did).
        """
        key = tuple(sorted(image.items()))
        if key in self.seen:
            return
        self.seen.add(key)
        self.images += 1
        sim = SimFiles(self.base, image=image, mirror=self.mirror, record=True)
        first = await self._load_all(sim)
        states = list(sim.states)
        sim.lose_unsynced()
        second = await self._load_all(sim)
        recovered_logs: dict[str, StoredLog | None] = {}
        for session_id, recovered in first.items():
            self.checks += 1
            where = f"{how}, session {session_id}"
            if isinstance(recovered, CorruptLogError):
                if self.sectors and recovered.line - 2 >= expected[session_id].acknowledged:
                    self.tolerated += 1  # reordered sectors of an unacknowledged batch
                else:
                    self.violations.append(f"{where}: {recovered}")
                continue
            reloaded = second[session_id]
            if isinstance(reloaded, CorruptLogError):
                self.violations.append(f"{where}: the second load failed: {reloaded}")
                continue
            found = check_recovery(recovered, reloaded, expected[session_id])
            wanted = None if exact is None else exact.get(session_id)
            if wanted is not None and recovered is not None and recovered.events != wanted.events:
                found.append("an interrupted recovery ends elsewhere than an uninterrupted one")
            self.violations += [f"{where}: {problem}" for problem in found]
            recovered_logs[session_id] = recovered
        if exact is None and len(states) > 1:
            self.recoveries.append((expected, states, recovered_logs))
        if self.images % CROSS_CHECK_EVERY == 1:
            self.samples.append((image, recovered_logs))

    async def cross_check(self, scratch: Path) -> int:
        """Recover sampled images again on the real file system; the results must agree."""
        for index, (image, simulated) in enumerate(self.samples):
            directory = scratch / f"real-{index}"
            directory.mkdir()
            materialize(image, directory)
            backend = JsonlSessionPersistence(directory / STORE)
            for session_id, expected in simulated.items():
                try:
                    real: StoredLog | None = await backend.load(session_id)
                except SessionNotFoundError:
                    real = None
                if expected is None or real is None:
                    agree = expected is real
                else:
                    agree = (real.events, real.repair) == (expected.events, expected.repair)
                if not agree:
                    self.violations.append(f"real recovery of sample {index} differs: {real}")
        return len(self.samples)

    async def explore(self, states: list[SimState], seed: int) -> None:
        """Check every image of every state, the latest state first (it expects the most)."""
        for state in reversed(states):
            expected = self.expected(state.clock)
            for how, image in crash_images(state, seed, sectors=self.sectors):
                await self.check(image, expected, f"{how}, after change {state.clock}")

    async def explore_recovery(self, count: int, seed: int) -> None:
        """Crash the first *count* recoveries that changed something, after every change.

        Recovery's own closers then count as written: a second recovery may keep any prefix
        of them, and must end with the same log.
        """
        for expected, states, recovered in self.recoveries[:count]:
            as_written = {}
            for session_id, want in expected.items():
                log = recovered.get(session_id)
                events = want.written if log is None else log.events
                as_written[session_id] = Expected(events, want.acknowledged, want.started)
            for state in reversed(states):
                for how, image in crash_images(state, seed):
                    how = f"recovery crashed after change {state.clock}: {how}"
                    await self.check(image, as_written, how, exact=recovered)


def explore(workload: Workload, seed: int, backend: str, *, sectors: bool = False) -> Explorer:
    """Run *workload* on a recording layer, then recover and check every crash image."""
    with tempfile.TemporaryDirectory() as scratch:
        live, recover = Path(scratch) / "live", Path(scratch) / "recover"
        live.mkdir()
        recover.mkdir()
        sim = SimFiles(live, seed=seed, record=True)
        recorder = MemoryRecorder(clock=sim.now)
        run = partial(run_workload, workload, live / STORE, recorder, files=sim)
        assert anyio.run(run, backend=backend) is None
        explorer = Explorer(recover, recorder, sectors=sectors)
        anyio.run(explorer.explore, sim.states, seed)
        anyio.run(explorer.explore_recovery, 2, seed)
        anyio.run(explorer.cross_check, Path(scratch))
    return explorer


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads(), seed=st.integers(0, 2**32 - 1))
def test_a_power_loss_at_any_moment_loses_nothing_acknowledged(
    backend: str, workload: Workload, seed: int, request: pytest.FixtureRequest
) -> None:
    explorer = explore(workload, seed, backend)
    figures.add(
        request,
        crash_states_explored=explorer.images,
        recoveries_checked=explorer.checks,
        violations=len(explorer.violations),
    )
    assert explorer.violations == []


@settings(max_examples=EXAMPLES // 2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads(max_sessions=1), seed=st.integers(0, 2**32 - 1))
def test_reordered_sectors_never_cost_an_acknowledged_event(
    workload: Workload, seed: int, request: pytest.FixtureRequest
) -> None:
    """Sectors of an unsynced write persisted out of order (old, new or garbage each).

    Without per-record checksums a reader cannot always tell such a batch from damage inside
    the committed region: when a complete ``turn/end`` survives after a damaged sector, the
    load refuses the log as corrupt instead of guessing. The refusal must always name a line
    after every acknowledged event; anything else must recover with every invariant.
    """
    explorer = explore(workload, seed, "asyncio", sectors=True)
    figures.add(
        request,
        crash_states_explored=explorer.images,
        recoveries_checked=explorer.checks,
        violations=len(explorer.violations),
    )
    assert explorer.violations == []


# -- the simulated layer against the real one --------------------------------------------------


class RecordingOs:
    """Stands in for :mod:`os` inside the real file layer and notes each call it makes."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.trace: list[tuple[str, str]] = []
        self._paths: dict[int, tuple[str, bool]] = {}

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def _rel(self, path: str | os.PathLike[str]) -> str:
        rel = Path(path).relative_to(self.base).as_posix()
        return "" if rel == "." else rel

    def open(self, path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
        fd = os.open(path, flags, mode)
        rel, directory = self._rel(path), bool(flags & os.O_DIRECTORY)
        self._paths[fd] = (rel, directory)
        if not directory:
            if flags & os.O_EXCL:
                kind = "create"
            elif flags & os.O_CREAT:
                kind = "open-lock"
            elif flags & os.O_APPEND:
                kind = "open-append"
            else:
                kind = "open-read"
            self.trace.append((kind, rel))
        return fd

    def write(self, fd: int, data: bytes) -> int:
        self.trace.append(("write", self._paths[fd][0]))
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        rel, directory = self._paths[fd]
        self.trace.append(("fsync_dir" if directory else "fsync", rel))
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        self.trace.append(("truncate", self._paths[fd][0]))
        os.ftruncate(fd, size)

    def mkdir(self, path: str | os.PathLike[str], mode: int = 0o777) -> None:
        self.trace.append(("mkdir", self._rel(path)))
        os.mkdir(path, mode)

    def link(self, source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        self.trace.append(("link", self._rel(target)))
        os.link(source, target)


def normalized(trace: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Temporary names are random in the real layer; ``unlink`` goes through :mod:`pathlib`."""
    return [
        (kind, re.sub(r"\.[0-9a-f]{12}\.tmp$", ".TMP", path))
        for kind, path in trace
        if kind != "unlink"
    ]


CONFORMANCE: Final = Workload(
    (SessionPlan(CRASH_SESSION, (Append(2), Flush(), CRASH_TURN, Flush(3))),), batch_window=3600
)


def test_the_simulated_layer_makes_the_same_calls_as_the_real_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same workload, same recovery, through both layers: the same calls, the same bytes."""
    real_base, sim_base = tmp_path / "real", tmp_path / "sim"
    real_base.mkdir()
    sim_base.mkdir()
    recording = RecordingOs(real_base)
    monkeypatch.setattr(files_module, "os", recording)
    sim = SimFiles(sim_base)
    for base, files in ((real_base, OsFiles()), (sim_base, sim)):
        clock = itertools.count(1_700_000_000_000).__next__
        recorder = MemoryRecorder()
        run = partial(run_workload, CONFORMANCE, base / STORE, recorder, files=files, clock=clock)
        assert anyio.run(run) is None
    assert normalized(sim.trace) == normalized(recording.trace)
    log = Path(STORE) / CRASH_SESSION / "session.jsonl"
    written = (real_base / log).read_bytes()
    assert sim.durable_image()[log.as_posix()] == written

    # Recovery of the same crashed log, its last line torn: the turn is open again.
    crashed = written[:-20]
    image = {path: data for path, data in sim.durable_image().items() if "tmp" not in path}
    image[log.as_posix()] = crashed
    (real_base / log).write_bytes(crashed)
    recording.trace.clear()
    (tmp_path / "image").mkdir()
    from_image = SimFiles(tmp_path / "image", image=image)
    real = anyio.run(JsonlSessionPersistence(real_base / STORE).load, CRASH_SESSION)
    simulated = anyio.run(
        JsonlSessionPersistence(tmp_path / "image" / STORE, files=from_image).load, CRASH_SESSION
    )
    assert real.repair
    assert simulated == replace(real, path=simulated.path)
    assert normalized(from_image.trace) == normalized(recording.trace)
    assert from_image.durable_image()[log.as_posix()] == (real_base / log).read_bytes()


def test_a_final_batch_with_reordered_sectors_is_refused_not_guessed(tmp_path: Path) -> None:
    """The known limit of a log without checksums, pinned: refused, named, left untouched."""
    sim = SimFiles(tmp_path, record=True)
    recorder = MemoryRecorder(clock=sim.now)
    text = Step(("x" * 400,) * 3)  # a batch of several sectors that ends with turn/end
    workload = Workload((SessionPlan("s0", (Append(1), Flush(), (text,), Flush())),))
    assert anyio.run(partial(run_workload, workload, tmp_path / STORE, recorder, files=sim)) is None
    log = f"{STORE}/s0/session.jsonl"
    last = next(s for s in reversed(sim.states) if s.files[s.names[log]].pending)
    ((_, _, batch),) = last.files[last.names[log]].pending  # the last batch, written, unsynced
    image = {path: data for path, data in sim.durable_image().items() if "tmp" not in path}
    image[log] = last.files[last.names[log]].disk + bytes(512) + batch[512:]
    (tmp_path / "crashed").mkdir()
    materialize(image, tmp_path / "crashed")
    path = tmp_path / "crashed" / log
    with pytest.raises(CorruptLogError, match=r"line \d+: not valid JSON") as refused:
        anyio.run(JsonlSessionPersistence(tmp_path / "crashed" / STORE).load, "s0")
    assert refused.value.path == path
    assert refused.value.line - 2 >= recorder.acknowledged_at("s0", last.clock)
    assert path.read_bytes() == image[log]
