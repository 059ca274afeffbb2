"""The scripted agent workload of the reliability suites, and the child of the crash matrix.

A workload runs real turns through the reference host, the checkpoint policy and the JSONL
backend: a scripted model streams text chunks and asks for tool calls; ``read`` calls are
concurrency-safe and run together, ``write`` calls have a side effect, and a ``nested`` call's
body dispatches an inner ``write`` call for the same agent with itself as ``parent``.

Every interesting moment is an instrumented *point* named ``"<label>: <what>"``: the label says
which boundary is running (``"s pre-step 1.1"``, ``"s request 1.1"``, ``"s tool read-1"``,
``"s flush"``), ``what`` is ``flush-before``, ``flush-after``, ``flush-failed``,
``adapter-start``, ``after chunk N``, ``body-start`` or ``body-end``. A :class:`Recorder` hears
every point, every appended event and every acknowledged flush.

Run as a script (it imports nothing from the tests), this module is the crash matrix child::

    python tests/support/crash_child.py TRACE ROOT --backend asyncio [--point NAME --marker FILE]

It runs :data:`CRASH_TURN` for session ``crash`` and appends what happens to files in TRACE
(``points``, ``events``, ``acks``, ``effects``), each line written straight to the OS so that
SIGKILL cannot lose it. With ``--point``, on reaching that point it writes the point's name into
the marker file and blocks the whole process until it is killed.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from contextlib import aclosing
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio
import anyio.lowlevel

from kai_session_checkpoint_policy import (
    Agent,
    Finish,
    Host,
    TextDelta,
    Tool,
    ToolExecution,
    hookimpl,
    policy,
    tool_call_block,
)
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Generator, Iterable, Sequence

    from kai_session_checkpoint_policy import (
        JSON,
        LlmRequest,
        PreStep,
        PreStepDecision,
        Session,
        SessionEvent,
        SessionLogLike,
        StreamChunk,
        ToolResult,
    )
    from kai_session_checkpoint_policy.hookspecs import (
        FlushThunk,
        PreStepThunk,
        StreamThunk,
        ToolThunk,
    )
    from kai_session_checkpoint_policy.persistence import Compression, OsFiles

__all__ = [
    "BOUNDARY",
    "CRASH_SESSION",
    "CRASH_TURN",
    "Append",
    "Flush",
    "MemoryRecorder",
    "Recorder",
    "SessionPlan",
    "Step",
    "Workload",
    "run_workload",
]

PROVIDER: Final = "scripted"
CRASH_SESSION: Final = "crash"

BOUNDARY: ContextVar[str] = ContextVar("BOUNDARY", default="direct")
"""The label of the boundary the current task is inside, set by :class:`Labels`."""


# -- what a workload is ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    """One model response: text chunks, then tool calls as ``(call id, tool name)``."""

    chunks: tuple[str, ...]
    calls: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Flush:
    """*concurrent* explicit flushes of the session at once."""

    concurrent: int = 1


@dataclass(frozen=True, slots=True)
class Append:
    """*count* events appended directly (type ``note``, ignorable), outside any turn."""

    count: int


Turn = tuple[Step, ...]
Action = Turn | Flush | Append


@dataclass(frozen=True, slots=True)
class SessionPlan:
    session_id: str
    actions: tuple[Action, ...]


@dataclass(frozen=True, slots=True)
class Workload:
    """Sessions that run their actions concurrently, each in order."""

    sessions: tuple[SessionPlan, ...]
    batch_window: float = 3600.0
    compression: Compression = "zstd"
    pack_chunks: bool = True


CRASH_TURN: Final[Turn] = (
    Step(
        ("Reading ", "both files, ", "then writing."),
        (("read-1", "read"), ("read-2", "read"), ("write-1", "write"), ("nested-1", "nested")),
    ),
    Step(("All ", "done.")),
)
"""The crash matrix turn: two concurrent reads, a side effect, a nested dispatch, an answer."""


# -- what happens ------------------------------------------------------------------------------


class Recorder:
    """Hears what a workload does. This base class forgets everything."""

    def point(self, name: str) -> None:
        """An instrumented point was reached."""

    def appended(self, session_id: str, event: SessionEvent) -> None:
        """A live session appended *event*."""

    def acknowledged(self, session_id: str, upto: int) -> None:
        """A flush returned: the first *upto* events of the session are durable."""

    def effect(self, call_id: str) -> None:
        """A side-effecting tool body did its effect."""


@dataclass
class MemoryRecorder(Recorder):
    """Keeps everything, each stamped with ``clock()`` at the time it happened."""

    clock: Callable[[], int] = lambda: 0
    points: list[tuple[int, str]] = field(default_factory=list)
    events: dict[str, list[SessionEvent]] = field(default_factory=dict)
    acks: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    effects: list[str] = field(default_factory=list)

    def point(self, name: str) -> None:
        self.points.append((self.clock(), name))

    def appended(self, session_id: str, event: SessionEvent) -> None:
        self.events.setdefault(session_id, []).append(event)

    def acknowledged(self, session_id: str, upto: int) -> None:
        self.acks.setdefault(session_id, []).append((self.clock(), upto))

    def effect(self, call_id: str) -> None:
        self.effects.append(call_id)

    def acknowledged_at(self, session_id: str, clock: int) -> int:
        """How many events of the session a flush had acknowledged by *clock*."""
        return max((upto for at, upto in self.acks.get(session_id, ()) if at <= clock), default=0)

    def started_at(self, session_id: str, clock: int) -> frozenset[str]:
        """The model calls of the session whose body had started by *clock*."""
        return started_calls(session_id, (name for at, name in self.points if at <= clock))

    def names(self) -> list[str]:
        return [name for _, name in self.points]


def started_calls(session_id: str, points: Iterable[str]) -> frozenset[str]:
    """The ids of the model's tool calls whose body started, according to *points*."""
    prefix, suffix = f"{session_id} tool ", ": body-start"
    return frozenset(
        name[len(prefix) : -len(suffix)]
        for name in points
        if name.startswith(prefix) and name.endswith(suffix) and "/" not in name[len(prefix) :]
    )


