"""One worker job for the items of every task that asks while the last job runs."""

from __future__ import annotations

import asyncio
import threading

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from kai_session_checkpoint_policy.persistence.workers import GATHERING_ROUNDS, Gathering

pytestmark = pytest.mark.anyio

WAIT = 10.0


class Jobs:
    """What a gathering's jobs did: the items of each, in turn, and the thread that ran it.
    The first job waits at a gate until the test opens it; the job numbered *failing* fails."""

    def __init__(self, failing: int = 0) -> None:
        self.items: list[list[str]] = []
        self.threads: list[threading.Thread] = []
        self.started = threading.Event()
        self.gate = threading.Event()
        self.failing = failing
        self.seen: list[bool] = []  # filled by tests that look at a task from the job

    def run(self, items: list[str]) -> None:
        self.items.append(items)
        self.threads.append(threading.current_thread())
        if len(self.items) == 1:
            self.started.set()
            assert self.gate.wait(WAIT), "the test never opened the gate"
        if len(self.items) == self.failing:
            raise OSError(5, f"job {self.failing} failed")


async def first_job_started(gathering: Gathering[str], jobs: Jobs) -> None:
    """Wait until the first job, in its worker thread, holds the gate."""
    assert await anyio.to_thread.run_sync(jobs.started.wait, WAIT)
    assert gathering.busy


async def until_waiting(gathering: Gathering[str], count: int) -> None:
    """Let the scheduler run until *count* items wait behind the job in flight."""
    while len(gathering._waiting) < count:
        await anyio.lowlevel.checkpoint()


async def test_items_submitted_while_a_job_runs_share_the_next_job() -> None:
    jobs = Jobs()
    gathering: Gathering[str] = Gathering(jobs.run)
    submitted: list[str] = []

    async def submit(item: str) -> None:
        submitted.append(item)  # in the same step as the submit: its order
        await gathering.submit(item)

    async with anyio.create_task_group() as group:
        group.start_soon(submit, "a")
        await first_job_started(gathering, jobs)
        for item in "bcd":
            group.start_soon(submit, item)  # (trio starts them in an order of its own)
        await until_waiting(gathering, 3)
        jobs.gate.set()

    assert jobs.items == [["a"], submitted[1:]]
    assert sorted(submitted) == ["a", "b", "c", "d"]
    assert gathering.jobs == 2
    assert not gathering.busy
    assert threading.current_thread() not in jobs.threads
    await gathering.submit("e")  # nothing in flight: a job of its own at once
    assert jobs.items[-1] == ["e"]


async def test_a_failed_job_fails_every_item_it_took_and_no_other() -> None:
    jobs = Jobs(failing=2)
    gathering: Gathering[str] = Gathering(jobs.run)
    outcomes: dict[str, BaseException | None] = {}

    async def submit(item: str) -> None:
        try:
            await gathering.submit(item)
        except OSError as exc:
            outcomes[item] = exc
        else:
            outcomes[item] = None

    async with anyio.create_task_group() as group:
        group.start_soon(submit, "a")
        await first_job_started(gathering, jobs)
        for item in "bcd":
            group.start_soon(submit, item)
        await until_waiting(gathering, 3)
        jobs.gate.set()

    assert outcomes["a"] is None
    errors = [outcomes[item] for item in "bcd"]
    assert all(isinstance(error, OSError) for error in errors)
    assert [str(error) for error in errors] == ["[Errno 5] job 2 failed"] * 3
    # The task that ran the second job raises its error; each other one an exception of
    # its own, caused by it.
    (raised,) = [error for error in errors if error is not None and error.__cause__ is None]
    others = [error for error in errors if error is not raised]
    assert len(others) == 2
    assert all(error is not None and error.__cause__ is raised for error in others)
    assert not gathering.busy
    await gathering.submit("e")  # the next job is not failed by the last one's error


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_natively_cancelled_task_waits_for_its_item_then_raises() -> None:
    jobs = Jobs()
    gathering: Gathering[str] = Gathering(jobs.run)
    first = asyncio.ensure_future(gathering.submit("a"))
    await first_job_started(gathering, jobs)
    leader = asyncio.ensure_future(gathering.submit("b"))  # will run the next job
    follower = asyncio.ensure_future(gathering.submit("c"))
    await until_waiting(gathering, 2)
    leader.cancel()
    follower.cancel()
    for _ in range(3):
        await anyio.lowlevel.checkpoint()
    assert not leader.done()  # each waits for the job that takes its item
    assert not follower.done()

    def watch(items: list[str]) -> None:
        jobs.seen.append(leader.done() or follower.done())  # still waiting while it runs
        jobs.run(items)

    gathering._run = watch
    jobs.gate.set()
    await first
    for task in (leader, follower):
        with pytest.raises(asyncio.CancelledError):
            await task

    assert jobs.items == [["a"], ["b", "c"]]  # the cancelled leader ran the next job first
    assert jobs.seen == [False]
    assert not gathering.busy


