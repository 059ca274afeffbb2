"""Scenario 6: the PostgreSQL backend beside JSONL, each against its own physical limit.

The benchmark starts a PostgreSQL server of its own, as the tests do
(:class:`tests.support.postgres_server.PostgresServer`: ``fsync`` and ``synchronous_commit`` on,
a Unix socket), and skips these figures, saying why, when the server programs or the driver are
missing. Its baseline, taken in the same rounds as the figures: **one single-row ``INSERT``
committed in one round trip** (an autocommit statement) on the same server, the least a durable
write to it costs. JSONL's baseline is the raw write and fsync of the other scenarios.

Measured on both backends with the same code: a flush after 1 and after 100 appended events;
a burst of 32 checkpoints of one session; 100 sessions checkpointing at once, with how many
transactions (or fsyncs) it took (a fifth as many samples: each is 100 checkpoints); and
recovering a session of 1,000,000 events in a fresh process (the events of the JSONL recovery
scenario, inserted with ``COPY``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.lowlevel

from kai_session_checkpoint_policy import Host

from ._support import CHUNK_DATA, Baseline, summarize
from .recovery import (
    CHUNKS_PER_STEP,
    SESSION_ID,
    START_MS,
    _child,
    _float,
    _hwm_bytes,
    _int,
    _maxrss_bytes,
    _turn,
)
from .recovery import _line as _record_line
from .scenarios import Plan, _cell, _group, _steady_session, clock

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from pathlib import Path

    from kai_session_checkpoint_policy import Session
    from kai_session_checkpoint_policy.persistence import Store

__all__ = ["postgres_figures"]

SESSIONS: Final = 100
"""Sessions checkpointing at once."""
BURST: Final = 32
"""Checkpoints of one session released at once."""
SIZES: Final = (1, 100)
"""Events appended before a timed flush."""
_ROW: Final = "x" * 150
"""What the baseline inserts: one 150-byte text, as the raw baseline writes 150 bytes."""


class InsertBaseline:
    """One single-row ``INSERT`` and its ``COMMIT``, one round trip each sample."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        self._connection = psycopg.connect(dsn, autocommit=True)
        self._connection.execute("CREATE TABLE IF NOT EXISTS kai_bench_baseline (line text)")
        self.samples: list[int] = []

    def sample(self, count: int) -> list[int]:
        execute, taken = self._connection.execute, []
        for _ in range(count):
            start = clock()
            execute("INSERT INTO kai_bench_baseline VALUES (%s)", (_ROW,))
            taken.append(clock() - start)
        self.samples += taken
        return taken

    def close(self) -> None:
        self._connection.close()


def _commits(backend: Store) -> int:
    """Durable writes so far: transactions for PostgreSQL, fsyncs and syncfs calls for JSONL."""
    statistics = backend.statistics()
    if hasattr(statistics, "transactions"):
        return int(statistics.transactions)
    return int(getattr(statistics, "fsyncs", 0)) + int(getattr(statistics, "syncfs", 0))


async def _timed_flushes(
    host: Host,
    backend: Store,
    baseline: InsertBaseline | Baseline,
    plan: Plan,
    prefix: str,
    sample: Callable[[Session], Any],
) -> tuple[list[int], list[int], list[int]]:
    """Rounds of samples: each round takes the baseline's, then times *sample* per_round times.

    Returns the latencies, the baseline samples of the same rounds, and the commits of each
    sample. Each round starts a new session whose log already exists.
    """
    latency: list[int] = []
    raw: list[int] = []
    commits: list[int] = []
    for warm_up in (True, *[False] * plan.rounds):
        session = await _steady_session(host, prefix)
        taken = baseline.sample(plan.per_round)
        for _ in range(plan.per_round):
            before = _commits(backend)
            elapsed = await sample(session)
            if not warm_up:
                latency.append(elapsed)
                commits.append(_commits(backend) - before)
        if not warm_up:
            raw += taken
    return latency, raw, commits


def _cell_with_commits(latency: list[int], raw: list[int], commits: list[int]) -> dict[str, object]:
    return _cell(
        latency,
        raw,
        commits_per_sample=sum(commits) / len(commits),
        min_commits_per_sample=min(commits),
        max_commits_per_sample=max(commits),
    )


