"""The targets the figures are held to, and the table printed for people."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ._support import DEFAULT_FORMAT, FORMATS

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["TARGETS", "Target", "evaluate", "table"]

Results = dict[str, object]


def _get(tree: object, *path: str) -> object:
    """``tree[path[0]][path[1]]...``, or ``None`` when a step is missing."""
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def _items(tree: object) -> list[tuple[str, object]]:
    """The entries of *tree* if it is a JSON object, else none."""
    return [(str(key), value) for key, value in tree.items()] if isinstance(tree, dict) else []


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


@dataclass(frozen=True, slots=True)
class Target:
    """A figure the suite must reach: ``value <= limit`` (or ``==`` when *exact*)."""

    name: str
    unit: str
    limit: float
    value: Callable[[Results, str], float | None]
    scope: str = "backend"  # or "recovery": the figure comes from the recovery scenario
    exact: bool = False

    def check(self, value: float) -> bool:
        return value == self.limit if self.exact else value <= self.limit


def _backend(*path: str) -> Callable[[Results, str], float | None]:
    return lambda results, backend: _number(_get(results, "backends", backend, *path))


def _loaded(log_format: str, state: str, *path: str) -> Callable[[Results, str], float | None]:
    return lambda results, backend: _number(
        _get(results, "recovery", "formats", log_format, state, backend, *path)
    )


def _zstd_over_plain(size: str) -> Callable[[Results, str], float | None]:
    """A flush's median latency in the zstd format over the plain one's, in the same run."""

    def ratio(results: Results, backend: str) -> float | None:
        formats = _get(results, "backends", backend, "formats")
        zstd, plain = (
            _number(_get(formats, name, "flush", size, "latency_us", "median"))
            for name in ("zstd", "plain")
        )
        return None if zstd is None or not plain else zstd / plain

    return ratio


STATES: Final = ("open", "closed")
"""The recovered logs: the last turn open (with a torn tail), and closed."""


TARGETS: Final = (
    Target("flush P=1, median", "x", 1.5, _backend("flush", "P=1", "ratio", "median")),
    Target("flush P=100, median", "x", 2.5, _backend("flush", "P=100", "ratio", "median")),
    Target(
        "burst K=32, writes in every group",
        "",
        1,
        _backend("checkpoints", "burst", "K=32", "max_writes_per_group"),
        exact=True,
    ),
    Target(
        "burst K=32, fsyncs in every group",
        "",
        1,
        _backend("checkpoints", "burst", "K=32", "max_fsyncs_per_group"),
        exact=True,
    ),
    Target(
        "burst K=32, group latency median",
        "x",
        3.0,
        _backend("checkpoints", "burst", "K=32", "ratio", "median"),
    ),
    Target(
        "staggered K=32, fsyncs per group (mean)",
        "",
        2.0,
        _backend("checkpoints", "staggered", "K=32", "fsyncs_per_group"),
    ),
    Target("zstd flush P=100 over plain's, median", "x", 1.1, _zstd_over_plain("P=100")),
    Target("stream append, median", "us", 5.0, _backend("stream", "append_us", "median")),
    Target(
        "policy overhead per boundary", "us", 20.0, _backend("policy", "overhead_per_boundary_us")
    ),
    Target(
        "resumed session: first flush / slowest other",
        "x",
        1.0,
        _backend("resume", "first_flush_versus_slowest_other"),
    ),
    *(
        Target(
            f"recovery, turn {state} ({log_format}): {figure}",
            unit,
            limit,
            _loaded(log_format, state, *path),
            "recovery",
        )
        for figure, unit, limit, path in (
            ("load median", "s", 0.6, ("load_seconds", "median")),
            ("peak RSS", "MiB", 350.0, ("peak_rss_mib", "p99")),
        )
        for log_format in FORMATS
        for state in STATES
    ),
)


def evaluate(results: Results) -> list[dict[str, object]]:
    """Every target, for every backend measured, with its value and whether it is met."""
    checked: list[dict[str, object]] = []
    for target in TARGETS:
        where = results.get("recovery") if target.scope == "recovery" else results.get("backends")
        backends = (
            [key for key in where if key in ("asyncio", "trio")] if isinstance(where, dict) else []
        )
        for backend in backends:
            value = target.value(results, backend)
            if value is None:
                continue
            checked.append(
                {
                    "target": target.name,
                    "backend": backend,
                    "value": round(value, 3),
                    "limit": f"{'==' if target.exact else '<='} {target.limit:g}{target.unit}",
                    "met": target.check(value),
                }
            )
    return checked


# -- the table ------------------------------------------------------------------------------------


def _fmt(value: object, spec: str, suffix: str = "") -> str:
    number = _number(value)
    return "" if number is None else f"{number:{spec}}{suffix}"


def _ratio_row(label: str, cell: object, writes: str, fsyncs: str) -> list[str]:
    return [
        label,
        *(_fmt(_get(cell, "ratio", q), ".2f", "x") for q in ("median", "p90", "p99")),
        _fmt(_get(cell, "latency_us", "median"), ".0f"),
        _fmt(_get(cell, "io_us", "median"), ".0f"),
        _fmt(_get(cell, writes), ".2f"),
        _fmt(_get(cell, fsyncs), ".2f"),
    ]


def _rows(figures: object) -> list[list[str]]:
    rows: list[list[str]] = []
    for name, cell in _items(_get(figures, "flush")):
        rows.append(_ratio_row(f"flush after {name}", cell, "writes_per_flush", "fsyncs_per_flush"))
    for mode in ("burst", "staggered"):
        for name, cell in _items(_get(figures, "checkpoints", mode)):
            label = f"{mode} {name} checkpoints"
            rows.append(_ratio_row(label, cell, "writes_per_group", "fsyncs_per_group"))
    stream = _get(figures, "stream")
    if isinstance(stream, dict):
        background = _fmt(stream["background_batches_per_run"], ".1f")
        rows.append(
            [
                f"stream: append ({stream['events']} events, us)",
                *(_fmt(_get(stream, "append_us", q), ".2f") for q in ("median", "p90", "p99")),
                "",
                "",
                _fmt(stream["writes_per_run"], ".1f"),
                _fmt(stream["fsyncs_per_run"], ".1f"),
            ]
        )
        label = f"stream: batches in the background (of {_fmt(stream['batches_per_run'], '.1f')})"
        rows.append([label, background, "", "", "", "", "", ""])
        rows.append(_ratio_row("stream: then one flush", stream["final_flush"], "", ""))
        rows.append(
            [
                "stream: total (ms)",
                *(_fmt(_get(stream, "total_ms", q), ".0f") for q in ("median", "p90", "p99")),
                "",
                "",
                "",
                "",
            ]
        )
    policy = _get(figures, "policy")
    if isinstance(policy, dict):
        rows.append(
            [
                "policy: overhead per boundary (us)",
                _fmt(policy["overhead_per_boundary_us"], ".1f"),
                "",
                "",
                _fmt(_get(policy, "turn_with_policy_us", "median"), ".0f"),
                "",
                "",
                "",
            ]
        )
    return rows


def _format(rows: list[list[str]], header: list[str], left: int = 2) -> str:
    """Columns padded to their widest cell; the first *left* columns left-aligned."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, [""] * len(header), *rows]:
        cells = zip(row, widths, strict=True)
        line = "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(cells))
        lines.append(line.rstrip())
    lines[1] = "  ".join("-" * width for width in widths)
    return "\n".join(lines)