async def test_tasks_ready_with_the_first_one_join_its_job_on_asyncio(
    anyio_backend_name: str,
) -> None:
    """Tasks woken together (by the job before, most often) reach their submit a round or two
    apart. On asyncio the first one lets the others run before its job starts, so that one job
    takes every item; trio does not tell whether tasks of its batch are still to run, so there
    the first one's job starts at once, and the others share the next."""
    jobs = Jobs()
    jobs.gate.set()
    gathering: Gathering[str] = Gathering(jobs.run)

    async def submit(item: str) -> None:
        await anyio.lowlevel.checkpoint()  # a round, as a flush lets one pass before it writes
        await gathering.submit(item)

    async with anyio.create_task_group() as group:
        for item in "abcde":
            group.start_soon(submit, item)

    assert sorted(item for items in jobs.items for item in items) == list("abcde")
    if anyio_backend_name == "asyncio":
        assert jobs.items == [list("abcde")]
    else:
        assert [len(items) for items in jobs.items] == [1, 4]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_loop_that_stays_busy_delays_a_job_a_few_rounds_at_most() -> None:
    jobs = Jobs()
    jobs.gate.set()
    gathering: Gathering[str] = Gathering(jobs.run)
    rounds = 0
    handed_off: int | None = None  # the round in which the job went to its thread
    done = False

    async def spin() -> None:  # always ready to run again
        nonlocal rounds, handed_off
        while not done:
            rounds += 1
            await anyio.lowlevel.checkpoint()
            if gathering.jobs and handed_off is None:
                handed_off = rounds

    async with anyio.create_task_group() as group:
        group.start_soon(spin)
        await anyio.lowlevel.checkpoint()
        before = rounds
        with anyio.fail_after(WAIT):  # a leader waiting for an idle loop would wait forever
            await gathering.submit("a")
        done = True
    assert jobs.items == [["a"]]
    assert handed_off is not None
    assert handed_off - before == GATHERING_ROUNDS  # then the job starts, the loop still busy


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_leader_cancelled_natively_while_others_run_first_runs_its_job_then_raises() -> (
    None
):
    jobs = Jobs()
    jobs.gate.set()
    gathering: Gathering[str] = Gathering(jobs.run)
    done = False

    async def spin() -> None:  # keeps the loop busy: the leader lets rounds pass
        while not done:
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as group:
        group.start_soon(spin)
        leader = asyncio.ensure_future(gathering.submit("a"))
        await anyio.lowlevel.checkpoint()  # the leader starts, and lets a round pass
        assert gathering.busy
        assert not jobs.items
        leader.cancel()  # Task.cancel(): passes through anyio's shield
        with anyio.fail_after(WAIT), pytest.raises(asyncio.CancelledError):
            await leader
        done = True
    assert jobs.items == [["a"]]
