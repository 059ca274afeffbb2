"""A damaged frame of a compressed log is refused; only a frame a write cut short is cut.

The last frame of a log killed inside its tool body is the tool checkpoint's batch: the model's
message asking for the payment and its ``tool/call``, acknowledged before the body paid. Were
that frame cut as if torn, the call would vanish and the resumed turn would pay again. So every
single-bit flip anywhere in it must be refused as corrupt (naming the frame) or read exactly as
written, never cut; and every prefix of it, which is what a write cut short leaves, is cut.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest

from kai_session_checkpoint_policy import eventdata
from kai_session_checkpoint_policy.demo import CALL_ID, MARKERS
from kai_session_checkpoint_policy.persistence import CorruptLogError, interrupted_turn_closers
from kai_session_checkpoint_policy.persistence.jsonl.format import scan_log
from kai_session_checkpoint_policy.results import TOOL_OUTCOME_UNKNOWN

from ..support import figures
from ..support.markers import kill_at_marker, start_agent
from ..support.persistence_helpers import find_log

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kai_session_checkpoint_policy.events import SessionEvent

SESSION: Final = "pay-once"

pytestmark = [
    pytest.mark.crash,
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX"),
]


def frame_starts(data: bytes) -> list[int]:
    """Where each frame of a compressed log starts."""
    starts, offset = [], 0
    while offset < len(data):
        starts.append(offset)
        decompressor = zstd.ZstdDecompressor()
        decompressor.decompress(data[offset:])
        offset = len(data) - len(decompressor.unused_data)
    return starts


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A log of the demo agent killed right after its payment: its path and bytes."""
    tmp_path = tmp_path_factory.mktemp("crashed")
    child, marker = start_agent(tmp_path, SESSION, "tool")
    kill_at_marker(child, marker, MARKERS["tool"])
    log = find_log(tmp_path / "sessions", SESSION)
    assert log.name == "session.jsonl.zstd"
    return log, log.read_bytes()


def unknown_outcomes(events: Sequence[SessionEvent], *, tail_cut: bool) -> list[str]:
    """The calls the repair answers ``TOOL_OUTCOME_UNKNOWN``."""
    return [
        str(eventdata.result_call_id(closer.data))
        for closer in interrupted_turn_closers(events, tail_cut=tail_cut)
        if closer.type == "tool/result" and TOOL_OUTCOME_UNKNOWN in closer.encode()
    ]


def test_the_last_frame_is_the_tool_checkpoints_batch(crashed: tuple[Path, bytes]) -> None:
    log, data = crashed
    intact = scan_log(data, log)
    last = frame_starts(data)[-1]
    before = scan_log(data[:last], log)
    types = [event.type for event in intact.events[len(before.events) :]]
    assert types[-2:] == ["assistant/message", "tool/call"]
    assert set(types[:-2]) <= {"assistant/chunk"}  # the streamed response, batched with it
    assert intact.torn == b""
    assert unknown_outcomes(intact.events, tail_cut=False) == [CALL_ID]


def test_one_bit_flipped_anywhere_in_the_last_frame_is_refused_or_read_unchanged(
    crashed: tuple[Path, bytes], request: pytest.FixtureRequest
) -> None:
    log, data = crashed
    intact = scan_log(data, log).events
    last = frame_starts(data)[-1]
    acknowledged_before = len(scan_log(data[:last], log).events)
    refused = unchanged = violations = 0
    flipped = bytearray(data)
    for position in range(last, len(data)):
        for bit in range(8):
            flipped[position] ^= 1 << bit
            try:
                scan = scan_log(bytes(flipped), log)
            except CorruptLogError as error:  # refused, naming the damaged frame
                refused += 1
                violations += (error.byte, error.seq) != (last, acknowledged_before)
            else:  # a bit no decoder reads: the same events, nothing cut, the same repair
                unchanged += 1
                violations += (list(scan.events), scan.torn) != (list(intact), b"")
            flipped[position] ^= 1 << bit
    figures.add(
        request,
        bit_flips=refused + unchanged,
        bit_flips_refused=refused,
        bit_flip_violations=violations,
    )
    assert violations == 0
    assert refused + unchanged == 8 * (len(data) - last)
    assert refused > unchanged


def test_every_prefix_of_the_last_frame_is_a_torn_tail_and_is_cut(
    crashed: tuple[Path, bytes],
) -> None:
    log, data = crashed
    last = frame_starts(data)[-1]
    before = scan_log(data[:last], log).events
    for end in range(last + 1, len(data)):
        scan = scan_log(data[:end], log)
        assert scan.committed_bytes == last
        assert scan.torn == data[last:end]
        # What a cut frame's complete lines still name is salvaged; nothing else is kept.
        assert list(scan.events[: len(before)]) == list(before)
