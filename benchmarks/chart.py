"""A self-contained SVG chart of flush latency against batch size and concurrency.

Bars are median latencies as multiples of the raw write+fsync baseline's median, one bar per
event loop; the pale lower part of a bar is the median time spent in ``write`` and ``fsync``
calls, the thin line on each bar reaches the p90 latency on the same scale, and a red dash
marks a target. No plotting library is needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final
from xml.sax.saxutils import escape

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["render_svg"]

WIDTH: Final = 760
HEIGHT: Final = 380
LEFT: Final = 56
RIGHT: Final = 16
TOP: Final = 44
BOTTOM: Final = 78
COLOURS: Final = {"asyncio": "#3b6ea5", "trio": "#d9822b"}


TARGETS: Final = {
    ("batch size", "P=1"): 1.5,
    ("batch size", "P=100"): 2.5,
    ("burst checkpoints", "K=32"): 3.0,
}


Bar = tuple[float, float, float]
"""Median latency, p90 latency, and median time in write and fsync calls (0 if unknown)."""


def _ratios(cell: object) -> Bar | None:
    """The :data:`Bar` of *cell*, each figure divided by its baseline's median."""
    if not isinstance(cell, dict):
        return None
    latency, baseline, io = cell.get("latency_us"), cell.get("baseline_us"), cell.get("io_us")
    if not isinstance(latency, dict) or not isinstance(baseline, dict):
        return None
    median, p90, base = latency.get("median"), latency.get("p90"), baseline.get("median")
    numbers = [value for value in (median, p90, base) if isinstance(value, (int, float))]
    if len(numbers) != 3 or not numbers[2]:
        return None
    spent = io.get("median") if isinstance(io, dict) else None
    io_ratio = spent / numbers[2] if isinstance(spent, (int, float)) else 0.0
    return numbers[0] / numbers[2], numbers[1] / numbers[2], io_ratio


def _groups(backends: Mapping[str, object]) -> list[tuple[str, str, dict[str, Bar]]]:
    """(section, label, {backend: bar}) for every bar group, in chart order."""
    groups: list[tuple[str, str, dict[str, Bar]]] = []
    paths: list[tuple[str, tuple[str, ...], str]] = [("batch size", ("flush",), "P=")]
    for mode in ("burst", "staggered"):
        paths.append((f"{mode} checkpoints", ("checkpoints", mode), "K="))
    for section, path, prefix in paths:
        labels: list[str] = []
        for figures in backends.values():
            cells: object = figures
            for key in path:
                cells = cells.get(key) if isinstance(cells, dict) else None
            if isinstance(cells, dict):
                labels += [
                    label for label in cells if label.startswith(prefix) and label not in labels
                ]
        for label in labels:
            bars: dict[str, Bar] = {}
            for backend, figures in backends.items():
                cell: object = figures
                for key in (*path, label):
                    cell = cell.get(key) if isinstance(cell, dict) else None
                ratios = _ratios(cell)
                if ratios is not None:
                    bars[backend] = ratios
            groups.append((section, label, bars))
    return groups


def render_svg(results: Mapping[str, object]) -> str:
    """The chart for *results* (as printed by ``python -m benchmarks --json``)."""
    backends = results.get("backends")
    if not isinstance(backends, dict) or not backends:
        raise ValueError("the results hold no flush or checkpoint figures")
    groups = _groups(backends)
    top = max([bar[1] for _, _, bars in groups for bar in bars.values()] + [3.0])
    scale_max = float(int(top) + 1)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def y(value: float) -> float:
        return TOP + plot_h * (1 - value / scale_max)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="18" text-anchor="middle" font-size="14">'
        "Flush latency as a multiple of one raw write+fsync (bar: median; line: p90)</text>",
    ]
    step = 1.0 if scale_max <= 6 else 2.0
    tick = 0.0
    while tick <= scale_max:
        out.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
            f'stroke="#ddd"/><text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">'
            f"{tick:g}x</text>"
        )
        tick += step
    out.append(
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(1):.1f}" y2="{y(1):.1f}" '
        'stroke="#444" stroke-dasharray="4 3"/>'
    )
    slot = plot_w / max(1, len(groups))
    names = list(backends)
    bar_w = slot * 0.7 / max(1, len(names))
    section_start: dict[str, float] = {}
    for index, (section, label, bars) in enumerate(groups):
        x0 = LEFT + index * slot
        section_start.setdefault(section, x0)
        for position, backend in enumerate(names):
            if backend not in bars:
                continue
            median, p90, io = bars[backend]
            x = x0 + slot * 0.15 + position * bar_w
            colour = COLOURS.get(backend, "#777")
            out.append(
                f'<rect x="{x:.1f}" y="{y(median):.1f}" width="{bar_w - 2:.1f}" '
                f'height="{y(0) - y(median):.1f}" fill="{colour}"><title>{escape(backend)} '
                f"{escape(section)} {escape(label)}: median {median:.2f}x, p90 {p90:.2f}x, "
                f"in write and fsync {io:.2f}x</title></rect>"
            )
            if io:
                out.append(
                    f'<rect x="{x:.1f}" y="{y(min(io, median)):.1f}" width="{bar_w - 2:.1f}" '
                    f'height="{y(0) - y(min(io, median)):.1f}" fill="white" '
                    'fill-opacity="0.45"/>'
                )
            middle = x + (bar_w - 2) / 2
            out.append(
                f'<line x1="{middle:.1f}" x2="{middle:.1f}" y1="{y(median):.1f}" '
                f'y2="{y(p90):.1f}" stroke="{colour}" stroke-width="1.5"/>'
            )
        out.append(
            f'<text x="{x0 + slot / 2:.1f}" y="{y(0) + 15:.1f}" text-anchor="middle">'
            f"{escape(label)}</text>"
        )
        target = TARGETS.get((section, label))
        if target is not None:
            out.append(
                f'<line x1="{x0 + slot * 0.08:.1f}" x2="{x0 + slot * 0.92:.1f}" '
                f'y1="{y(target):.1f}" y2="{y(target):.1f}" stroke="#c0392b" stroke-width="2">'
                f"<title>target: {target:g}x</title></line>"
            )
    starts = list(section_start.items())
    for index, (section, start) in enumerate(starts):
        end = starts[index + 1][1] if index + 1 < len(starts) else WIDTH - RIGHT
        out.append(
            f'<text x="{(start + end) / 2:.1f}" y="{y(0) + 32:.1f}" text-anchor="middle" '
            f'font-weight="bold">{escape(section)}</text>'
        )
    legend_x = LEFT
    for backend in names:
        out.append(
            f'<rect x="{legend_x}" y="{HEIGHT - 22}" width="12" height="12" '
            f'fill="{COLOURS.get(backend, "#777")}"/><text x="{legend_x + 16}" '
            f'y="{HEIGHT - 12}">{escape(backend)}</text>'
        )
        legend_x += 90
    out.append(
        f'<text x="{legend_x + 10}" y="{HEIGHT - 12}">pale: time in write and fsync; '
        "dashed: 1x (150 B + fsync); red: target</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"
