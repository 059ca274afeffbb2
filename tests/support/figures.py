"""What the reliability suites did, counted, and shown at the end of pytest's terminal summary.

Each suite adds its counts with :func:`add`; the first call registers :class:`Figures` as a
pytest plugin of the running session, so the summary line appears only when one of the suites
ran, and no conftest is involved. Each test also records its own counts as junit properties.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import pytest

__all__ = ["Figures", "add"]

PLUGIN_NAME: Final = "kai-reliability-figures"


@dataclass
class Figures:
    crash_points_killed: int = 0
    """Child processes killed with SIGKILL at an instrumented point, then recovered."""
    crash_states_explored: int = 0
    """Distinct simulated power-loss images recovered and checked."""
    faults_injected: int = 0
    """I/O errors injected into the file layer."""
    fault_runs: int = 0
    """Workloads run with one fault plan each."""
    recoveries_checked: int = 0
    """Recovered logs put through the invariant checker."""
    refused_as_corrupt: int = 0
    """Crash images refused as corrupt, every acknowledged event intact before the named line."""
    violations: int = 0
    """Invariant violations found (a test fails on any)."""
    cancel_schedules: int = 0
    """Seeded schedules of turns and flushes cancelled at random moments."""
    cancellations: int = 0
    """Cancellations those schedules made (anyio's and, on asyncio, native ones)."""
    cancel_violations: int = 0
    """Promises a cancellation schedule found broken (a test fails on any)."""
    long_run_sessions: int = 0
    """Sessions served one after another by one host under a small limit on open files."""
    long_run_peak_descriptors: int = 0
    """The most descriptors the long-running host had open at once."""
    long_run_rss_growth_kib: int = 0
    """How much its resident memory grew after the warm-up."""
    clock_cases: int = 0
    """Turns run, and batches written, with a time no log can hold."""
    clock_violations: int = 0
    """Of those, the ones acknowledged or stored all the same (a test fails on any)."""
    burst_sessions: int = 0
    """Live sessions that checkpointed at once, twice, under a low limit on open files."""
    burst_flushes_failed: int = 0
    """Flushes of those bursts that failed (a test fails on any)."""
    burst_peak_descriptors: int = 0
    """The most descriptors the bursting process had open at once."""
    bit_flips: int = 0
    """Single bits flipped in the acknowledged last frame of a crashed compressed log."""
    bit_flips_refused: int = 0
    """Of those, the flips recovery refused as damage (the others read exactly as written)."""
    bit_flip_violations: int = 0
    """Flips that made recovery cut or misread an acknowledged frame (a test fails on any)."""

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        terminalreporter.write_sep("-", "reliability figures")
        if self.crash_points_killed or self.crash_states_explored or self.fault_runs:
            terminalreporter.write_line(
                f"{self.crash_points_killed} crash points killed, "
                f"{self.crash_states_explored} simulated crash states explored, "
                f"{self.faults_injected} faults injected over {self.fault_runs} runs, "
                f"{self.recoveries_checked} recoveries checked "
                f"({self.refused_as_corrupt} refused as corrupt, nothing acknowledged at stake), "
                f"{self.violations} invariant violations"
            )
        if self.cancel_schedules:
            terminalreporter.write_line(
                f"{self.cancel_schedules} cancellation schedules, {self.cancellations} "
                f"cancellations, {self.cancel_violations} violations"
            )
        if self.long_run_sessions:
            terminalreporter.write_line(
                f"long run: {self.long_run_sessions} sessions one after another, at most "
                f"{self.long_run_peak_descriptors} descriptors open, resident memory "
                f"+{self.long_run_rss_growth_kib} KiB after the warm-up"
            )
        if self.clock_cases:
            terminalreporter.write_line(
                f"clocks: {self.clock_cases} turns and batches with a time no log can hold, "
                f"{self.clock_violations} acknowledged or stored"
            )
        if self.burst_sessions:
            terminalreporter.write_line(
                f"bursts: {self.burst_sessions} live sessions checkpointing at once (twice) "
                f"under a limit of 1024 open files, at most {self.burst_peak_descriptors} "
                f"descriptors open, {self.burst_flushes_failed} flushes failed"
            )
        if self.bit_flips:
            terminalreporter.write_line(
                f"bit flips: {self.bit_flips} single bits flipped in an acknowledged last frame, "
                f"{self.bit_flips_refused} refused as damage, the rest read unchanged, "
                f"{self.bit_flip_violations} violations"
            )


def add(request: pytest.FixtureRequest, **counts: int) -> None:
    """Add *counts* (names of :class:`Figures` fields) to the session's figures and the test's."""
    manager = request.config.pluginmanager
    figures = manager.get_plugin(PLUGIN_NAME)
    if figures is None:
        figures = Figures()
        manager.register(figures, PLUGIN_NAME)
    assert isinstance(figures, Figures)
    known = {field.name for field in fields(Figures)}
    for name, count in counts.items():
        assert name in known, name
        setattr(figures, name, getattr(figures, name) + count)
        request.node.user_properties.append((name, count))
