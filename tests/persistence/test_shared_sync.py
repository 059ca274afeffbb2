"""Several sessions' batches made durable by one ``syncfs``: when it is used, and its failures.

Batches of sessions handed to a worker thread while another write runs are written in one job
(``Gathering``); two or more appends to logs on one filesystem are then made durable with one
``syncfs`` instead of an fsync each. A failed ``syncfs`` says only that a write-back failed
somewhere on the filesystem: each log is then fsynced on its own, and only the batches whose
own fsync fails are undone.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from kai_session_checkpoint_policy import Host
from kai_session_checkpoint_policy.persistence import (
    JsonlSessionPersistence,
    JsonlStatistics,
    OsFiles,
)
from kai_session_checkpoint_policy.persistence.jsonl.files import syncfs_reports_errors

from ..support.gathering import WAIT, gathering_marks
from ..support.persistence_helpers import GatedFiles
from ..support.simfs import STORE, FaultPlan, SimFiles

if TYPE_CHECKING:
    from kai_session_checkpoint_policy.host import Session

pytestmark = pytest.mark.anyio


def shared_sync_here(directory: Path) -> bool:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return OsFiles().filesystem(fd) is not None
    finally:
        os.close(fd)


async def written_session(host: Host, session_id: str) -> Session:
    session = host.sessions.create(session_id)
    session.append("turn/start", {"turn": 1})
    await host.sessions.flush(session)
    session.append("step/start", {"turn": 1, "step": 1})
    return session


async def assert_each_step_stored(backend: JsonlSessionPersistence, sessions: int = 4) -> None:
    """Each of the sessions ``s0``, ``s1``... holds its turn's start, then its step's."""
    for index in range(sessions):
        loaded = await backend.load(f"s{index}")
        assert [event.type for event in loaded.events[:2]] == ["turn/start", "step/start"]


async def flush_three_behind_a_gated_one(
    host: Host, backend: JsonlSessionPersistence, files: GatedFiles | GatedSim
) -> tuple[JsonlStatistics, dict[str, BaseException | None]]:
    """Write four sessions, then flush them: the first one's write waits at the gate until the
    other three are queued behind it. The backend's counters before the flushes, and what each
    flush raised, by session."""
    sessions = [await written_session(host, f"s{index}") for index in range(4)]
    before = backend.statistics()
    outcomes: dict[str, BaseException | None] = {}

    async def flush(session: Session) -> None:
        try:
            await host.sessions.flush(session)
        except Exception as exc:
            outcomes[session.id] = exc
        else:
            outcomes[session.id] = None

    files.gate_next = True
    async with anyio.create_task_group() as group:
        group.start_soon(flush, sessions[0])
        assert await anyio.to_thread.run_sync(files.entered.wait, WAIT)
        until = gathering_marks(backend._gathering).until
        for session in sessions[1:]:
            group.start_soon(flush, session)
        await until(lambda: len(backend._gathering._waiting) == 3, "all three queued behind it")
        files.release.set()
    return before, outcomes


async def test_batches_queued_behind_a_write_are_made_durable_by_one_syncfs(
    tmp_path: Path,
) -> None:
    if not shared_sync_here(tmp_path):
        pytest.skip("the test directory's filesystem has no syncfs to share (not ext4/XFS/btrfs)")
    files = GatedFiles()
    backend = JsonlSessionPersistence(tmp_path, inline_write_limit=0, files=files)
    async with Host([backend]) as host:
        before, outcomes = await flush_three_behind_a_gated_one(host, backend, files)
        after = backend.statistics()
    assert outcomes == {"s0": None, "s1": None, "s2": None, "s3": None}
    assert after.syncfs - before.syncfs == 1
    assert after.fsyncs - before.fsyncs == 1  # the first batch's, alone
    assert after.writes - before.writes == 4
    await assert_each_step_stored(JsonlSessionPersistence(tmp_path))


async def test_with_shared_sync_off_each_log_is_fsynced(tmp_path: Path) -> None:
    backend = JsonlSessionPersistence(tmp_path, inline_write_limit=0, shared_sync=False)
    async with Host([backend]) as host:
        sessions = [await written_session(host, f"s{index}") for index in range(4)]
        before = backend.statistics()
        async with anyio.create_task_group() as group:
            for session in sessions:
                group.start_soon(host.sessions.flush, session)
        after = backend.statistics()
    assert (after.syncfs, after.fsyncs - before.fsyncs) == (0, 4)
    assert not backend._gathering.jobs


class NoSharedSync(GatedFiles):
    """Real files on a filesystem taken for one whose syncfs cannot stand in for fsyncs."""

    def filesystem(self, fd: int) -> int | None:
        return None


async def test_a_filesystem_without_a_trusted_syncfs_has_each_log_fsynced(
    tmp_path: Path,
) -> None:
    files = NoSharedSync()
    backend = JsonlSessionPersistence(tmp_path, inline_write_limit=0, files=files)
    async with Host([backend]) as host:
        before, outcomes = await flush_three_behind_a_gated_one(host, backend, files)
        after = backend.statistics()
    assert outcomes == {"s0": None, "s1": None, "s2": None, "s3": None}
    assert (after.syncfs, after.fsyncs - before.fsyncs) == (0, 4)
    assert backend.shared_sync is False  # later batches go to worker threads of their own
    await assert_each_step_stored(JsonlSessionPersistence(tmp_path))


class SyncfsFailsOnce(GatedFiles):
    """Real files, but the first ``syncfs`` fails as if a write-back failed elsewhere on the
    filesystem: nothing of these logs was lost."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def syncfs(self, fd: int) -> None:
        super().syncfs(fd)
        if not self.failed:
            self.failed = True
            raise OSError(5, "injected syncfs failure")


