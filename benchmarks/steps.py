"""Scenario 8: CPU and latency per checkpointed agent step, beside raw commits and peers.

One *step* is what an agent does around one tool call: the model's response that asks for a
tool is recorded (``assistant/message`` and ``tool/call``) and made durable before the tool
runs, then the tool's result is recorded (``tool/result``) and made durable. Two durable
writes, so the raw limit is a *pair*: two ``write`` + ``fsync`` of a line (JSONL), or two
single-row ``INSERT`` statements each committed in its round trip (PostgreSQL).

Each figure is taken in rounds, interleaved with its baseline in the same process, and
reports wall time and CPU (``time.process_time()``: every thread of this process, user and
system) per step, their medians over the rounds, and ratios to the baseline's medians; and the
machine's one-minute load average when the figure started. *Client CPU* is this process's;
for PostgreSQL the server's CPU is not in it.

Peers, each run only where its package is installed (the ``bench`` extra), skipped with a note
otherwise: LangGraph's ``SqliteSaver`` (beside JSONL) and ``PostgresSaver`` (on the same
server), each checkpointing a two-node graph (``model`` writes the response and the call,
``tool`` the result) with ``durability="sync"``, so each node's checkpoint is durable before
the next node runs: one step, two durable checkpoints. And a pgbench-style loop on the
benchmark's own server: clients that each commit single-row ``INSERT`` statements as fast as
they can, for a fixed time, at 1 and at 100 clients (threads, one connection each).

At 100 sessions at once, each of 100 tasks runs steps on its own session for a fixed time;
the figure is steps per second, against the raw rate of the same pairs (100 threads doing
write + fsync pairs, each on its own file, or the pgbench-style loop's commits halved).
"""

from __future__ import annotations

import gc
import importlib
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Sequence

    from kai_session_checkpoint_policy import Host, Session
    from kai_session_checkpoint_policy.persistence import Store

__all__ = ["StepPlan", "load_average", "step_figures"]

_MESSAGE: Final[dict[str, Any]] = {
    "role": "assistant",
    "content": [{"type": "text", "text": "Let me look that up."}],
    "toolCalls": [{"id": "c", "name": "lookup", "arguments": '{"q": "weather"}'}],
}
_RESULT_TEXT: Final = "sunny, 21 degrees, a light wind from the west; " * 2
_LINE: Final = b'{"type":"tool/result","data":"' + b"x" * 150 + b'"}\n'
_ROW: Final = "x" * 150


@dataclass(frozen=True)
class StepPlan:
    """How many steps a round runs, how many rounds, and how long a rate is measured."""

    steps: int
    rounds: int
    seconds: float
    sessions: int = 100


FULL_STEPS: Final = StepPlan(steps=200, rounds=7, seconds=3.0)
QUICK_STEPS: Final = StepPlan(steps=30, rounds=2, seconds=0.5, sessions=20)


def load_average() -> float:
    """The machine's one-minute load average, or -1 where it cannot be read."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return -1.0


def _step_events(index: int) -> tuple[tuple[str, dict[str, Any]], ...]:
    call_id = f"call-{index}"
    return (
        ("assistant/message", {"turn": 1, "step": index, "message": _MESSAGE}),
        (
            "tool/call",
            {"turn": 1, "step": index, "callId": call_id, "name": "lookup", "arguments": "{}"},
        ),
        ("tool/result", {"turn": 1, "step": index, "callId": call_id, "result": _RESULT_TEXT}),
    )


async def session_steps(host: Host, session: Session, steps: int, first: int = 0) -> None:
    """Run *steps* steps on *session*: the response and the call, a flush, the result, a flush."""
    flush, append = host.sessions.flush, session.append
    for index in range(first, first + steps):
        message, call, result = _step_events(index)
        append(*message)
        append(*call)
        await flush(session)
        append(*result)
        await flush(session)


# -- measuring ----------------------------------------------------------------------------------


class _Cost:
    """Wall and CPU microseconds per step of the rounds of one figure; the CPU also split
    into the time spent in this process's own code (user) and in the kernel for it (system)."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.user: list[float] = []
        self.system: list[float] = []
        self.server: list[float] = []  # the database server's CPU, for PostgreSQL

    def add(self, wall: float, cpu: float, user: float, system: float, steps: int) -> None:
        self.wall.append(wall * 1e6 / steps)
        self.cpu.append(cpu * 1e6 / steps)
        self.user.append(user * 1e6 / steps)
        self.system.append(system * 1e6 / steps)

    def to_json(self) -> dict[str, object]:
        figures: dict[str, object] = {
            "wall_us": round(statistics.median(self.wall), 1),
            "cpu_us": round(statistics.median(self.cpu), 1),
            "user_us": round(statistics.median(self.user), 1),
            "system_us": round(statistics.median(self.system), 1),
            "rounds": len(self.wall),
        }
        if self.server:
            figures["server_cpu_us"] = round(statistics.median(self.server), 1)
        return figures