def _format_rows(results: Results) -> list[list[str]]:
    """The figures that depend on the log's format, one column per format (first loop)."""
    names = list(FORMATS)
    rows: list[list[str]] = []
    for backend, figures in _items(results.get("backends")):
        formats = _get(figures, "formats")
        for size in ("P=1", "P=10", "P=100"):
            cells = [_get(formats, name, "flush", size, "latency_us", "median") for name in names]
            rows.append(
                [backend, f"flush after {size} (median us)"] + [_fmt(c, ".0f") for c in cells]
            )
        for label, path, spec in (
            ("stream: append (median us)", ("append_us", "median"), ".2f"),
            ("stream: then one flush (median us)", ("final_flush", "latency_us", "median"), ".0f"),
            ("stream: bytes per event", ("bytes_per_event",), ".1f"),
        ):
            cells = [_get(formats, name, "stream", *path) for name in names]
            rows.append([backend, label] + [_fmt(c, spec) for c in cells])
    recovery = _get(results, "recovery", "formats")
    if isinstance(recovery, dict):
        for backend, _ in _items(_get(recovery, DEFAULT_FORMAT, "open")):
            for state in STATES:
                for label, path, spec in (
                    ("load (median s)", ("load_seconds", "median"), ".2f"),
                    ("peak RSS (max MiB)", ("peak_rss_mib", "p99"), ".0f"),
                ):
                    cells = [_get(recovery, name, state, backend, *path) for name in names]
                    row = [backend, f"recovery, turn {state}: {label}"]
                    rows.append(row + [_fmt(c, spec) for c in cells])
        cells = [_get(recovery, name, "bytes_per_event") for name in names]
        rows.append(["", "recovery: bytes per event"] + [_fmt(c, ".1f") for c in cells])
    return rows