async def test_a_syncfs_failure_elsewhere_costs_an_fsync_per_log_and_loses_nothing(
    tmp_path: Path,
) -> None:
    if not shared_sync_here(tmp_path):
        pytest.skip("the test directory's filesystem has no syncfs to share (not ext4/XFS/btrfs)")
    files = SyncfsFailsOnce()
    backend = JsonlSessionPersistence(tmp_path, inline_write_limit=0, files=files)
    async with Host([backend]) as host:
        before, outcomes = await flush_three_behind_a_gated_one(host, backend, files)
        after = backend.statistics()
    assert files.failed
    assert outcomes == {"s0": None, "s1": None, "s2": None, "s3": None}
    assert (after.syncfs - before.syncfs, after.fsyncs - before.fsyncs) == (1, 4)
    await assert_each_step_stored(JsonlSessionPersistence(tmp_path))


class GatedSim(GatedFiles, SimFiles):
    """The simulated layer, whose next ``write`` waits at the gate of :class:`GatedFiles`."""


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 5, 7])
async def test_a_failed_syncfs_undoes_the_batches_whose_write_back_failed(
    tmp_path: Path, seed: int
) -> None:
    """A write-back failed during the shared syncfs: with an even seed nothing of the three
    batches reached the disk, with an odd one a part of them did. Each log's own fsync then
    tells: a batch whose write-back failed is undone and its flush raises, the others are
    acknowledged; at a power loss right then, every acknowledged batch is on disk and no other;
    the next flush writes the batches that failed."""
    sim = GatedSim(tmp_path, seed=seed, faults=(FaultPlan("syncfs", 1),))
    backend = JsonlSessionPersistence(tmp_path / STORE, inline_write_limit=0, files=sim)
    async with Host([backend]) as host:
        _, outcomes = await flush_three_behind_a_gated_one(host, backend, sim)
        assert outcomes["s0"] is None
        for session_id in ("s1", "s2", "s3"):
            error = outcomes[session_id]
            if seed % 2 == 0:
                assert isinstance(error, OSError), outcomes
            if error is not None:
                assert isinstance(error, OSError)
                assert "write-back failed" in str(error)
        assert sim.calls["syncfs"] == 1
        power_loss = sim.durable_image()
        for index in range(1, 4):
            session = host.sessions.get(f"s{index}")
            assert session is not None
            await host.sessions.flush(session)  # a failed batch stayed queued: written now
    lost = SimFiles(tmp_path, image=power_loss)  # only what was durable then
    for index in range(4):
        loaded = await JsonlSessionPersistence(tmp_path / STORE, files=lost).load(f"s{index}")
        types = [event.type for event in loaded.events]  # recovery closes the open turn
        assert types[0] == "turn/start"
        acknowledged = outcomes[f"s{index}"] is None
        assert ("step/start" in types) is acknowledged, (index, types, outcomes)
    final = SimFiles(tmp_path, image=sim.durable_image())
    await assert_each_step_stored(JsonlSessionPersistence(tmp_path / STORE, files=final))


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_natively_cancelled_flush_queued_for_a_shared_sync_is_written_then_raises(
    tmp_path: Path,
) -> None:
    files = GatedFiles()
    backend = JsonlSessionPersistence(tmp_path, inline_write_limit=0, files=files)
    async with Host([backend]) as host:
        sessions = [await written_session(host, f"s{index}") for index in range(3)]
        files.gate_next = True
        first = asyncio.ensure_future(host.sessions.flush(sessions[0]))
        assert await anyio.to_thread.run_sync(files.entered.wait, WAIT)
        until = gathering_marks(backend._gathering).until
        queued = [asyncio.ensure_future(host.sessions.flush(s)) for s in sessions[1:]]
        await until(lambda: len(backend._gathering._waiting) == 2, "both queued behind it")
        queued[0].cancel()  # Task.cancel(): passes through anyio's shield
        for _ in range(3):  # scheduler rounds: the cancellation reaches the task
            await anyio.lowlevel.checkpoint()
        assert not queued[0].done()  # waits for the job that takes its batch
        files.release.set()
        with anyio.fail_after(WAIT):  # not a hang if a waiting task left the gathering
            await first
            with pytest.raises(asyncio.CancelledError):
                await queued[0]
            await queued[1]
        assert [backend.durable_count(session.id) for session in sessions] == [2] * 3
    await assert_each_step_stored(JsonlSessionPersistence(tmp_path), sessions=3)


def test_shared_sync_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"shared_sync must be True or False, not 'yes'"):
        JsonlSessionPersistence(tmp_path, shared_sync="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("release", "trusted"),
    [
        ("4.19.0-26-amd64", False),
        ("5.4.0-150-generic", False),
        ("5.7.19", False),
        ("5.8.0", True),
        ("5.15.0-91-generic", True),
        ("6.18.44-custom", True),
        ("10.0.1", True),
        ("unknown", False),
    ],
)
def test_syncfs_is_trusted_from_linux_5_8(release: str, trusted: bool) -> None:
    assert syncfs_reports_errors(release) is trusted


def test_a_tmpfs_has_no_syncfs_to_share() -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm here")
    fd = os.open(shm, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert OsFiles().filesystem(fd) is None
    finally:
        os.close(fd)