class _Timer:
    server: Callable[[], float] | None = None
    """A reader of the database server's CPU seconds, while PostgreSQL figures are taken."""

    def __init__(self, cost: _Cost, steps: int) -> None:
        self._cost, self._steps = cost, steps

    def __enter__(self) -> None:
        self._server = 0.0 if _Timer.server is None else _Timer.server()
        self._usage = resource.getrusage(resource.RUSAGE_SELF)
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def __exit__(self, *exc_info: object) -> None:
        wall, cpu = time.perf_counter() - self._wall, time.process_time() - self._cpu
        usage = resource.getrusage(resource.RUSAGE_SELF)
        user, system = usage.ru_utime - self._usage.ru_utime, usage.ru_stime - self._usage.ru_stime
        self._cost.add(wall, cpu, user, system, self._steps)
        if _Timer.server is not None:
            self._cost.server.append((_Timer.server() - self._server) * 1e6 / self._steps)


def _ratios(figure: dict[str, object], baseline: dict[str, object]) -> dict[str, object]:
    """*figure* with its ratios to *baseline*, and the CPU it takes beyond the baseline's
    (``own_cpu_us``: what the library adds to the raw pair's system calls)."""
    out = dict(figure)
    for key in ("wall_us", "cpu_us"):
        base = baseline[key]
        value = figure[key]
        assert isinstance(base, float)
        assert isinstance(value, float)
        out[key.replace("_us", "_ratio")] = round(value / base, 2) if base else None
    cpu, base_cpu = figure["cpu_us"], baseline["cpu_us"]
    assert isinstance(cpu, float)
    assert isinstance(base_cpu, float)
    out["own_cpu_us"] = round(cpu - base_cpu, 1)
    return out