def table(results: Results) -> str:
    """The figures as a plain-text table, then the targets."""
    out: list[str] = []
    machine = results.get("machine")
    if isinstance(machine, dict):
        out.append(
            "machine: {nproc} CPUs ({cpu}), {memory_gib} GiB, {python}, kernel {kernel}, "
            "file system {file_system}".format(**machine)
        )
    reference = results.get("cpu_reference_us")
    if isinstance(reference, dict):
        out.append(
            f"cpu yardstick (json.dumps+loads of a chunk): {reference['start']} us at the start, "
            f"{reference['end']} us at the end"
        )
    rows: list[list[str]] = []
    for backend, figures in _items(results.get("backends")):
        base = [_fmt(_get(figures, "baseline_us", q), ".1f") for q in ("median", "p90", "p99")]
        out.append(
            f"raw baseline on {backend} (write 150 B + fsync): median {base[0]} us, "
            f"p90 {base[1]} us, p99 {base[2]} us"
        )
        rows += [[backend, *row] for row in _rows(figures)]
    if rows:
        out += [
            "",
            "ratios to the raw baseline sampled in the same rounds; us = median; io us = median",
            "time in write and fsync calls (the part a faster disk would shorten)",
            "",
        ]
        header = ["loop", "figure", "median", "p90", "p99", "us", "io us", "writes", "fsyncs"]
        out.append(_format(rows, header))
    for backend, figures in _items(results.get("backends")):
        resumed = _get(figures, "resume")
        if isinstance(resumed, dict):
            others = [_fmt(_get(resumed, "other_flushes_us", q), ".0f") for q in ("median", "p99")]
            out.append(
                f"resuming {resumed['events']:,} events on {backend}: load "
                f"{resumed['load_ms']} ms; first flush {resumed['first_flush_us']:.0f} us, the "
                f"others median {others[0]} us (p99 {others[1]} us); then one turn "
                f"{resumed['turn_ms']} ms"
            )
    formats = _format_rows(results)
    if formats:
        out += [
            "",
            f"the log's formats side by side (the targets judge {DEFAULT_FORMAT}, the default); "
            "plain packed: runs of three or more deltas of a block in one row",
            "",
            _format(formats, ["loop", "figure", *FORMATS]),
        ]
    recovery = results.get("recovery")
    if isinstance(recovery, dict):
        size = _fmt(recovery["file_bytes"], ",.0f")
        floor = recovery.get("compiled_floor")
        out += [
            "",
            f"recovery of {recovery['events']:,} events ({size} bytes, "
            f"{recovery.get('format', DEFAULT_FORMAT)}), one fresh process per "
            f"load; tracemalloc peak {recovery.get('tracemalloc_peak_mib')} MiB; decoding all "
            f"events in one json.loads call alone: "
            f"{_fmt(recovery.get('decode_floor_seconds'), '.2f')} s; the floor (reading the "
            "plain log and one compiled decode of its events into structs of the envelope and "
            f"the raw data): {_fmt(_get(floor, 'load_seconds', 'median'), '.2f')} s, "
            f"peak RSS {_fmt(_get(floor, 'peak_rss_mib', 'median'), '.0f')} MiB",
        ]
        for backend in ("asyncio", "trio"):
            figures = recovery.get(backend)
            if isinstance(figures, dict):
                load = [_fmt(_get(figures, "load_seconds", q), ".2f") for q in ("median", "p99")]
                rss = [_fmt(_get(figures, "peak_rss_mib", q), ".0f") for q in ("median", "p99")]
                maxrss = _fmt(_get(figures, "maxrss_mib", "p99"), ".0f")
                median, floor = (
                    _number(_get(figures, "load_seconds", "median")),
                    _number(_get(recovery, "compiled_floor", "load_seconds", "median")),
                )
                versus = f", {median / floor:.2f}x the floor" if median and floor else ""
                out.append(
                    f"  {backend}: load median {load[0]} s{versus} (max {load[1]} s); "
                    f"peak RSS median {rss[0]} MiB (max {rss[1]} MiB, "
                    f"{figures['peak_rss_before_load_mib']} MiB before loading; "
                    f"ru_maxrss max {maxrss} MiB)"
                )
    out += _postgres_section(results.get("postgres"))
    out += _steps_section(results.get("steps"))
    loads = ", ".join(f"{key} {value}" for key, value in _items(results.get("load_average")))
    if loads:
        out += ["", f"load average (1 min) as each part started: {loads}"]
    checked = results.get("targets")
    if isinstance(checked, list) and checked:
        rows = [
            [str(t[key]) for key in ("backend", "target", "value", "limit")]
            + ["met" if t["met"] else "MISSED"]
            for t in checked
        ]
        out += ["", "targets", "", _format(rows, ["loop", "target", "value", "limit", ""])]
    return "\n".join(out)


