"""A cancellation fuzz: seeded schedules that cancel turns and flushes at random moments.

Each schedule runs a few sessions' turns at once on one host (the JSONL backend with the
policy) over real files whose writes and fsyncs take a random, short time. Cancellations come
from three places, each at a moment the seed chooses: a ``session_event`` listener (inside an
append, so the cancellation is pending when the next checkpoint starts), the file layer's
worker threads (while a write or an fsync is in flight), and a task that wakes at random. Each
cancels a turn that is running, with anyio (``CancelScope.cancel()``) or, on asyncio, natively
(``Task.cancel()``, or an ``asyncio.wait_for`` that times out around a flush).

After every schedule, with the host closed: the log on disk holds every seq exactly once, in
order; it holds every event the sessions appended (every acknowledged one included); every tool
call the model asked for has exactly one result, in memory and on disk; and no tool body
started after its turn was asked to stop.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import anyio
import anyio.lowlevel
import pytest

from kai_session_checkpoint_policy import (
    Agent,
    Finish,
    Host,
    JsonlSessionPersistence,
    LlmRequest,
    Session,
    SessionEvent,
    TextDelta,
    Tool,
    ToolExecution,
    hookimpl,
    policy,
    tool_call_block,
)
from kai_session_checkpoint_policy.persistence import OsFiles

from .support import figures
from .support.invariants import transcript_problems
from .support.persistence_helpers import find_log, stored_events

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator
    from pathlib import Path

    from kai_session_checkpoint_policy import JSON, JSONObject, StreamChunk

pytestmark = pytest.mark.anyio

LONG: Final = bool(os.environ.get("KAI_LONG_RELIABILITY"))
SCHEDULES: Final = 400 if LONG else 60
"""Schedules per event loop."""


class JitteryFiles(OsFiles):
    """Real files whose writes and fsyncs take up to a millisecond more, at random.

    *on_io* is called from the thread doing the write or fsync, while it is in flight.
    """

    def __init__(self, seed: int, on_io: Callable[[], None]) -> None:
        super().__init__()
        self._random = random.Random(seed)
        self._random_lock = threading.Lock()
        self._on_io = on_io

    def _jitter(self) -> None:
        with self._random_lock:
            delay = self._random.choice((0.0, 0.0, 0.0002, 0.001))
        self._on_io()
        if delay:
            time.sleep(delay)  # the slow disk itself

    def write(self, fd: int, data: bytes) -> None:
        self._jitter()
        super().write(fd, data)

    def fsync(self, fd: int) -> None:
        self._jitter()
        super().fsync(fd)


@dataclass
class Turn:
    """One turn being run, and how it can be told to stop."""

    session: str
    number: int
    scope: anyio.CancelScope
    task: asyncio.Task[object] | None  # on asyncio
    stop_requested: bool = False


@dataclass
class Schedule:
    """What one schedule did and found."""

    cancellations: int = 0
    violations: list[str] = field(default_factory=list)
    turns: dict[tuple[str, int], Turn] = field(default_factory=dict)
    acknowledged: dict[str, int] = field(default_factory=dict)


class Canceller:
    """Stops running turns at the moments a seeded generator picks."""

    def __init__(self, rng: random.Random, schedule: Schedule, *, native: bool) -> None:
        self.rng = rng
        self.schedule = schedule
        self.native = native
        self.budget = rng.randint(1, 4)

    def fire(self) -> None:
        """Stop one running turn (on the event loop's thread)."""
        running = [turn for turn in self.schedule.turns.values() if not turn.stop_requested]
        if self.budget <= 0 or not running:
            return
        self.budget -= 1
        turn = self.rng.choice(running)
        turn.stop_requested = True
        self.schedule.cancellations += 1
        if self.native and turn.task is not None and self.rng.random() < 0.5:
            turn.task.cancel()
        else:
            turn.scope.cancel()

    def chance(self, probability: float) -> bool:
        return self.budget > 0 and self.rng.random() < probability


class CancelOnEvent:
    """Fires the canceller inside an append, now and then."""

    name = "fuzz-cancel-on-event"

    def __init__(self, canceller: Canceller) -> None:
        self.canceller = canceller

    @hookimpl
    def session_event(self, event: SessionEvent) -> None:
        moments = ("tool/call", "step/start", "assistant/message", "assistant/chunk")
        if event.type in moments and self.canceller.chance(0.08):
            self.canceller.fire()


class Model:
    """A model that asks for a few tool calls in the first step and answers in the second."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    async def __call__(self, request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        answered = sum(1 for message in request.messages if message.get("role") == "user") > 1
        yield TextDelta("thinking")
        if answered and self.rng.random() < 0.7:
            yield TextDelta("done")
            yield Finish("stop")
            return
        for index in range(1, self.rng.randint(2, 4)):  # the text is block 0
            name = self.rng.choice(("read", "read", "pay"))
            call_id = f"{request.session_id}-{len(request.messages)}-{index}"
            for chunk in tool_call_block(index, call_id, name):
                yield chunk
        yield Finish("tool-calls")


def tools(schedule: Schedule) -> list[Tool]:
    def body(name: str) -> Callable[[ToolExecution], object]:
        async def run(execution: ToolExecution) -> JSON:
            agent = execution.agent
            assert agent is not None
            turn = schedule.turns.get((agent.session.id, _turn_of(agent.session)))
            if turn is not None and turn.stop_requested:
                schedule.violations.append(
                    f"{execution.call_id}: a tool body started after its turn was cancelled"
                )
            await anyio.sleep(0.0005)
            return name

        return run

    return [
        Tool("read", body("read"), concurrency_safe=True),  # type: ignore[arg-type]
        Tool("pay", body("pay")),  # type: ignore[arg-type]
    ]


def _turn_of(session: Session) -> int:
    return sum(1 for event in session.events if event.type == "turn/start")


def stored_records(root: Path, session_id: str) -> list[JSONObject]:
    """The stored events of a session, as the JSON objects of their envelopes."""
    return [event.to_json() for event in stored_events(find_log(root, session_id))]


async def run_schedule(seed: int, root: Path, backend_name: str) -> Schedule:
    rng = random.Random(seed)
    schedule = Schedule()
    native = backend_name == "asyncio"
    canceller = Canceller(rng, schedule, native=native)
    loop_call: Callable[[Callable[[], None]], object]
    if native:
        loop = asyncio.get_running_loop()
        loop_call = lambda callback: loop.call_soon_threadsafe(callback)  # noqa: E731
    else:
        import trio

        token = trio.lowlevel.current_trio_token()
        loop_call = lambda callback: token.run_sync_soon(callback)  # noqa: E731
    io_rng = random.Random(seed + 1)
    io_lock = threading.Lock()

    def on_io() -> None:  # in a worker thread, or on the loop's thread for an inline write
        with io_lock:
            fire = io_rng.random() < 0.05
        if fire:
            loop_call(canceller.fire)

    files = JitteryFiles(seed, on_io)
    backend = JsonlSessionPersistence(
        root,
        batch_window=rng.choice((0.001, 0.005, 0.05)),
        inline_write_limit=rng.choice((0.0, 0.002)),
        files=files,
    )
    host = Host([backend, policy, CancelOnEvent(canceller)])
    for tool in tools(schedule):
        host.tools.register(tool)
    host.llm.register_adapter("fuzz", Model(rng))
    flush = host.sessions.flush

    async def recorded_flush(session: Session) -> bool:
        admitted = session.seq
        took_part = await flush(session)
        acknowledged = schedule.acknowledged
        acknowledged[session.id] = max(acknowledged.get(session.id, 0), admitted)
        return took_part

    host.sessions.flush = recorded_flush  # type: ignore[method-assign]
    session_ids = [f"s{index}" for index in range(rng.randint(1, 3))]
    sessions: dict[str, Session] = {}

    async def run_turns(session: Session, turns: int) -> None:
        agent = Agent(host, session, provider="fuzz", model="m", max_steps=3)
        for _ in range(turns):
            await run_one(agent, session, _turn_of(session) + 1)

    async def run_one(agent: Agent, session: Session, number: int) -> None:
        task = asyncio.current_task() if native else None
        with anyio.CancelScope() as scope:
            turn = schedule.turns[(session.id, number)] = Turn(session.id, number, scope, task)
            try:
                await agent.run_turn(f"turn {number}")
            except asyncio.CancelledError:
                if task is None or not turn.stop_requested or scope.cancel_called:
                    raise
                if sys.version_info >= (3, 11):
                    task.uncancel()  # the harness, like a server, ends the cancelled request
        del schedule.turns[(session.id, number)]

    async def timed_flushes(session: Session) -> None:
        for _ in range(rng.randint(0, 3)):
            await anyio.sleep(rng.uniform(0, 0.004))
            if native and rng.random() < 0.5:
                try:
                    await asyncio.wait_for(host.sessions.flush(session), rng.uniform(0, 0.002))
                except (TimeoutError, asyncio.TimeoutError):
                    schedule.cancellations += 1
            else:
                with anyio.move_on_after(rng.uniform(0, 0.002)) as scope:
                    await host.sessions.flush(session)
                schedule.cancellations += scope.cancelled_caught

    async def wake_at_random() -> None:
        for _ in range(rng.randint(0, 3)):
            await anyio.sleep(rng.uniform(0, 0.01))
            canceller.fire()

    async with host, anyio.create_task_group() as group:
        for session_id in session_ids:
            session = sessions[session_id] = host.sessions.create(session_id)
            group.start_soon(run_turns, session, rng.randint(1, 3))
            group.start_soon(timed_flushes, session)
        group.start_soon(wake_at_random)
    schedule.violations += check(root, sessions, schedule)
    return schedule


def check(root: Path, sessions: dict[str, Session], schedule: Schedule) -> list[str]:
    problems: list[str] = []
    for session_id, session in sessions.items():
        records = stored_records(root, session_id)
        seqs = [record["seq"] for record in records]
        if seqs != list(range(len(seqs))):
            problems.append(f"{session_id}: seqs on disk are {seqs}")
        expected = [event.to_json() for event in session.events]
        if records != expected:
            problems.append(f"{session_id}: the log on disk differs from the session in memory")
        if len(records) < schedule.acknowledged.get(session_id, 0):
            problems.append(f"{session_id}: an acknowledged event is missing")
        problems += [f"{session_id} in memory: {p}" for p in transcript_problems(session.events)]
    return problems


async def test_cancellation_at_random_moments_keeps_every_promise(
    tmp_path_factory: pytest.TempPathFactory, anyio_backend: str, request: pytest.FixtureRequest
) -> None:
    cancellations = 0
    violations: list[str] = []
    for seed in range(SCHEDULES):
        root = tmp_path_factory.mktemp(f"schedule-{seed}")
        schedule = await run_schedule(seed, root, anyio_backend)
        cancellations += schedule.cancellations
        recovered = await _recovered_problems(root, schedule)
        violations += [f"seed {seed}: {problem}" for problem in schedule.violations + recovered]
    figures.add(
        request,
        cancel_schedules=SCHEDULES,
        cancellations=cancellations,
        cancel_violations=len(violations),
    )
    assert violations == []
    assert cancellations >= SCHEDULES  # the schedules did cancel, often


async def _recovered_problems(root: Path, schedule: Schedule) -> list[str]:
    problems: list[str] = []
    backend = JsonlSessionPersistence(root)
    for header in await backend.list_sessions():
        stored = await backend.load(header.id)
        if stored.repair or stored.torn_bytes:
            problems.append(f"{header.id}: recovery had to repair a log the host closed")
        problems += [f"{header.id} on disk: {p}" for p in transcript_problems(stored.events)]
    return problems