# -- the plugins -------------------------------------------------------------------------------


class ObservedJsonl(JsonlSessionPersistence):
    """The JSONL backend, telling the recorder when each flush starts, ends or fails."""

    def __init__(
        self,
        root: Path,
        recorder: Recorder,
        *,
        batch_window: float,
        compression: Compression,
        pack_chunks: bool,
        files: OsFiles | None = None,
    ) -> None:
        super().__init__(
            root,
            batch_window=batch_window,
            compression=compression,
            pack_chunks=pack_chunks,
            files=files,
        )
        self.recorder = recorder

    @hookimpl
    def session_flush(self, session: SessionLogLike) -> FlushThunk | None:
        thunk = super().session_flush(session)
        if thunk is None:
            return None
        recorder, label, flush = self.recorder, BOUNDARY.get(), thunk

        async def observed() -> None:
            upto = len(session.events)
            recorder.point(f"{label}: flush-before")
            try:
                await flush()
            except Exception:
                recorder.point(f"{label}: flush-failed")
                raise
            recorder.acknowledged(session.id, upto)
            recorder.point(f"{label}: flush-after")

        return observed


class Labels:
    """Outermost wrappers of the three boundaries: set :data:`BOUNDARY` for what runs inside."""

    name = "reliability-labels"

    @hookimpl(wrapper=True, tryfirst=True)
    def agent_pre_step(self, step: PreStep) -> Generator[None, PreStepThunk, PreStepThunk]:
        downstream = yield
        label = f"{step.agent.session.id} pre-step {step.turn}.{step.step}"

        async def labelled() -> PreStepDecision:
            BOUNDARY.set(label)
            return await downstream()

        return labelled

    @hookimpl(wrapper=True, tryfirst=True)
    def llm_stream(
        self, request: LlmRequest, host: Host
    ) -> Generator[None, StreamThunk, StreamThunk]:
        downstream = yield
        session = host.sessions.get(request.session_id or "")
        steps = [e for e in session.events if e.type == "step/start"] if session else []
        where = f"{steps[-1].data['turn']}.{steps[-1].data['step']}" if steps else "?"
        label = f"{request.session_id} request {where}"

        async def labelled() -> AsyncGenerator[StreamChunk, None]:
            BOUNDARY.set(label)
            async with aclosing(downstream()) as stream:
                async for chunk in stream:
                    yield chunk

        return labelled

    @hookimpl(wrapper=True, tryfirst=True)
    def tools_execute(self, execution: ToolExecution) -> Generator[None, ToolThunk, ToolThunk]:
        downstream = yield
        session_id = execution.agent.session.id if execution.agent else "direct"
        label = f"{session_id} tool {execution.call_id}"

        async def labelled() -> ToolResult:
            token = BOUNDARY.set(label)
            try:
                return await downstream()
            finally:
                BOUNDARY.reset(token)

        return labelled


class Appended:
    """Tells the recorder about every appended event."""

    name = "reliability-appended"

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    @hookimpl
    def session_event(self, session: Session, event: SessionEvent) -> None:
        self.recorder.appended(session.id, event)


# -- the model and the tools -------------------------------------------------------------------