def _raw_pairs(path: Path, steps: int) -> None:
    """Two ``write`` + ``fsync`` of a line per step, appended to *path*."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(steps * 2):
            os.write(fd, _LINE)
            os.fsync(fd)
    finally:
        os.close(fd)


def _rate(worker: Callable[[int, threading.Event], int], clients: int, seconds: float) -> float:
    """Operations per second of *clients* threads running *worker* until told to stop.

    :raises RuntimeError: if a client failed (a rate of fewer clients would pass for theirs).
    """
    stop = threading.Event()
    done = [0] * clients
    failures: list[BaseException] = []

    def run(index: int) -> None:
        try:
            done[index] = worker(index, stop)
        except BaseException as exc:
            failures.append(exc)
            stop.set()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    stop.wait(seconds)  # ended early if a client fails
    stop.set()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(
            f"{len(failures)} of {clients} clients failed, the first with {failures[0]!r}"
        ) from failures[0]
    return sum(done) / (time.perf_counter() - start)


# -- JSONL --------------------------------------------------------------------------------------


async def _library_rounds(
    backend: Store, plan: StepPlan, cost: _Cost, between: Callable[[], None]
) -> None:
    from kai_session_checkpoint_policy import Host

    async with Host([backend], autoload=False) as host:
        session = host.sessions.create(f"steps-{uuid.uuid4().hex[:12]}")
        await session_steps(host, session, 10)  # its log exists, its connection is warm
        first = 10
        for _ in range(plan.rounds):
            between()
            with _Timer(cost, plan.steps):
                await session_steps(host, session, plan.steps, first)
            first += plan.steps


async def _many_sessions(backend: Store, plan: StepPlan) -> float:
    """Steps per second of *plan.sessions* sessions each running steps for *plan.seconds*."""
    from kai_session_checkpoint_policy import Host

    async with Host([backend], autoload=False) as host:
        sessions = [
            host.sessions.create(f"many-{uuid.uuid4().hex[:12]}") for _ in range(plan.sessions)
        ]
        done = 0
        stop = False

        async def run(session: Session) -> None:
            nonlocal done
            first = 0
            while not stop:
                await session_steps(host, session, 1, first)
                first += 1
                done += 1

        async with anyio.create_task_group() as group:
            for session in sessions:
                await session_steps(host, session, 1)
            done = 0
            start = time.perf_counter()
            for session in sessions:
                group.start_soon(run, session)
            await anyio.sleep(plan.seconds)
            stop = True
        return done / (time.perf_counter() - start)


def _jsonl(directory: Path, plan: StepPlan, loops: Sequence[str]) -> dict[str, object]:
    from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence

    figures: dict[str, object] = {}
    raw_path = directory / "raw-pairs.jsonl"
    for loop in loops:
        load = load_average()
        raw, library = _Cost(), _Cost()

        def baseline(raw: _Cost = raw) -> None:
            with _Timer(raw, plan.steps):
                _raw_pairs(raw_path, plan.steps)

        root = directory / f"jsonl-{loop}"
        anyio.run(
            _library_rounds, JsonlSessionPersistence(root), plan, library, baseline, backend=loop
        )
        base = raw.to_json()
        figures[f"1 session, {loop}"] = {
            "load_average": load,
            "raw_pair": base,
            "library": _ratios(library.to_json(), base),
        }
    load = load_average()

    def pairs(index: int, stop: threading.Event) -> int:
        fd = os.open(directory / f"raw-{index}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        count = 0
        try:
            while not stop.is_set():
                os.write(fd, _LINE)
                os.fsync(fd)
                os.write(fd, _LINE)
                os.fsync(fd)
                count += 1
        finally:
            os.close(fd)
        return count

    raw_rate = _rate(pairs, plan.sessions, plan.seconds)
    rate = anyio.run(
        _many_sessions, JsonlSessionPersistence(directory / "jsonl-many"), plan, backend="asyncio"
    )
    figures[f"{plan.sessions} sessions at once, asyncio"] = {
        "load_average": load,
        "raw_pairs_per_s": round(raw_rate, 1),
        "steps_per_s": round(rate, 1),
        "ratio": round(rate / raw_rate, 2) if raw_rate else None,
    }
    figures["SqliteSaver"] = _langgraph_peer(
        "langgraph.checkpoint.sqlite",
        plan,
        lambda module: _sqlite_saver(module, directory / "langgraph.sqlite"),
        baseline_of=lambda cost: _raw_pairs(raw_path, plan.steps),
    )
    return figures


# -- PostgreSQL ---------------------------------------------------------------------------------


def _server_cpu(data_directory: Path) -> Callable[[], float]:
    """A reader of the CPU seconds the server's processes have used so far (Linux's
    ``/proc``; 0 where it cannot be read): the postmaster and its children."""
    try:
        postmaster = int((data_directory / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return lambda: 0.0
    tick = os.sysconf("SC_CLK_TCK")

    def seconds() -> float:
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(stat.parent.name) == postmaster or int(fields[1]) == postmaster:
                total += int(fields[11]) + int(fields[12])
        return total / tick

    return seconds


def _insert_loop(dsn: str) -> Callable[[int, threading.Event], int]:
    import psycopg

    def commits(index: int, stop: threading.Event) -> int:
        count = 0
        with psycopg.connect(dsn, autocommit=True) as connection:
            execute = connection.execute
            while not stop.is_set():
                execute("INSERT INTO kai_bench_rows VALUES (%s)", (_ROW,))
                count += 1
        return count

    return commits


def server_settings(plan: StepPlan) -> dict[str, str]:
    """The benchmark server's settings beside the tests' own: a connection for every client of
    the commit loop, and room for the library's and the peer's."""
    return {"max_connections": str(plan.sessions + 50)}


def _postgres(plan: StepPlan, loops: Sequence[str]) -> dict[str, object]:
    from tests.support.postgres_server import PostgresServer, find_binaries, missing

    binaries = find_binaries()
    problem = missing(binaries)
    if problem is not None:
        return {"skipped": f"the PostgreSQL figures need what is missing here: {problem}"}
    assert binaries is not None
    with PostgresServer.start_new(binaries, server_settings(plan)) as server:
        _Timer.server = _server_cpu(server.data)
        try:
            return _postgres_figures(server.dsn_for(server.create_database()), plan, loops)
        finally:
            _Timer.server = None


def _postgres_figures(dsn: str, plan: StepPlan, loops: Sequence[str]) -> dict[str, object]:
    import psycopg

    from kai_session_checkpoint_policy.persistence import PostgresSessionPersistence

    figures: dict[str, object] = {}
    connection = psycopg.connect(dsn, autocommit=True)
    try:
        connection.execute("CREATE TABLE kai_bench_rows (line text)")
        execute = connection.execute

        def insert_pairs() -> None:
            for _ in range(plan.steps * 2):
                execute("INSERT INTO kai_bench_rows VALUES (%s)", (_ROW,))

        for loop in loops:
            load = load_average()
            raw, library = _Cost(), _Cost()

            def baseline(raw: _Cost = raw) -> None:
                with _Timer(raw, plan.steps):
                    insert_pairs()

            backend = PostgresSessionPersistence(dsn)
            anyio.run(_library_rounds, backend, plan, library, baseline, backend=loop)
            base = raw.to_json()
            figures[f"1 session, {loop}"] = {
                "load_average": load,
                "raw_pair": base,
                "library": _ratios(library.to_json(), base),
            }
        figures["PostgresSaver"] = _langgraph_peer(
            "langgraph.checkpoint.postgres",
            plan,
            lambda module: _postgres_saver(module, dsn),
            baseline_of=lambda cost: insert_pairs(),
        )
        load = load_average()
        loop_rates = {
            clients: _rate(_insert_loop(dsn), clients, plan.seconds)
            for clients in (1, plan.sessions)
        }
        rate = anyio.run(_many_sessions, PostgresSessionPersistence(dsn), plan, backend="asyncio")
        commits = loop_rates[plan.sessions]
        figures[f"{plan.sessions} sessions at once, asyncio"] = {
            "load_average": load,
            "single_row_commits_per_s": {
                str(clients): round(value, 1) for clients, value in loop_rates.items()
            },
            "steps_per_s": round(rate, 1),
            "ratio_to_commit_pairs": round(rate / (commits / 2), 2) if commits else None,
        }
    finally:
        connection.close()
    return figures


# -- LangGraph ----------------------------------------------------------------------------------


def _version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def _sqlite_saver(module: Any, path: Path) -> Generator[Any, None, None]:
    import sqlite3

    connection = sqlite3.connect(path, check_same_thread=False)
    connection.execute("PRAGMA synchronous=FULL")
    try:
        yield module.SqliteSaver(connection)
    finally:
        connection.close()


def _postgres_saver(module: Any, dsn: str) -> Generator[Any, None, None]:
    with module.PostgresSaver.from_conn_string(dsn) as saver:
        saver.setup()
        yield saver


def _graph(saver: Any) -> Any:
    """A two-node graph: ``model`` writes the response and the call, ``tool`` the result."""
    from typing import TypedDict

    graph_module = importlib.import_module("langgraph.graph")

    class State(TypedDict, total=False):
        response: list[Any]
        result: Any

    def model(state: State) -> State:
        message, call, _ = _step_events(0)
        return {"response": [message[1], call[1]]}

    def tool(state: State) -> State:
        return {"result": _step_events(0)[2][1]}

    graph = graph_module.StateGraph(State)
    graph.add_node("model", model)
    graph.add_node("tool", tool)
    graph.add_edge(graph_module.START, "model")
    graph.add_edge("model", "tool")
    graph.add_edge("tool", graph_module.END)
    return graph.compile(checkpointer=saver)


def _langgraph_peer(
    module_name: str,
    plan: StepPlan,
    saver_of: Callable[[Any], Generator[Any, None, None]],
    baseline_of: Callable[[_Cost], None],
) -> dict[str, object]:
    distribution = "langgraph-checkpoint-" + module_name.rsplit(".", 1)[1]
    try:
        module = importlib.import_module(module_name)
        importlib.import_module("langgraph.graph")
    except ImportError:
        return {"skipped": f"install {distribution} and langgraph (the 'bench' extra)"}
    load = load_average()
    raw, graph, puts = _Cost(), _Cost(), _Cost()
    saver_context = saver_of(module)
    saver = next(saver_context)
    try:
        app = _graph(saver)
        config = {"configurable": {"thread_id": f"steps-{uuid.uuid4().hex[:12]}"}}
        for _ in range(5):
            app.invoke({}, config, durability="sync")
        put = _saver_puts(saver)
        put(5)
        for _ in range(plan.rounds):
            with _Timer(raw, plan.steps):
                baseline_of(raw)
            with _Timer(graph, plan.steps):
                for _ in range(plan.steps):
                    app.invoke({}, config, durability="sync")
            with _Timer(puts, plan.steps):
                put(plan.steps)
    finally:
        saver_context.close()
    base = raw.to_json()
    return {
        "load_average": load,
        "versions": {
            "langgraph": _version("langgraph"),
            distribution: _version(distribution),
        },
        "raw_pair": base,
        "graph": _ratios(graph.to_json(), base),
        "two_puts": _ratios(puts.to_json(), base),
    }


def _saver_puts(saver: Any) -> Callable[[int], None]:
    """Steps of two ``saver.put`` calls each (the response and the call, then the result):
    the saver alone, without the graph around it."""
    base = importlib.import_module("langgraph.checkpoint.base")
    config: Any = {
        "configurable": {"thread_id": f"puts-{uuid.uuid4().hex[:12]}", "checkpoint_ns": ""}
    }
    version = 0

    def steps(count: int) -> None:
        nonlocal config, version
        for index in range(count):
            message, call, result = _step_events(index)
            for values in ([message[1], call[1]], [result[1]]):
                version += 1
                checkpoint = base.empty_checkpoint()
                checkpoint["channel_values"] = {"events": values}
                checkpoint["channel_versions"] = {"events": version}
                config = saver.put(
                    config, checkpoint, {"source": "loop", "step": version}, {"events": version}
                )

    return steps


# -- memory -------------------------------------------------------------------------------------


async def _live_memory(events: int) -> dict[str, object]:
    """Bytes a session holds appended live to *events* events, against the same log resumed,
    and per live session after one 37-event turn (``tracemalloc``, this process)."""
    import tracemalloc

    from kai_session_checkpoint_policy import Host
    from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence

    from ._support import CHUNK_DATA

    with tempfile.TemporaryDirectory(prefix="kai-steps-memory-") as directory:
        backend = JsonlSessionPersistence(directory, batch_window=3600)
        async with Host([backend], autoload=False) as host:
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            session = host.sessions.create("live")
            session.append("turn/start", {"turn": 1})
            for index in range(events - 2):
                session.append("assistant/chunk", CHUNK_DATA)
                if index % 10_000 == 9_999:
                    await host.sessions.flush(session)
            session.append("turn/end", {"turn": 1})
            await host.sessions.flush(session)
            gc.collect()
            live = tracemalloc.get_traced_memory()[0] - before
            await host.sessions.close(session)
            tracemalloc.stop()
            many = 100
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            sessions = []
            for index in range(many):
                small = host.sessions.create(f"small-{index}")
                small.append("turn/start", {"turn": 1})
                for _ in range(35):
                    small.append("assistant/chunk", CHUNK_DATA)
                small.append("turn/end", {"turn": 1})
                await host.sessions.flush(small)
                sessions.append(small)
            gc.collect()
            per_session = (tracemalloc.get_traced_memory()[0] - before) / many
            tracemalloc.stop()
            for small in sessions:
                await host.sessions.close(small)
        backend = JsonlSessionPersistence(directory)
        async with Host([backend], autoload=False) as host:
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            resumed = await host.sessions.resume("live")
            gc.collect()
            stored = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
            assert len(resumed.events) == events
    return {
        "events": events,
        "live_mib": round(live / 2**20, 1),
        "resumed_mib": round(stored / 2**20, 1),
        "ratio": round(live / stored, 2) if stored else None,
        "per_live_session_kib_37_events": round(per_session / 1024, 1),
    }


# -- all of it ------------------------------------------------------------------------------------


def step_figures(
    directory: Path,
    *,
    quick: bool,
    loops: Sequence[str],
    memory_events: int,
    rounds: int | None = None,
    original: Path | None = None,
    node: str = "node",
) -> dict[str, object]:
    """Every figure of this scenario; PostgreSQL, the peers and the original harness skipped,
    saying why, where they cannot run."""
    from .original import original_figures

    plan = QUICK_STEPS if quick else FULL_STEPS
    if rounds is not None:
        plan = StepPlan(plan.steps, rounds, plan.seconds, plan.sessions)
    directory.mkdir(parents=True, exist_ok=True)
    bursts = {"passes": 1, "rounds": 10, "warmup": 3} if quick else {}
    return {
        "plan": {"steps_per_round": plan.steps, "rounds": plan.rounds, "seconds": plan.seconds},
        "jsonl": _jsonl(directory, plan, loops),
        "postgres": _postgres(plan, loops),
        "memory": {"load_average": load_average(), **anyio.run(_live_memory, memory_events)},
        "original": original_figures(
            directory / "original", checkout=original, node=node, **bursts
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m benchmarks.steps")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--memory-events", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None, help="rounds of each figure")
    parser.add_argument(
        "--loop", action="append", choices=("asyncio", "trio"), help="event loop (default: both)"
    )
    args = parser.parse_args(argv)
    events = args.memory_events or (20_000 if args.quick else 1_000_000)
    with tempfile.TemporaryDirectory(prefix="kai-steps-") as directory:
        figures = step_figures(
            Path(directory),
            quick=args.quick,
            loops=args.loop or ("asyncio", "trio"),
            memory_events=events,
            rounds=args.rounds,
        )
    sys.stdout.write(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