async def _measure_backend(
    backend: Store, baseline: InsertBaseline | Baseline, plan: Plan
) -> dict[str, object]:
    """Every figure of this scenario for one backend, on the current event loop."""
    figures: dict[str, object] = {}
    async with Host([backend], autoload=False) as host:
        for size in SIZES:

            async def flush(session: Session, size: int = size) -> int:
                for _ in range(size):
                    session.append("assistant/chunk", CHUNK_DATA)
                start = clock()
                await host.sessions.flush(session)
                return clock() - start

            cells = await _timed_flushes(host, backend, baseline, plan, f"flush-{size}", flush)
            figures[f"flush P={size}"] = _cell_with_commits(*cells)

        async def burst(session: Session) -> int:
            return await _group(host, session, BURST, 0)

        cells = await _timed_flushes(host, backend, baseline, plan, "burst", burst)
        figures[f"burst K={BURST}"] = _cell_with_commits(*cells)

        many = [await _steady_session_kept(host, f"many-{index}") for index in range(SESSIONS)]
        latency: list[int] = []
        raw: list[int] = []
        commits: list[int] = []
        for warm_up in (True, *[False] * plan.rounds):
            taken = baseline.sample(plan.per_round)
            for _ in range(max(1, plan.per_round // 5)):  # each sample is 100 checkpoints
                before = _commits(backend)
                elapsed = await _all_at_once(host, many)
                if not warm_up:
                    latency.append(elapsed)
                    commits.append(_commits(backend) - before)
            if not warm_up:
                raw += taken
        figures[f"{SESSIONS} sessions at once"] = cell = _cell_with_commits(latency, raw, commits)
        shared = getattr(backend, "shared_sync", None)  # JSONL: whether logs shared a syncfs
        if shared is not None:
            cell["shared_sync"] = shared
    return figures


async def _steady_session_kept(host: Host, session_id: str) -> Session:
    """A session whose log exists, kept live beside others (unlike :func:`_steady_session`)."""
    session = host.sessions.create(session_id)
    session.append("assistant/chunk", CHUNK_DATA)
    await host.sessions.flush(session)
    return session


async def _all_at_once(host: Host, sessions: Sequence[Session]) -> int:
    """Append one event to each session, then release one checkpoint per session at once.

    The latency runs from the release to the return of the last checkpoint.
    """
    gate = anyio.Event()
    parked = 0
    returned = 0

    async def checkpoint(session: Session) -> None:
        nonlocal parked, returned
        parked += 1
        await gate.wait()
        await host.sessions.flush(session)
        returned = max(returned, clock())

    for session in sessions:
        session.append("tool/call", {"turn": 1, "step": 1, "callId": "c", "name": "n"})
    async with anyio.create_task_group() as group:
        for session in sessions:
            group.start_soon(checkpoint, session)
        while parked < len(sessions):
            await anyio.lowlevel.checkpoint()
        start = clock()
        gate.set()
    return returned - start


async def _run_loop(dsn: str, jsonl_root: Path, plan: Plan) -> dict[str, object]:
    """Both backends on this event loop, each against its own baseline."""
    from kai_session_checkpoint_policy.persistence import (
        JsonlSessionPersistence,
        PostgresSessionPersistence,
    )

    results: dict[str, object] = {}
    insert = InsertBaseline(dsn)
    try:
        insert.sample(plan.per_round)  # warm the connection and the table
        insert.samples.clear()
        results["postgres"] = await _measure_backend(PostgresSessionPersistence(dsn), insert, plan)
        results["baseline_insert_us"] = summarize(insert.samples).to_json()
    finally:
        insert.close()
    raw = Baseline(jsonl_root)
    try:
        results["jsonl"] = await _measure_backend(JsonlSessionPersistence(jsonl_root), raw, plan)
        results["baseline_write_fsync_us"] = summarize(raw.samples).to_json()
    finally:
        raw.close()
    return results


# -- recovery -----------------------------------------------------------------------------------


def _records(events: int) -> Iterator[tuple[int, str, int, str]]:
    """The events of the JSONL recovery scenario's log, as rows: seq, type, time, record."""
    closed_length = sum(1 for _ in _turn(1, CHUNKS_PER_STEP, closed=True))
    open_fixed = sum(1 for _ in _turn(1, 0, closed=False))
    turns = (events - open_fixed) // closed_length
    plan = [(turn, CHUNKS_PER_STEP, True) for turn in range(1, turns + 1)]
    plan.append((turns + 1, events - turns * closed_length - open_fixed, False))
    seq = 0
    for turn, chunks, closed in plan:
        for event_type, data in _turn(turn, chunks, closed=closed):
            time_ms = START_MS + seq
            yield seq, event_type, time_ms, _record_line(event_type, seq, time_ms, data)[:-1]
            seq += 1


def _store_log(dsn: str, events: int) -> int:
    """Store the recovery log in the database with ``COPY``; return its size in bytes."""
    import psycopg

    from kai_session_checkpoint_policy.persistence.postgres.store import PostgresSessionStore

    PostgresSessionStore(dsn).close()  # creates the schema
    size = 0
    with psycopg.connect(dsn) as connection:
        connection.execute(
            "INSERT INTO kai_sessions.sessions VALUES (%s, %s, 1)", (SESSION_ID, START_MS)
        )
        with connection.cursor().copy(
            "COPY kai_sessions.events (seq, type, time, record, session_id) FROM STDIN"
        ) as copy:
            for row in _records(events):
                copy.write_row((*row, SESSION_ID))
                size += len(row[3]) + 1
    return size


def _fresh(dsn: str, events: int) -> None:
    """Undo what a recovery wrote: its repair and its lease."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(
            "DELETE FROM kai_sessions.events WHERE session_id = %s AND seq >= %s",
            (SESSION_ID, events),
        )
        connection.execute("DELETE FROM kai_sessions.leases")


async def _load(dsn: str) -> tuple[float, int, int]:
    from kai_session_checkpoint_policy.persistence import PostgresSessionPersistence

    backend = PostgresSessionPersistence(dsn)
    try:
        start = time.perf_counter()
        log = await backend.load(SESSION_ID)
        seconds = time.perf_counter() - start
        return seconds, len(log.events), len(log.repair)
    finally:
        await backend.aclose()


def _measure(dsn: str, backend: str) -> dict[str, object]:
    before = _hwm_bytes()
    seconds, events, repair = anyio.run(_load, dsn, backend=backend)
    return {
        "seconds": seconds,
        "hwm_bytes": _hwm_bytes(),
        "hwm_before_bytes": before,
        "maxrss_bytes": _maxrss_bytes(),
        "events": events,
        "repair_events": repair,
    }


def _recovery(dsn: str, events: int, runs: int, backends: Sequence[str]) -> dict[str, object]:
    start = time.perf_counter()
    size = _store_log(dsn, events)
    figures: dict[str, object] = {
        "events": events,
        "record_bytes": size,
        "store_seconds": round(time.perf_counter() - start, 3),
    }
    module = "benchmarks.postgres"
    for backend in backends:
        loads = []
        for _ in range(runs):
            _fresh(dsn, events)
            loads.append(_child("measure", dsn, "-b", backend, module=module))
        figures[backend] = {
            "runs": runs,
            "load_seconds": summarize([_float(run["seconds"]) for run in loads], scale=1).to_json(),
            "peak_rss_mib": summarize(
                [_int(run["hwm_bytes"] or run["maxrss_bytes"]) for run in loads], scale=2**-20
            ).to_json(),
            "loaded_events": loads[0]["events"],
            "repair_events": loads[0]["repair_events"],
        }
    return figures


# -- all of it ------------------------------------------------------------------------------------


def postgres_figures(
    directory: Path, plan: Plan, backends: Sequence[str], events: int, runs: int
) -> dict[str, object]:
    """Start a server, measure both backends on each event loop, then recovery; or say why not."""
    from tests.support.postgres_server import PostgresServer, find_binaries, missing

    binaries = find_binaries()
    problem = missing(binaries)
    if problem is not None:
        return {"skipped": f"the PostgreSQL figures need what is missing here: {problem}"}
    assert binaries is not None
    results: dict[str, object] = {}
    with PostgresServer.start_new(binaries) as server:
        with server.admin() as admin:
            row = admin.execute("SHOW server_version").fetchone()
            settings = admin.execute(
                "SELECT name, setting FROM pg_settings "
                "WHERE name IN ('fsync', 'synchronous_commit')"
            ).fetchall()
        results["server"] = {
            "version": None if row is None else row[0],
            **{str(name): setting for name, setting in settings},
        }
        for backend in backends:
            dsn = server.dsn_for(server.create_database())
            jsonl_root = directory / f"jsonl-{backend}"
            jsonl_root.mkdir(parents=True)
            results[backend] = anyio.run(_run_loop, dsn, jsonl_root, plan, backend=backend)
        results["recovery"] = _recovery(
            server.dsn_for(server.create_database()), events, runs, backends
        )
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.postgres")
    commands = parser.add_subparsers(dest="command", required=True)
    measure = commands.add_parser(
        "measure", help="load the recovery session, report time and memory"
    )
    measure.add_argument("dsn")
    measure.add_argument("-b", "--backend", default="asyncio", choices=("asyncio", "trio"))
    args = parser.parse_args(argv)
    print(json.dumps(_measure(args.dsn, args.backend)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
