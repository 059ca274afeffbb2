"""The benchmark suite still runs: ``python -m benchmarks --quick`` and its structural facts.

Speed is measured by the suite itself, never asserted here; these checks only pin what must
hold on any machine, such as "a burst of 32 checkpoints costs exactly one write and one fsync".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Generator
from pathlib import Path

import pytest
from benchmarks import report

from .support.postgres_server import REQUIRE_ENV

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, object], Path]:
    directory = tmp_path_factory.mktemp("bench")
    chart = directory / "flush.svg"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "benchmarks", "--quick", "--json", "--svg", str(chart)]
    completed = subprocess.run(
        [*command, "--dir", str(directory)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    results = json.loads(completed.stdout)
    assert isinstance(results, dict)
    return results, chart


def _dig(tree: object, *path: str) -> object:
    for key in path:
        assert isinstance(tree, dict), f"{key!r} missing"
        assert key in tree, f"{key!r} missing from {sorted(tree)}"
        tree = tree[key]
    return tree


def _number(tree: object, *path: str) -> float:
    value = _dig(tree, *path)
    assert isinstance(value, (int, float)), f"{path} is {value!r}"
    return value


BACKENDS = ("asyncio", "trio")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size", [1, 10, 100])
def test_every_flush_is_one_write_and_one_fsync(
    quick_run: tuple[dict[str, object], Path], backend: str, size: int
) -> None:
    cell = _dig(quick_run[0], "backends", backend, "flush", f"P={size}")
    assert _dig(cell, "writes_per_flush") == 1
    assert _dig(cell, "fsyncs_per_flush") == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k", [1, 8, 32])
def test_a_burst_of_checkpoints_is_one_write_and_one_fsync(
    quick_run: tuple[dict[str, object], Path], backend: str, k: int
) -> None:
    cell = _dig(quick_run[0], "backends", backend, "checkpoints", "burst", f"K={k}")
    for key in ("min_writes_per_group", "max_writes_per_group"):
        assert _dig(cell, key) == 1
    for key in ("min_fsyncs_per_group", "max_fsyncs_per_group"):
        assert _dig(cell, key) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_staggered_checkpoints_fsync_every_write(
    quick_run: tuple[dict[str, object], Path], backend: str
) -> None:
    cell = _dig(quick_run[0], "backends", backend, "checkpoints", "staggered", "K=32")
    writes = _number(cell, "writes_per_group")
    assert writes >= 1
    assert _number(cell, "fsyncs_per_group") == writes


@pytest.mark.parametrize("backend", BACKENDS)
def test_stream_is_written_in_batches(
    quick_run: tuple[dict[str, object], Path], backend: str
) -> None:
    stream = _dig(quick_run[0], "backends", backend, "stream")
    writes = _number(stream, "writes_per_run")
    assert writes == _number(stream, "fsyncs_per_run") == _number(stream, "batches_per_run")
    assert 1 <= writes < _number(stream, "events")
    assert _number(stream, "background_batches_per_run") < writes


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_policy_checkpoints_every_boundary(
    quick_run: tuple[dict[str, object], Path], backend: str
) -> None:
    policy = _dig(quick_run[0], "backends", backend, "policy")
    assert _dig(policy, "flushes_per_turn") == _dig(policy, "boundaries_per_turn") == 5


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_telemetry_scenario_measures_each_host(
    quick_run: tuple[dict[str, object], Path], backend: str
) -> None:
    telemetry = _dig(quick_run[0], "backends", backend, "telemetry")
    assert _number(telemetry, "turns") == 10
    for host in ("without", "api_only", "sdk_in_memory"):
        assert _number(telemetry, f"cpu_per_step_{host}_us", "median") > 0
    assert _number(telemetry, "api_only_ratio") > 0
    assert _number(telemetry, "sdk_spans_per_turn") == 5  # one per checkpoint


@pytest.mark.parametrize("backend", BACKENDS)
def test_recovery_loads_every_event_and_repairs_the_open_turn(
    quick_run: tuple[dict[str, object], Path], backend: str
) -> None:
    recovery = _dig(quick_run[0], "recovery")
    figures = _dig(recovery, backend)
    assert _dig(figures, "repair_events") == 3  # the unknown tool result, step/end, turn/end
    assert _number(figures, "loaded_events") == _number(recovery, "events") + 3
    assert _dig(figures, "torn_bytes") != 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("state", ["open", "closed"])
@pytest.mark.parametrize("log_format", ["plain", "plain packed", "zstd"])
def test_every_format_is_recovered_with_its_turn_open_and_closed(
    quick_run: tuple[dict[str, object], Path], backend: str, state: str, log_format: str
) -> None:
    recovery = _dig(quick_run[0], "recovery")
    figures = _dig(recovery, "formats", log_format, state, backend)
    assert _number(figures, "loaded_events") == _number(recovery, "events") + 3
    assert _dig(figures, "repair_events") == (3 if state == "open" else 0)
    assert (_dig(figures, "torn_bytes") != 0) is (state == "open")
    assert _number(figures, "load_seconds", "median") > 0
    assert _number(figures, "peak_rss_mib", "median") > 0


def test_the_compiled_floor_is_measured_in_the_same_run(
    quick_run: tuple[dict[str, object], Path],
) -> None:
    floor = _dig(quick_run[0], "recovery", "compiled_floor")
    assert _number(floor, "load_seconds", "n") == _number(floor, "peak_rss_mib", "n") == 1
    assert _number(floor, "load_seconds", "median") > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_resumed_session_is_flushed_and_runs_a_turn(
    quick_run: tuple[dict[str, object], Path], backend: str
) -> None:
    resumed = _dig(quick_run[0], "backends", backend, "resume")
    assert _dig(resumed, "events") == _dig(quick_run[0], "plan", "resumed_events") == 2_000
    assert _number(resumed, "other_flushes_us", "n") == _dig(
        quick_run[0], "plan", "samples_per_round"
    )
    first, slowest = _number(resumed, "first_flush_us"), _number(resumed, "other_flushes_us", "p99")
    assert _number(resumed, "first_flush_versus_slowest_other") == pytest.approx(
        first / slowest, rel=0.05
    )
    assert _number(resumed, "turn_ms") > 0


def test_every_target_is_evaluated(quick_run: tuple[dict[str, object], Path]) -> None:
    targets = _dig(quick_run[0], "targets")
    assert isinstance(targets, list)
    names = {target["target"] for target in targets}
    assert names == {target.name for target in report.TARGETS}
    assert len(names) == 10 + 2 * 2 * 3  # and a load time and a peak per format and turn
    assert {target["backend"] for target in targets} == set(BACKENDS)


@pytest.mark.parametrize(
    ("zstd", "plain", "met"), [(1100.0, 1000.0, True), (1101.0, 1000.0, False)]
)
def test_a_zstd_flush_is_judged_against_the_plain_one_of_the_same_run(
    zstd: float, plain: float, met: bool
) -> None:
    def flush(median: float) -> dict[str, object]:
        return {"flush": {"P=100": {"latency_us": {"median": median}}}}

    results: dict[str, object] = {
        "backends": {"asyncio": {"formats": {"zstd": flush(zstd), "plain": flush(plain)}}}
    }
    [checked] = [
        target
        for target in report.evaluate(results)
        if target["target"] == "zstd flush P=100 over plain's, median"
    ]
    assert checked == {
        "target": "zstd flush P=100 over plain's, median",
        "backend": "asyncio",
        "value": round(zstd / plain, 3),
        "limit": "<= 1.1x",
        "met": met,
    }


def test_the_chart_is_an_svg_with_every_group(quick_run: tuple[dict[str, object], Path]) -> None:
    svg = quick_run[1].read_text(encoding="utf-8")
    assert svg.startswith("<svg ")
    assert svg.rstrip().endswith("</svg>")
    for label in ("P=1", "P=100", "burst checkpoints", "staggered checkpoints", "K=32"):
        assert label in svg


# -- PostgreSQL beside JSONL --------------------------------------------------------------------


def _postgres(quick_run: tuple[dict[str, object], Path]) -> object:
    figures = _dig(quick_run[0], "postgres")
    if isinstance(figures, dict) and "skipped" in figures:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1, but {figures['skipped']}")
        pytest.skip(str(figures["skipped"]))
    return figures


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("store", ["postgres", "jsonl"])
def test_each_flush_and_each_burst_is_one_commit_on_both_stores(
    quick_run: tuple[dict[str, object], Path], backend: str, store: str
) -> None:
    figures = _dig(_postgres(quick_run), backend, store)
    for figure in ("flush P=1", "flush P=100", "burst K=32"):
        cell = _dig(figures, figure)
        assert _dig(cell, "min_commits_per_sample") == _dig(cell, "max_commits_per_sample") == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_100_sessions_at_once_share_transactions_and_syncs(
    quick_run: tuple[dict[str, object], Path], backend: str
) -> None:
    figures = _dig(_postgres(quick_run), backend)
    jsonl = _dig(figures, "jsonl", "100 sessions at once")
    if _dig(jsonl, "shared_sync") is False:  # a filesystem whose syncfs is not trusted
        assert _number(jsonl, "commits_per_sample") == 100
        return
    for store in ("jsonl", "postgres"):
        cell = _dig(figures, store, "100 sessions at once")
        assert _number(cell, "min_commits_per_sample") >= 1
        # Group commit, and one syncfs for the batches of many logs: batches that arrive while
        # a commit or a sync is in flight share the next one. (One sample may take many, when
        # the event loop is descheduled between checkpoints.)
        assert _number(cell, "commits_per_sample") <= 25, store


@pytest.mark.parametrize("backend", BACKENDS)
def test_postgres_recovery_loads_every_event_and_repairs_the_open_turn(
    quick_run: tuple[dict[str, object], Path], backend: str
) -> None:
    recovery = _dig(_postgres(quick_run), "recovery")
    figures = _dig(recovery, backend)
    assert _dig(figures, "repair_events") == 3
    assert _number(figures, "loaded_events") == _number(recovery, "events") + 3


def test_the_postgres_figures_are_skipped_with_a_note_without_the_server_programs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from benchmarks.__main__ import QUICK
    from benchmarks.postgres import postgres_figures

    from tests.support import postgres_server

    monkeypatch.setattr(postgres_server, "find_binaries", lambda: None)
    figures = postgres_figures(tmp_path, QUICK, BACKENDS, 1000, 1)

    assert figures == {
        "skipped": "the PostgreSQL figures need what is missing here: no PostgreSQL server "
        "programs (initdb, pg_ctl, postgres) on PATH, in 'pg_config --bindir' or in "
        "/usr/lib/postgresql/*/bin"
    }
    assert report.table({"postgres": figures}).splitlines()[-1] == (
        f"PostgreSQL figures skipped: {figures['skipped']}"
    )


# -- one agent step -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_step_is_measured_beside_its_raw_pair_with_cpu_and_the_load(
    quick_run: tuple[dict[str, object], Path], backend: str
) -> None:
    cell = _dig(quick_run[0], "steps", "jsonl", f"1 session, {backend}")
    assert isinstance(_dig(cell, "load_average"), float)
    for key in ("wall_us", "cpu_us", "wall_ratio", "cpu_ratio"):
        assert _number(cell, "library", key) > 0
    for key in ("wall_us", "cpu_us", "user_us", "system_us"):
        assert _number(cell, "raw_pair", key) >= 0
    assert _number(cell, "raw_pair", "cpu_us") > 0
    own = _number(cell, "library", "own_cpu_us")
    assert own == pytest.approx(
        _number(cell, "library", "cpu_us") - _number(cell, "raw_pair", "cpu_us"), abs=0.11
    )
    table = report.table(quick_run[0])
    assert "jsonl, 1 session, " + backend in table
    assert f"jsonl, {backend}: CPU per step beyond the raw pair's <= 150 us" in table


def _step_figures(own: float, latency: float, rate: float, held: float) -> dict[str, object]:
    """The figures of the steps scenario that its goals read: *own* CPU beyond the raw pair,
    *latency* of a PostgreSQL step, the *rate* of many sessions, the memory *held* live."""
    one = {"library": {"own_cpu_us": own, "wall_us": latency, "wall_ratio": latency / 1000}}
    return {
        "jsonl": {
            "1 session, asyncio": one,
            "100 sessions at once, asyncio": {"ratio": rate},
        },
        "postgres": {
            "1 session, asyncio": one,
            "PostgresSaver": {"two_puts": {"wall_us": 1000.0}, "graph": {"wall_us": 10000.0}},
            "100 sessions at once, asyncio": {"ratio_to_commit_pairs": rate},
        },
        "memory": {"ratio": held, "per_live_session_kib_37_events": 30.0},
    }


def test_the_goals_of_a_step_are_met_only_by_figures_within_them() -> None:
    met = report.step_goals(_step_figures(own=150.0, latency=800.0, rate=1.2, held=1.5))
    missed = report.step_goals(_step_figures(own=151.0, latency=1301.0, rate=0.5, held=1.6))

    assert [verdict for _, _, verdict in met] == ["met"] * 9
    assert [(goal, figure, verdict) for goal, figure, verdict in missed if verdict == "missed"] == [
        ("jsonl, asyncio: CPU per step beyond the raw pair's <= 150 us", "151 us", "missed"),
        ("postgres, asyncio: CPU per step beyond the raw pair's <= 150 us", "151 us", "missed"),
        ("postgres, 1 session: latency <= 0.8x PostgresSaver's (two puts)", "1.30x", "missed"),
        ("postgres, 1 session: latency <= 1.3x the raw pair of commits", "1.30x", "missed"),
        ("jsonl, 100 sessions at once: >= 0.6x the raw write+fsync pairs' rate", "0.50x", "missed"),
        (
            "postgres, 100 sessions at once: above the single-row commit loop's pairs",
            "0.50x",
            "missed",
        ),
        ("a live session <= 1.5x the same log resumed", "1.60x", "missed"),
    ]


def test_many_sessions_and_memory_are_measured(quick_run: tuple[dict[str, object], Path]) -> None:
    steps = _dig(quick_run[0], "steps")
    many = _dig(steps, "jsonl", "20 sessions at once, asyncio")
    assert _number(many, "steps_per_s") > 0
    assert _number(many, "raw_pairs_per_s") > 0
    memory = _dig(steps, "memory")
    assert _dig(memory, "events") == 20_000
    assert _number(memory, "live_mib") > 0
    assert _number(memory, "resumed_mib") > 0


def test_a_rate_with_a_failed_client_is_refused() -> None:
    from benchmarks.steps import _rate

    def worker(index: int, stop: threading.Event) -> int:
        if index == 1:
            raise OSError("too many clients already")
        stop.wait(10)
        return 1000

    with pytest.raises(RuntimeError, match=r"^1 of 3 clients failed, the first with OSError\("):
        _rate(worker, 3, 10)  # ends as the client fails, not after 10 seconds


def test_the_steps_server_has_a_connection_for_every_client_of_the_commit_loop() -> None:
    from benchmarks.steps import FULL_STEPS, _insert_loop, _rate, server_settings

    from tests.support.postgres_server import PostgresServer, find_binaries, require_binaries

    binaries = require_binaries(find_binaries())
    clients = FULL_STEPS.sessions
    for settings, refused in (({}, True), (server_settings(FULL_STEPS), False)):
        with PostgresServer.start_new(binaries, settings) as server:
            database = server.create_database()
            with server.admin(database) as admin:
                admin.execute("CREATE TABLE kai_bench_rows (line text)")
            dsn = server.dsn_for(database)
            if refused:  # the tests' own settings: fewer connections than clients
                with pytest.raises(RuntimeError, match="too many clients already"):
                    _rate(_insert_loop(dsn), clients, 0.2)
            else:
                assert _rate(_insert_loop(dsn), clients, 0.2) > 0


def test_a_peer_that_is_not_installed_is_skipped_with_a_note(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from benchmarks.steps import QUICK_STEPS, _langgraph_peer

    monkeypatch.setitem(sys.modules, "langgraph.checkpoint.sqlite", None)  # import fails

    def unused(module: object) -> Generator[object, None, None]:
        raise AssertionError("no saver is made without its package")

    figures = _langgraph_peer("langgraph.checkpoint.sqlite", QUICK_STEPS, unused, print)

    assert figures == {
        "skipped": "install langgraph-checkpoint-sqlite and langgraph (the 'bench' extra)"
    }
    table = report.table({"steps": {"jsonl": {"SqliteSaver": figures}}})
    assert table.splitlines()[-1] == (
        "  jsonl, SqliteSaver: skipped: install langgraph-checkpoint-sqlite and langgraph "
        "(the 'bench' extra)"
    )


# -- the burst against the original harness -----------------------------------------------------


@pytest.mark.parametrize(
    ("version", "problem"),
    [
        ("v22.19.0\n", None),
        ("v24.1.3", None),
        ("v22.18.9", "the original needs Node.js 22.19 or newer, and this one is v22.18.9"),
        ("v20.20.2\n", "the original needs Node.js 22.19 or newer, and this one is v20.20.2"),
        ("node 22", "Node.js printed no version it could be judged by: 'node 22'"),
    ],
)
def test_the_original_runs_only_on_a_node_it_accepts(version: str, problem: str | None) -> None:
    from benchmarks.original import node_problem

    assert node_problem(version) == problem


def test_the_original_is_skipped_with_a_note_without_a_checkout(tmp_path: Path) -> None:
    from benchmarks.original import original_figures

    figures = original_figures(tmp_path, checkout=None)

    assert figures == {
        "skipped": "no checkout of the original was given (--original DIR, with its session "
        "packages built)"
    }
    table = report.table({"steps": {"original": figures}})
    assert table.splitlines()[-1] == (
        "  a burst of 32 checkpoints against the original: skipped: no checkout of the "
        "original was given (--original DIR, with its session packages built)"
    )


def test_a_node_that_does_not_run_or_an_original_that_fails_is_named(tmp_path: Path) -> None:
    from benchmarks.original import original_figures

    missing = original_figures(tmp_path, checkout=tmp_path, node=str(tmp_path / "no-node"))
    assert str(missing["skipped"]).startswith(f"Node.js did not run as '{tmp_path / 'no-node'}'")

    # A Node.js of the right version whose run of the original fails (a checkout not built).
    node = tmp_path / "node"
    node.write_text(
        '#!/bin/sh\nif [ "$1" = --version ]; then echo v22.19.0; exit 0; fi\n'
        "echo \"Error: Cannot find module '$3/vendor/cordis/lib/index.js'\" >&2\nexit 1\n"
    )
    node.chmod(0o755)
    failed = original_figures(tmp_path / "runs", checkout=tmp_path, node=str(node), passes=1)
    assert failed == {
        "skipped": "the original's side failed: Error: Cannot find module "
        f"'{tmp_path}/vendor/cordis/lib/index.js'"
    }


@pytest.mark.parametrize("log_format", ["plain", "zstd"])
def test_this_librarys_burst_is_one_write_and_one_fsync_of_every_call(
    tmp_path: Path, log_format: str
) -> None:
    import anyio
    from benchmarks.original import BURST, our_bursts

    from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence

    rounds = anyio.run(our_bursts, tmp_path, log_format, 3, 1)

    assert [(item["writes"], item["fsyncs"]) for item in rounds] == [(1, 1)] * 3
    assert all(item["bytes"] > 0 and item["raw"]["wall"] > 0 for item in rounds)
    stored = anyio.run(JsonlSessionPersistence(tmp_path).inspect, f"burst-{log_format}").events
    assert [event.type for event in stored] == ["turn/start"] + ["tool/call"] * (4 * BURST)
    assert [event.data["callId"] for event in stored[1:]] == [
        f"call-{step}" for step in range(1, 4 * BURST + 1)
    ]


def test_the_burst_goal_is_met_only_within_half_the_originals_latency() -> None:
    def figures(ratio: float) -> dict[str, object]:
        cell = {"library": {}, "original": {}, "ratio": ratio}
        return {"original": {"plain": cell, "zstd": {**cell, "ratio": 0.2}}}

    assert report.step_goals(figures(0.5)) == [
        ("a burst of 32 checkpoints, plain: <= 0.5x the original's latency", "0.50x", "met"),
        ("a burst of 32 checkpoints, zstd: <= 0.5x the original's latency", "0.20x", "met"),
    ]
    assert report.step_goals(figures(0.51))[0] == (
        "a burst of 32 checkpoints, plain: <= 0.5x the original's latency",
        "0.51x",
        "missed",
    )