class ScriptedModel:
    """Answers each session's requests with the steps of its current turn, in order."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.steps: dict[str, list[Step]] = {}

    def start_turn(self, session_id: str, turn: Turn) -> None:
        self.steps[session_id] = list(turn)

    async def __call__(self, request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        label = BOUNDARY.get()
        queue = self.steps.get(request.session_id or "", [])
        step = queue.pop(0) if queue else Step(("(nothing left to say)",))
        self.recorder.point(f"{label}: adapter-start")
        for index, text in enumerate(step.chunks):
            yield TextDelta(text)
            self.recorder.point(f"{label}: after chunk {index}")
        for index, (call_id, tool) in enumerate(step.calls, start=1):  # the text is block 0
            for chunk in tool_call_block(index, call_id, tool):
                yield chunk
        yield Finish("tool-calls" if step.calls else "stop")


def register_tools(host: Host, recorder: Recorder) -> None:
    async def read(execution: ToolExecution) -> JSON:
        recorder.point(f"{BOUNDARY.get()}: body-start")
        await anyio.lowlevel.checkpoint()
        recorder.point(f"{BOUNDARY.get()}: body-end")
        return {"read": execution.call_id}

    async def write(execution: ToolExecution) -> JSON:
        recorder.point(f"{BOUNDARY.get()}: body-start")
        recorder.effect(execution.call_id)
        recorder.point(f"{BOUNDARY.get()}: body-end")
        return {"wrote": execution.call_id}

    async def nested(execution: ToolExecution) -> JSON:
        recorder.point(f"{BOUNDARY.get()}: body-start")
        inner = ToolExecution(
            f"{execution.call_id}/inner",
            "write",
            {},
            execution.signal,
            agent=execution.agent,
            parent=execution,
        )
        result = await host.tools.execute(inner)
        recorder.point(f"{BOUNDARY.get()}: body-end")
        return {"inner": [block.text for block in result.content]}

    host.tools.register(Tool("read", read, concurrency_safe=True))
    host.tools.register(Tool("write", write))
    host.tools.register(Tool("nested", nested))


# -- running a workload ------------------------------------------------------------------------


async def run_plan(host: Host, model: ScriptedModel, plan: SessionPlan, recorder: Recorder) -> None:
    session = host.sessions.create(plan.session_id)
    agent = Agent(host, session, provider=PROVIDER, model="scripted-1")
    notes = 0
    for action in plan.actions:
        if isinstance(action, Flush):
            label = f"{plan.session_id} flush"

            async def flush(label: str = label) -> None:
                BOUNDARY.set(label)
                try:
                    await host.sessions.flush(session)
                except Exception:
                    recorder.point(f"{label}: raised")

            async with anyio.create_task_group() as group:
                for _ in range(action.concurrent):
                    group.start_soon(flush)
        elif isinstance(action, Append):
            for _ in range(action.count):
                session.append("note", {"note": notes}, ignorable=True)
                notes += 1
            await anyio.lowlevel.checkpoint()
        else:
            model.start_turn(plan.session_id, action)
            await agent.run_turn(f"turn of {plan.session_id}")


async def run_workload(
    workload: Workload,
    root: Path,
    recorder: Recorder,
    *,
    files: OsFiles | None = None,
    clock: Callable[[], int] | None = None,
) -> BaseException | None:
    """Run *workload* on a fresh host; return the error closing the host raised, if any."""
    backend = ObservedJsonl(
        root,
        recorder,
        batch_window=workload.batch_window,
        compression=workload.compression,
        pack_chunks=workload.pack_chunks,
        files=files,
    )
    plugins = [backend, policy, Labels(), Appended(recorder)]
    host = (
        Host(plugins, autoload=False)
        if clock is None
        else Host(plugins, autoload=False, clock=clock)
    )
    model = ScriptedModel(recorder)
    host.llm.register_adapter(PROVIDER, model)
    register_tools(host, recorder)
    try:
        async with host, anyio.create_task_group() as group:
            for plan in workload.sessions:
                group.start_soon(run_plan, host, model, plan, recorder)
    except Exception as exc:
        return exc
    return None


# -- the child process -------------------------------------------------------------------------


class TraceRecorder(Recorder):
    """Appends everything to files, line by line, straight to the OS; may stop at one point."""

    def __init__(self, directory: Path, point: str | None, marker: Path | None) -> None:
        self.files = {
            name: os.open(directory / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            for name in ("points", "events", "acks", "effects")
        }
        self.stop_at, self.marker = point, marker

    def _line(self, name: str, line: str) -> None:
        os.write(self.files[name], f"{line}\n".encode())

    def point(self, name: str) -> None:
        self._line("points", name)
        if name == self.stop_at and self.marker is not None:
            self.marker.write_text(name)
            while True:  # block the whole process, every task included, until SIGKILL
                signal.pause()

    def appended(self, session_id: str, event: SessionEvent) -> None:
        self._line("events", event.encode())

    def acknowledged(self, session_id: str, upto: int) -> None:
        self._line("acks", str(upto))

    def effect(self, call_id: str) -> None:
        self._line("effects", call_id)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="directory for the trace files")
    parser.add_argument("root", type=Path, help="the JSONL root")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--window", type=float, default=3600.0, help="batch window, seconds")
    parser.add_argument("--compression", choices=("zstd", "none"), default="zstd")
    parser.add_argument("--point", help="the point to stop at")
    parser.add_argument("--marker", type=Path, help="the file that receives the point's name")
    args = parser.parse_args(argv)
    recorder = TraceRecorder(args.trace, args.point, args.marker)
    workload = Workload(
        (SessionPlan(CRASH_SESSION, (CRASH_TURN, Flush())),), args.window, args.compression
    )
    error = anyio.run(run_workload, workload, args.root, recorder, backend=args.backend)
    if error is not None:
        raise error
    recorder.point("end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