def _cost(cell: object) -> str:
    server = _get(cell, "server_cpu_us")
    own = _get(cell, "own_cpu_us")
    return (
        f"{_fmt(_get(cell, 'wall_us'), '.0f')} us wall ({_fmt(_get(cell, 'wall_ratio'), '.2f')}x), "
        f"{_fmt(_get(cell, 'cpu_us'), '.0f')} us CPU ({_fmt(_get(cell, 'cpu_ratio'), '.2f')}x: "
        f"user {_fmt(_get(cell, 'user_us'), '.0f')}, system {_fmt(_get(cell, 'system_us'), '.0f')}"
        + ("" if own is None else f"; {_fmt(own, '.0f')} beyond the raw pair's")
        + ")"
        + ("" if server is None else f", server {_fmt(server, '.0f')} us CPU")
    )


def _steps_section(steps: object) -> list[str]:
    """Per checkpointed step: the library, the raw pair, the peers, the rates, the memory."""
    if not isinstance(steps, dict):
        return []
    out = ["", "one agent step (a response with a tool call durable, then its result)"]
    for store in ("jsonl", "postgres"):
        figures = steps.get(store)
        if not isinstance(figures, dict):
            continue
        if "skipped" in figures:
            out.append(f"  {store}: skipped: {figures['skipped']}")
            continue
        for name, cell in _items(figures):
            load = _fmt(_get(cell, "load_average"), ".2f")
            if "skipped" in _items_dict(cell):
                out.append(f"  {store}, {name}: skipped: {_get(cell, 'skipped')}")
            elif _get(cell, "library") is not None:
                raw = _get(cell, "raw_pair")
                out.append(
                    f"  {store}, {name} (load {load}): {_cost(_get(cell, 'library'))}; raw pair "
                    f"{_fmt(_get(raw, 'wall_us'), '.0f')} us wall, "
                    f"{_fmt(_get(raw, 'cpu_us'), '.0f')} us CPU (user "
                    f"{_fmt(_get(raw, 'user_us'), '.0f')}, system "
                    f"{_fmt(_get(raw, 'system_us'), '.0f')})"
                    + (
                        ""
                        if _get(raw, "server_cpu_us") is None
                        else f", server {_fmt(_get(raw, 'server_cpu_us'), '.0f')} us CPU"
                    )
                )
            elif _get(cell, "graph") is not None:
                versions = ", ".join(f"{k} {v}" for k, v in _items(_get(cell, "versions")))
                out.append(
                    f"  {store}, {name} ({versions}; load {load}): graph "
                    f"{_cost(_get(cell, 'graph'))}; two puts {_cost(_get(cell, 'two_puts'))}"
                )
            else:
                rates = ", ".join(
                    f"{key} {value}" for key, value in _items(cell) if key != "load_average"
                )
                out.append(f"  {store}, {name} (load {load}): {rates}")
    memory = steps.get("memory")
    if isinstance(memory, dict):
        out.append(
            f"  memory (load {_fmt(memory.get('load_average'), '.2f')}): "
            f"{memory.get('events')} events live {memory.get('live_mib')} MiB, resumed "
            f"{memory.get('resumed_mib')} MiB ({_fmt(memory.get('ratio'), '.2f')}x); per live "
            f"session with one 37-event turn {memory.get('per_live_session_kib_37_events')} KiB"
        )
    out += _original_lines(steps.get("original"))
    goals = step_goals(steps)
    if goals:
        out += ["", "goals of a step, from this run", ""]
        out.append(_format([list(goal) for goal in goals], ["goal", "figure", ""]))
    return out


