"""A recovery stopped right after its cut, run again, leaves the log an uninterrupted one leaves.

Recovery keeps the torn bytes beside the log before it cuts them (``.torn-<offset>``, or
``.torn-<offset>.2`` and on when a copy of other bytes is kept there already), and writes the
complete events of a torn final frame again after the cut. Stopped between the cut and that
write, the next recovery finds them in the copy the cut kept: the last one at that offset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import anyio
import pytest

from kai_session_checkpoint_policy.events import JSONObject
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence, OsFiles
from kai_session_checkpoint_policy.persistence.jsonl.format import (
    compress_frame,
    encode_events,
    encode_header,
)
from kai_session_checkpoint_policy.persistence.values import SessionHeader

from ..support.persistence_helpers import events, log_path

CHUNK: Final[JSONObject] = {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "text": "x"}}


class Stopped(Exception):
    """The process stops here, as if killed: nothing after it runs."""


class StopAfterTheCut(OsFiles):
    """Files that stop the recovery right after the cut is durable."""

    def __init__(self) -> None:
        super().__init__()
        self.cut = False

    def truncate(self, fd: int, size: int) -> None:
        super().truncate(fd, size)
        self.cut = True

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        if self.cut:
            raise Stopped


def torn_log(root: Path) -> tuple[Path, bytes, int]:
    """A compressed log whose last frame (thousands of deltas, several blocks) is torn: the
    log, its bytes, and where the torn frame starts."""
    logged = events(
        ("turn/start", {"turn": 1}),
        ("step/start", {"turn": 1, "step": 1}),
        *[("assistant/chunk", CHUNK)] * 6000,
    )
    head = compress_frame(encode_header(SessionHeader("s", logged[0].time)))
    head += encode_events(logged[:2], compression="zstd")
    last = encode_events(logged[2:], compression="zstd")  # unpacked: over 128 KiB of text
    path = log_path(root, "s", "zstd")
    path.parent.mkdir(parents=True)
    data = head + last[: len(last) * 3 // 4]
    path.write_bytes(data)
    return path, data, len(head)


def test_a_recovery_stopped_after_its_cut_is_finished_by_the_next_one(tmp_path: Path) -> None:
    whole, _, _ = torn_log(tmp_path / "whole")
    uninterrupted = anyio.run(JsonlSessionPersistence(tmp_path / "whole").load, "s")
    assert len(uninterrupted.events) > 1000  # what the torn frame's whole blocks held

    path, data, committed = torn_log(tmp_path / "stopped")
    stale = path.with_name(f"{path.name}.torn-{committed}")
    stale.write_bytes(b"the copy of another cut, long ago")  # a copy of other bytes is there
    with pytest.raises(Stopped):
        anyio.run(JsonlSessionPersistence(tmp_path / "stopped", files=StopAfterTheCut()).load, "s")
    assert path.stat().st_size == committed  # cut, and nothing written after the cut
    assert stale.read_bytes() == b"the copy of another cut, long ago"
    assert path.with_name(f"{stale.name}.2").read_bytes() == data[committed:]

    finished = anyio.run(JsonlSessionPersistence(tmp_path / "stopped").load, "s")
    assert list(finished.events) == list(uninterrupted.events)
    assert finished.repair == uninterrupted.repair
    assert path.read_bytes() == whole.read_bytes()
