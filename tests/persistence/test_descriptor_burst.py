"""A burst of checkpoints of more live sessions than files may be open stays within the limit.

Ten thousand live sessions of one host checkpoint at once, twice, in a child process whose
limit on open files is 1024. Every flush succeeds, and the process never holds more than
``max_open_sessions`` sessions' files at once: a write that must open a session's files waits
for room, which the sessions that end their writes make, instead of failing with EMFILE.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from ..support import SUPPORT, figures

SESSIONS: Final = 10_000
LIMIT: Final = 1024

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="counts /proc/self/fd")


def test_ten_thousand_sessions_checkpoint_at_once_within_1024_descriptors(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    done = subprocess.run(
        [sys.executable, str(SUPPORT / "burst_child.py"), str(tmp_path), str(SESSIONS), str(LIMIT)],
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
    )
    result = json.loads(done.stdout)
    figures.add(
        request,
        burst_sessions=SESSIONS,
        burst_flushes_failed=result["failed"],
        burst_peak_descriptors=result["peak_descriptors"],
    )
    assert (result["flushes"], result["failed"], result["first_error"]) == (2 * SESSIONS, 0, "")
    most = result["max_open_sessions"]
    assert most == LIMIT // 8
    # Two files per session (its log and its lock), and a few of the process's own.
    assert result["peak_descriptors"] <= 2 * most + 16