def _original_lines(original: object) -> list[str]:
    """The burst of 32 checkpoints here and in the original harness, per format."""
    if not isinstance(original, dict):
        return []
    title = "  a burst of 32 checkpoints against the original"
    if "skipped" in original:
        return [f"{title}: skipped: {original['skipped']}"]
    out = [
        f"{title} (original {original.get('original_commit')} on Node.js {original.get('node')}; "
        f"load {_fmt(original.get('load_average'), '.2f')}; medians of {original.get('passes')} "
        f"passes of {original.get('rounds')} rounds):"
    ]
    for name in ("plain", "zstd"):
        cell = original.get(name)
        sides = []
        for side, label in (("library", "here"), ("original", "the original")):
            figures = _get(cell, side)
            sides.append(
                f"{label} {_fmt(_get(figures, 'wall_us'), '.0f')} us wall "
                f"({_fmt(_get(figures, 'raw_ratio'), '.2f')}x its raw write+fsync of "
                f"{_fmt(_get(figures, 'bytes'), '.0f')} bytes), "
                f"{_fmt(_get(figures, 'cpu_us'), '.0f')} us CPU"
            )
        out.append(f"    {name}: {'; '.join(sides)}: {_fmt(_get(cell, 'ratio'), '.2f')}x")
    return out


def _ratio_of(numerator: object, denominator: object) -> float | None:
    if isinstance(numerator, (int, float)) and isinstance(denominator, (int, float)):
        return round(numerator / denominator, 2) if denominator else None
    return None


def step_goals(steps: dict[str, object]) -> list[tuple[str, str, str]]:
    """Each goal of the ``steps`` scenario that this run measured: the goal, the figure, and
    ``met`` or ``missed``."""
    goals: list[tuple[str, str, str]] = []

    def check(goal: str, value: object, ok: bool | None, shown: str) -> None:
        if value is not None and ok is not None:
            goals.append((goal, shown, "met" if ok else "missed"))

    for store in ("jsonl", "postgres"):
        for loop in ("asyncio", "trio"):
            own = _get(steps, store, f"1 session, {loop}", "library", "own_cpu_us")
            if isinstance(own, (int, float)):
                check(
                    f"{store}, {loop}: CPU per step beyond the raw pair's <= 150 us",
                    own,
                    own <= 150,
                    f"{own:.0f} us",
                )
    one = _get(steps, "postgres", "1 session, asyncio", "library")
    puts = _get(steps, "postgres", "PostgresSaver", "two_puts", "wall_us")
    graph = _get(steps, "postgres", "PostgresSaver", "graph", "wall_us")
    for name, peer in (("two puts", puts), ("graph", graph)):
        ratio = _ratio_of(_get(one, "wall_us"), peer)
        if ratio is not None:
            check(
                f"postgres, 1 session: latency <= 0.8x PostgresSaver's ({name})",
                ratio,
                ratio <= 0.8,
                f"{ratio:.2f}x",
            )
    wall_ratio = _get(one, "wall_ratio")
    if isinstance(wall_ratio, (int, float)):
        check(
            "postgres, 1 session: latency <= 1.3x the raw pair of commits",
            wall_ratio,
            wall_ratio <= 1.3,
            f"{wall_ratio:.2f}x",
        )
    for store, key, goal, floor in (
        ("jsonl", "ratio", ">= 0.6x the raw write+fsync pairs' rate", 0.6),
        ("postgres", "ratio_to_commit_pairs", "above the single-row commit loop's pairs", 1.0),
    ):
        for name, cell in _items(steps.get(store)):
            rate = _get(cell, key)
            if name.endswith("sessions at once, asyncio") and isinstance(rate, (int, float)):
                count = name.split()[0]
                check(
                    f"{store}, {count} sessions at once: {goal}",
                    rate,
                    rate >= floor if floor < 1 else rate > floor,
                    f"{rate:.2f}x",
                )
    for name in ("plain", "zstd"):
        burst = _get(steps, "original", name, "ratio")
        if isinstance(burst, (int, float)):
            check(
                f"a burst of 32 checkpoints, {name}: <= 0.5x the original's latency",
                burst,
                burst <= 0.5,
                f"{burst:.2f}x",
            )
    memory = steps.get("memory")
    held = _get(memory, "ratio")
    if isinstance(held, (int, float)):
        check("a live session <= 1.5x the same log resumed", held, held <= 1.5, f"{held:.2f}x")
    per_session = _get(memory, "per_live_session_kib_37_events")
    if isinstance(per_session, (int, float)):
        check(
            "a live session with one 37-event turn <= 40 KiB",
            per_session,
            per_session <= 40,
            f"{per_session} KiB",
        )
    return goals


