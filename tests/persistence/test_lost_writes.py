"""Lost writes: a power loss at any moment, simulated by a file layer that owns the bytes.

SIGKILL cannot lose a write the kernel accepted; a power loss can. Each Hypothesis example runs
a generated workload (agent turns through the real host and policy, concurrent explicit
flushes, direct appends, background batches) on a real event loop, with the JSONL backend
writing through :class:`~.simfs.SimFiles`, which records its state after every change. Every
recorded state is then a crash point: each image a power loss could leave there (unsynced data
dropped, cut short, zero-filled or garbage; unsynced directory entries lost or kept) is
recovered by a fresh backend, loaded again from what recovery left durable, and checked (see
:class:`~.simfs.Explorer`). A few recoveries are themselves crashed at every change they make,
and recovered again; sampled images are recovered on the real file system as well.

The simulated layer is pinned to the real one: the same workload and the same recovery make the
same calls through both and leave the same bytes.
"""

from __future__ import annotations

import itertools
import os
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
)
from kai_session_checkpoint_policy.persistence.jsonl import files as files_module
from kai_session_checkpoint_policy.persistence.jsonl.format import Compression, log_name

from ..support import figures
from ..support.crash_child import (
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
from ..support.simfs import STORE, RecordingOs, SimFiles, explore, materialize, normalized
from ..support.strategies import workloads

LONG: Final = bool(os.environ.get("KAI_LONG_RELIABILITY"))
EXAMPLES: Final = 200 if LONG else 8


@pytest.mark.parametrize("compression", ["zstd", "none"])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads(), seed=st.integers(0, 2**32 - 1))
def test_a_power_loss_at_any_moment_loses_nothing_acknowledged(
    backend: str,
    compression: Compression,
    workload: Workload,
    seed: int,
    request: pytest.FixtureRequest,
) -> None:
    workload = replace(workload, compression=compression)
    explorer = explore(workload, seed, backend, recoveries=8 if LONG else 2)
    figures.add(
        request,
        crash_states_explored=explorer.images,
        recoveries_checked=explorer.checks,
        refused_as_corrupt=explorer.refusals,
        violations=len(explorer.violations),
    )
    assert explorer.violations == []


@pytest.mark.parametrize("compression", ["zstd", "none"])
@settings(max_examples=EXAMPLES // 2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads(max_sessions=1), seed=st.integers(0, 2**32 - 1))
def test_reordered_sectors_never_cost_an_acknowledged_event(
    compression: Compression, workload: Workload, seed: int, request: pytest.FixtureRequest
) -> None:
    """Sectors of an unsynced write persisted out of order (old, new or garbage each).

    Plain, a reader cannot always tell such a batch from damage inside the committed region:
    when a complete record survives after a damaged sector, the load refuses the log as corrupt
    instead of guessing. The refusal must name an event after every acknowledged one, every
    event before it must be the event written there, and the log must be left as it was;
    anything else must recover with every invariant. Compressed, each batch is one frame with
    a checksum: a frame that such a write left whole, but wrong, fails its checksum, and is
    refused on the same terms rather than cut (a whole frame that fails its checksum may as
    well be an acknowledged batch damaged since), while an incomplete one is cut.
    """
    workload = replace(workload, compression=compression)
    explorer = explore(workload, seed, "asyncio", sectors=True)
    figures.add(
        request,
        crash_states_explored=explorer.images,
        recoveries_checked=explorer.checks,
        refused_as_corrupt=explorer.refusals,
        violations=len(explorer.violations),
    )
    assert explorer.violations == []


# -- the simulated layer against the real one --------------------------------------------------


CONFORMANCE: Final = Workload(
    (SessionPlan(CRASH_SESSION, (Append(2), Flush(), CRASH_TURN, Flush(3))),), batch_window=3600
)


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_the_simulated_layer_makes_the_same_calls_as_the_real_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compression: Compression
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
        workload = replace(CONFORMANCE, compression=compression)
        run = partial(run_workload, workload, base / STORE, recorder, files=files, clock=clock)
        assert anyio.run(run) is None
    assert normalized(sim.trace) == normalized(recording.trace)
    log = Path(STORE) / "_no-cwd" / CRASH_SESSION / log_name(compression)
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
    assert simulated == replace(real, location=simulated.location)
    assert normalized(from_image.trace) == normalized(recording.trace)
    assert from_image.durable_image()[log.as_posix()] == (real_base / log).read_bytes()


def test_a_final_batch_with_reordered_sectors_is_refused_not_guessed(tmp_path: Path) -> None:
    """The known limit of a log without checksums, pinned: refused, named, left untouched."""
    sim = SimFiles(tmp_path, record=True)
    recorder = MemoryRecorder(clock=sim.now)
    text = Step(("x" * 400,) * 3)  # a batch of several sectors that ends with turn/end
    plan = SessionPlan("s0", (Append(1), Flush(), (text,), Flush()))
    workload = Workload((plan,), compression="none")
    assert anyio.run(partial(run_workload, workload, tmp_path / STORE, recorder, files=sim)) is None
    log = f"{STORE}/_no-cwd/s0/session.jsonl"
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
    assert refused.value.seq is not None
    assert refused.value.seq >= recorder.acknowledged_at("s0", last.clock)
    assert path.read_bytes() == image[log]
