"""Waiting for a child process to reach a marker, and killing it there with SIGKILL.

A child that is to be killed at a point writes a marker file (created empty by the test) right
before it blocks there. Polling the marker's content is the handshake: it is the only wait by
time in the tests, and it is bounded by a deadline.
"""

from __future__ import annotations

import signal
import subprocess
import time
from typing import TYPE_CHECKING, Final

import pytest

from kai_session_checkpoint_policy.demo import agent_command

if TYPE_CHECKING:
    from pathlib import Path

    from kai_session_checkpoint_policy.demo import HangAt

MARKER_TIMEOUT: Final = 30.0
"""Seconds a child may take to reach its marker, and to die once killed."""


def start_agent(
    tmp_path: Path,
    session_id: str,
    hang_at: HangAt,
    *options: str,
    use_policy: bool = True,
    root: str | Path | None = None,
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start ``kai-checkpoint agent`` as a child that hangs at *hang_at*; return it and its marker.

    Its sessions go to the store *root* (by default ``tmp_path / "sessions"``), its payments to
    ``tmp_path / "ledger.jsonl"``; *options* are further command-line options
    (``--batch-window 3600``).
    """
    marker = tmp_path / f"{session_id}.marker"
    marker.write_bytes(b"")  # pre-created empty: only its content signals readiness
    command = agent_command(
        tmp_path / "sessions" if root is None else root,
        session_id,
        hang_at=hang_at,
        marker=marker,
        ledger=tmp_path / "ledger.jsonl",
        use_policy=use_policy,
    )
    child = subprocess.Popen(
        [*command, *options],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return child, marker


def wait_for_marker(
    child: subprocess.Popen[bytes],
    marker: Path,
    expected: str,
    *,
    stderr: Path | None = None,
    timeout: float = MARKER_TIMEOUT,
) -> None:
    """Return once *marker* holds exactly *expected*.

    Fails if the marker holds anything but a prefix of *expected*, if the child exits first
    (showing its standard error: the pipe, or the file *stderr*), or after *timeout* seconds.
    """
    deadline = time.monotonic() + timeout
    while (content := marker.read_text()) != expected:
        assert expected.startswith(content), f"unexpected marker content {content!r}"
        if child.poll() is not None:
            if stderr is not None:
                errors = stderr.read_bytes()
            else:
                errors = child.stderr.read() if child.stderr is not None else b""
            pytest.fail(
                f"the child exited with {child.returncode} before {expected!r}:\n"
                f"{errors.decode(errors='replace')}"
            )
        assert time.monotonic() < deadline, f"the child never reached {expected!r}"
        time.sleep(0.005)


def kill_at_marker(
    child: subprocess.Popen[bytes],
    marker: Path,
    expected: str,
    *,
    stderr: Path | None = None,
    timeout: float = MARKER_TIMEOUT,
) -> None:
    """Wait for *expected* in *marker*, then SIGKILL *child*; it is reaped however this ends."""
    try:
        wait_for_marker(child, marker, expected, stderr=stderr, timeout=timeout)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout) == -signal.SIGKILL, "the child did not die by SIGKILL"
    finally:
        reap(child)


def reap(child: subprocess.Popen[bytes]) -> None:
    """Kill *child* if it still runs, wait for it, and close its pipes."""
    if child.poll() is None:
        child.kill()
        child.wait()
    for pipe in (child.stdin, child.stdout, child.stderr):
        if pipe is not None:
            pipe.close()