def _items_dict(tree: object) -> dict[str, object]:
    return dict(_items(tree))


def _postgres_section(postgres: object) -> list[str]:
    """The PostgreSQL figures beside JSONL's, or why they were not taken."""
    if not isinstance(postgres, dict):
        return []
    if "skipped" in postgres:
        return ["", f"PostgreSQL figures skipped: {postgres['skipped']}"]
    server = _get(postgres, "server")
    out = [
        "",
        f"PostgreSQL {_get(server, 'version')} (fsync {_get(server, 'fsync')}, "
        f"synchronous_commit {_get(server, 'synchronous_commit')}), a server of the benchmark's "
        "own on a Unix socket, beside JSONL in the same run; each ratio is to its own baseline",
    ]
    rows: list[list[str]] = []
    for loop in ("asyncio", "trio"):
        figures = postgres.get(loop)
        if not isinstance(figures, dict):
            continue
        for name, key in (("insert", "baseline_insert_us"), ("write", "baseline_write_fsync_us")):
            base = [_fmt(_get(figures, key, q), ".1f") for q in ("median", "p90", "p99")]
            what = "one-row INSERT + COMMIT" if name == "insert" else "raw write 150 B + fsync"
            out.append(
                f"baseline on {loop} ({what}): median {base[0]} us, p90 {base[1]} us, "
                f"p99 {base[2]} us"
            )
        for figure, _cell in _items(_get(figures, "postgres")):
            for backend in ("postgres", "jsonl"):
                cell = _get(figures, backend, figure)
                rows.append(
                    [
                        loop,
                        figure,
                        backend,
                        _fmt(_get(cell, "latency_us", "median"), ".0f"),
                        _fmt(_get(cell, "latency_us", "p90"), ".0f"),
                        _fmt(_get(cell, "ratio", "median"), ".2f", "x"),
                        _fmt(_get(cell, "commits_per_sample"), ".2f"),
                        _fmt(_get(cell, "max_commits_per_sample"), ".0f"),
                    ]
                )
    if rows:
        header = ["loop", "figure", "backend", "us", "p90 us", "ratio", "commits", "max"]
        out += [
            "commits: transactions (PostgreSQL) or fsyncs (JSONL) per sample; max: the most in one",
            "",
            _format(rows, header, left=3),
        ]
    recovery = postgres.get("recovery")
    if isinstance(recovery, dict):
        out.append("")
        out.append(
            f"PostgreSQL recovery of {recovery['events']:,} events "
            f"({_fmt(recovery['record_bytes'], ',.0f')} bytes of records, stored with COPY in "
            f"{_fmt(recovery['store_seconds'], '.1f')} s), one fresh process per load"
        )
        for loop in ("asyncio", "trio"):
            figures = recovery.get(loop)
            if isinstance(figures, dict):
                load = [_fmt(_get(figures, "load_seconds", q), ".2f") for q in ("median", "p99")]
                rss = _fmt(_get(figures, "peak_rss_mib", "p99"), ".0f")
                out.append(
                    f"  {loop}: load median {load[0]} s (max {load[1]} s); peak RSS {rss} MiB; "
                    f"{figures['repair_events']} repair events"
                )
    return out
