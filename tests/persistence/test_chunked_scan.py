"""A log is scanned a chunk at a time: whatever the chunk boundaries, the scan is the same.

Each small log below is scanned whole, then with every chunk size from one byte to its length,
then split in two at every offset (a record, a packed row or a Zstandard frame cut anywhere,
the header included): the events, the committed bytes, the torn tail, the salvaged events and
the refusal are the same every time.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from kai_session_checkpoint_policy.events import JSONObject, SessionEvent
from kai_session_checkpoint_policy.persistence import CorruptLogError, UnsupportedFormatError
from kai_session_checkpoint_policy.persistence.jsonl.format import (
    Scan,
    compress_frame,
    encode_events,
    encode_header,
    scan_log,
    scan_stream,
)
from kai_session_checkpoint_policy.persistence.values import SessionHeader

from ..support.persistence_helpers import COMPLETE_TURN, events

PLAIN = Path("/logs/session.jsonl")
ZSTD = Path("/logs/session.jsonl.zstd")
CHUNK: JSONObject = {
    "turn": 1,
    "step": 1,
    "chunk": {"type": "text-delta", "index": 0, "text": "ab"},
}


def logged() -> list[SessionEvent]:
    """A complete turn with a run of deltas in it (a packed row), then an open turn."""
    turn = list(COMPLETE_TURN)
    return events(
        *turn[:3],
        *[("assistant/chunk", CHUNK)] * 4,
        *turn[3:],
        ("turn/start", {"turn": 2}),
        ("step/start", {"turn": 2, "step": 1}),
    )


def plain_log(torn: bytes = b"") -> bytes:
    stored = logged()
    return (
        encode_header(SessionHeader("s", 1))
        + encode_events(stored[:3], pack=True)
        + encode_events(stored[3:], pack=True)
        + torn
    )


def zstd_log(torn_frame: bool = False) -> bytes:
    stored = logged()
    data = compress_frame(encode_header(SessionHeader("s", 1)))
    data += encode_events(stored[:3], pack=True, compression="zstd")
    data += encode_events(stored[3:9], pack=True, compression="zstd")
    last = encode_events(stored[9:], pack=True, compression="zstd")
    return data + (last[: len(last) - 3] if torn_frame else last)


def outcome(scan: Callable[[], object]) -> tuple[object, ...]:
    """What a scan gives, or the error it raises, as comparable values."""
    try:
        result = scan()
    except (CorruptLogError, UnsupportedFormatError) as error:
        return (type(error).__name__, str(error))
    assert isinstance(result, Scan)
    return (
        result.header,
        [event.encode() for event in result.events],
        result.committed_bytes,
        result.torn,
        result.salvaged,
    )


def split_at(data: bytes, offset: int) -> Callable[[int], bytes]:
    """A reader that returns the bytes up to *offset*, then the rest, however much is asked."""
    pieces = [data[:offset], data[offset:]]

    def read(size: int) -> bytes:
        while pieces and not pieces[0]:
            pieces.pop(0)
        if not pieces:
            return b""
        piece = pieces[0][:size]
        pieces[0] = pieces[0][size:]
        return piece

    return read


def damaged_plain() -> bytes:
    """An event line damaged, and a complete record after it: refused."""
    data = plain_log()
    lines = data.splitlines(keepends=True)
    lines[3] = b'{"type":"turn/start","seq":3\n'
    return b"".join(lines)


def damaged_zstd() -> bytes:
    """The second frame fails its checksum."""
    data = zstd_log()
    header = len(compress_frame(encode_header(SessionHeader("s", 1))))
    flipped = bytearray(data)
    flipped[header + 12] ^= 0x40
    return bytes(flipped)


def garbage_between_frames() -> bytes:
    """Zeros between the header frame and the next one: refused, since whole frames follow."""
    data = zstd_log()
    header = len(compress_frame(encode_header(SessionHeader("s", 1))))
    return data[:header] + b"\x00" * 7 + data[header:]


LOGS: dict[str, tuple[Path, Callable[[], bytes]]] = {
    "plain": (PLAIN, plain_log),
    "plain, torn tail": (PLAIN, lambda: plain_log(b'{"type":"assistant/ch')),
    "plain, garbage tail": (PLAIN, lambda: plain_log(b"\x00\x00\x00\n\x00\x00")),
    "plain, damaged": (PLAIN, damaged_plain),
    "zstd": (ZSTD, zstd_log),
    "zstd, torn frame": (ZSTD, lambda: zstd_log(torn_frame=True)),
    "zstd, damaged frame": (ZSTD, damaged_zstd),
    "zstd, frames after garbage": (ZSTD, garbage_between_frames),
}


@pytest.mark.parametrize("name", LOGS)
def test_every_chunk_size_and_every_split_scan_the_same(name: str) -> None:
    path, make = LOGS[name]
    data = make()
    whole = outcome(lambda: scan_log(data, path))
    assert whole[0] in ("CorruptLogError",) or isinstance(whole[0], SessionHeader)
    for size in range(1, len(data) + 1):
        assert outcome(partial(scan_log, data, path, chunk_bytes=size)) == whole, size
    for offset in range(len(data) + 1):
        split = partial(scan_stream, split_at(data, offset), path, chunk_bytes=len(data))
        assert outcome(split) == whole, offset


def test_the_logs_show_what_they_are_meant_to() -> None:
    """The cases above hold what their names say: packed rows, torn tails, refusals."""
    plain = scan_log(plain_log(), PLAIN)
    assert len(plain.events) == 12
    assert plain.torn == b""
    assert b'"text-chunks"' in plain_log()
    assert scan_log(plain_log(b'{"type":"assistant/ch'), PLAIN).torn == b'{"type":"assistant/ch'
    torn = scan_log(zstd_log(torn_frame=True), ZSTD)
    assert (len(torn.events), torn.salvaged) == (12, 3)
    with pytest.raises(CorruptLogError, match=r"line 4: .* is a complete record"):
        scan_log(damaged_plain(), PLAIN)
    with pytest.raises(CorruptLogError, match=r"fails its checksum"):
        scan_log(damaged_zstd(), ZSTD)
    header = len(compress_frame(encode_header(SessionHeader("s", 1))))
    with pytest.raises(CorruptLogError, match=rf"no Zstandard frame starts at byte {header};"):
        scan_log(garbage_between_frames(), ZSTD)


def test_a_chunk_size_must_be_a_positive_integer() -> None:
    with pytest.raises(ValueError, match=r"^chunk_bytes must be a positive integer, not 0$"):
        scan_stream(split_at(b"", 0), PLAIN, chunk_bytes=0)
