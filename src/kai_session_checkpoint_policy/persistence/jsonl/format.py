"""The JSONL session format, shared with the original harness: the layout, the header, frames.

Layout under the root directory::

    <root>/                                   mode 0700
      _no-cwd/                                sessions without a working directory
        <escaped session id>/                 mode 0700, one directory per session
          session.jsonl | session.jsonl.zstd  mode 0600, the log (plain, or compressed)
          session.lock                        held (flock) by the one process writing it
          session.jsonl.torn-<offset>         bytes recovery cut off a torn tail, kept
      --<project key>--/                      sessions whose header has a working directory
        <escaped session id>/ ...

Ids and working directories are escaped into directory names as :mod:`..ids` says.

A log is UTF-8 JSON text, one record per line, every line ending in ``\\n``: first the header
``{"type":"session","version":0,"id":...,"createdAt":...,"delegationDepth":0}``, then the event
records of :mod:`..records`, in seq order from 0, each batch of them appended by one ``write``
and made durable by one ``fsync``.

Compressed (``session.jsonl.zstd``), the file is a sequence of independent Zstandard frames,
each with a content checksum: the header line alone, then one frame per batch, whose text is
that batch's lines. The frame is the unit of a write: after a crash, the last frame may be cut
short, and nothing else.

What recovery may cut (the *torn tail*), and what it refuses (*damage*):

* Plain: the bytes after the last complete record, if none of them is a complete record: a
  final line without its newline, and lines that are not JSON objects (garbage, zeros). A line
  that is not the event expected next is damage if it is a complete record all the same (a
  JSON object: another envelope, a seq out of order, a non-finite number, a time out of range,
  nesting too deep), or if a complete record follows it.
* Compressed: an *incomplete* final frame, one that runs past the end of the file (the
  complete lines at its start are kept: *salvaged*). A frame that is whole but fails its
  checksum, or whose text is not the events expected, is damage, wherever it is: a write cut
  short never leaves a whole frame behind, so such a frame held an acknowledged batch.

Damage is refused (:class:`~..errors.CorruptLogError`, naming the line, or the byte where the
damaged frame starts); nothing is changed. This project's earlier format (header
``{"format":"kai-session","version":1,...}``, stored at ``<root>/<id escaped per UTF-8 byte as
~XX>/session.jsonl``, events with exactly the four keys) is read too: its surface events read
with ``surfaceOp`` ``"append"`` and its events of other types as ``ignorable``, as the current
format writes them.
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Final, Literal, NoReturn, TypeAlias, cast, final

from ...events import StoredEvents, on_fresh_stack
from ..errors import CorruptLogError, UnsupportedFormatError
from ..ids import NO_CWD
from ..records import (
    MAX_TIME,
    RUN_BYTES,
    TIME_RANGE,
    Columns,
    RecordError,
    collector_paused,
    decode_line,
    decode_run,
    encode_records,
)
from ..values import FORMAT_VERSION, SessionHeader

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from ...events import JSONObject, SessionEvent

__all__ = [
    "COMPRESSIONS",
    "EARLIER_FORMAT",
    "EARLIER_FORMAT_VERSION",
    "LOCK_NAME",
    "LOG_NAME",
    "NO_CWD",
    "ZSTD_LOG_NAME",
    "Compression",
    "Scan",
    "compress_frame",
    "encode_events",
    "encode_header",
    "log_name",
    "read_header",
    "salvage",
    "scan_log",
]

Compression: TypeAlias = Literal["none", "zstd"]
COMPRESSIONS: Final[tuple[Compression, ...]] = ("none", "zstd")

EARLIER_FORMAT: Final = "kai-session"
EARLIER_FORMAT_VERSION: Final = 1
"""The ``format`` and ``version`` of this project's earlier header, which is read, not written."""
LOG_NAME: Final = "session.jsonl"
ZSTD_LOG_NAME: Final = "session.jsonl.zstd"
LOCK_NAME: Final = "session.lock"
_RETIRED_HEADER_KEYS: Final = ("sandboxMode", "approvalPolicy")
_ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
_CHECKSUM_FLAG: Final = 0x04
_LONGEST_FRAME_HEADER: Final = 4 + 14
"""The magic number and the longest frame header (descriptor, window, dictionary id, size)."""
_LARGEST_BLOCK: Final = 128 * 1024
"""The most bytes a block of a Zstandard frame holds, or regenerates."""


@final
@dataclass(frozen=True, slots=True)
class Scan:
    """What a log holds: its header, the valid events, and where the committed bytes end.

    ``torn`` holds the bytes after ``committed_bytes``: a torn tail that recovery cuts off.
    The last ``salvaged`` events were read from it (the complete records of a torn final
    Zstandard frame): recovery writes them again after the cut.
    """

    header: SessionHeader
    events: StoredEvents
    committed_bytes: int
    torn: bytes
    salvaged: int = 0


def log_name(compression: Compression) -> str:
    """The name of a log file: ``session.jsonl``, or ``session.jsonl.zstd`` compressed."""
    return ZSTD_LOG_NAME if compression == "zstd" else LOG_NAME


# -- the header ---------------------------------------------------------------------------------


def encode_header(header: SessionHeader) -> bytes:
    """The header line, ending in a newline, with the keys in the original harness's order."""
    line: JSONObject = {
        "type": "session",
        "version": header.version,
        "id": header.id,
        "createdAt": header.created_at,
    }
    for key, value in (
        ("cwd", header.cwd),
        ("parentSession", header.parent_session),
        ("seedLength", header.seed_length),
        ("origin", header.origin),
    ):
        if value is not None:
            line[key] = value
    line["delegationDepth"] = header.delegation_depth
    if header.agent_preset is not None:
        line["agentPreset"] = header.agent_preset
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


def _not_a_session_log(path: Path, why: str) -> NoReturn:
    raise UnsupportedFormatError(f"{path} is not a session log: {why}")


def _decode_header(line: bytes, path: Path, *, fresh_stack: bool) -> SessionHeader:
    try:
        record = json.loads(line)
    except ValueError:
        raise CorruptLogError(path, 1, "the header line is not valid JSON") from None
    except RecursionError:
        if not fresh_stack:
            raise
        raise CorruptLogError(path, 1, "the header line is nested too deep") from None
    if isinstance(record, dict) and record.get("format") == EARLIER_FORMAT:
        return _decode_earlier_header(record, path)
    if not isinstance(record, dict) or record.get("type") != "session":
        _not_a_session_log(path, "its first line is not a session header")
    version = record.get("version")
    if isinstance(version, (int, float)) and not isinstance(version, bool):
        if version > FORMAT_VERSION:
            raise UnsupportedFormatError(
                f"{path} was written in session format version {version}, newer than version "
                f"{FORMAT_VERSION} which this release reads; upgrade kai-session-checkpoint-policy"
            )
        if version != FORMAT_VERSION:
            raise UnsupportedFormatError(
                f"{path} has session format version {version}, older than version "
                f"{FORMAT_VERSION}, the only one this release reads"
            )
    else:
        raise CorruptLogError(path, 1, "the header's version is not a number")
    retired = [key for key in _RETIRED_HEADER_KEYS if key in record]
    if retired:
        raise UnsupportedFormatError(
            f"{path} has a header with the retired fields {', '.join(retired)}; this release "
            "does not read it"
        )

    def field(key: str, kind: str) -> object:
        value = record.get(key)
        if value is None and key in record:
            raise CorruptLogError(path, 1, f"the header's {key} is null")
        if value is not None and not _HEADER_CHECKS[kind](value):
            raise CorruptLogError(path, 1, f"the header's {key} is not {kind}")
        return value

    session_id = field("id", "a non-empty string")
    created_at = field("createdAt", TIME_RANGE)
    depth = field("delegationDepth", "a non-negative integer")
    if session_id is None:
        raise CorruptLogError(path, 1, "the header has no session id")
    if created_at is None:
        raise CorruptLogError(path, 1, f"the header's createdAt is not {TIME_RANGE}")
    if depth is None:
        raise CorruptLogError(path, 1, "the header has no delegationDepth")
    cwd = field("cwd", "an absolute path")
    origin = record.get("origin")
    if origin is not None and origin != "subagent":
        raise CorruptLogError(path, 1, f'the header\'s origin is {origin!r}, not "subagent"')
    return SessionHeader(
        cast("str", session_id),
        cast("int", created_at),
        FORMAT_VERSION,
        cast("str | None", cwd),
        cast("int", depth),
        cast("str | None", field("parentSession", "a string")),
        cast("int | None", field("seedLength", "a non-negative integer")),
        cast("str | None", origin),
        cast("str | None", field("agentPreset", "a string")),
    )


_HEADER_CHECKS: Final = {
    "a non-empty string": lambda value: isinstance(value, str) and bool(value),
    "a string": lambda value: isinstance(value, str),
    "an absolute path": lambda value: isinstance(value, str) and value.startswith("/"),
    "a non-negative integer": lambda value: type(value) is int and value >= 0,
    TIME_RANGE: lambda value: type(value) is int and 0 <= value <= MAX_TIME,
}


def _decode_earlier_header(record: JSONObject, path: Path) -> SessionHeader:
    version = record.get("version")
    if type(version) is int and version > EARLIER_FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"{path} was written in session format version {version}, newer than version "
            f"{EARLIER_FORMAT_VERSION} which this release reads; upgrade "
            "kai-session-checkpoint-policy"
        )
    if version != EARLIER_FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"{path} has session format version {version!r}; this release reads only version "
            f"{EARLIER_FORMAT_VERSION} of the kai-session format"
        )
    session_id, created_at = record.get("id"), record.get("createdAt")
    if not isinstance(session_id, str) or not session_id:
        raise CorruptLogError(path, 1, "the header has no session id")
    if type(created_at) is not int or not 0 <= created_at <= MAX_TIME:
        raise CorruptLogError(path, 1, f"the header's createdAt is not {TIME_RANGE}")
    return SessionHeader(session_id, created_at, EARLIER_FORMAT_VERSION, earlier_format=True)


# -- writing events -----------------------------------------------------------------------------


def encode_events(
    events: Sequence[SessionEvent], *, pack: bool = False, compression: Compression = "none"
) -> bytes:
    """The bytes of one batch of *events*: its lines, each ending in a newline; nothing for none.

    With *pack*, runs of three or more deltas of one block become one row. Compressed, the
    lines are one checksummed Zstandard frame.
    """
    text = encode_records(events, pack=pack)
    return compress_frame(text) if text and compression == "zstd" else text


_compressor: Final = zstd.ZstdCompressor(options={zstd.CompressionParameter.checksum_flag: 1})
_compressing: Final = threading.Lock()


def compress_frame(data: bytes) -> bytes:
    """*data* as one Zstandard frame with a checksum (and no content size), as the original
    harness writes its frames.

    One compressor serves every thread, one frame at a time: a compressor's first frame costs
    far more than the next (it sets up its tables), so a thread's first write is not slower.
    """
    with _compressing:
        frame: bytes = _compressor.compress(data) + _compressor.flush()
    return frame


# -- reading a log ------------------------------------------------------------------------------


def scan_log(data: bytes, path: Path) -> Scan:
    """Read a whole log (compressed if *path* ends in ``.zstd``); separate its committed events
    from a torn tail.

    Plain, the torn tail is what follows the last event, if none of it is a complete record: a
    final line without its newline, and lines that are not JSON objects (garbage, zeros). A
    line that is not the event expected next is corruption if it is a complete record all the
    same (a JSON object: another envelope, a seq out of order, a non-finite number, a time out
    of range, nesting too deep), or if one follows it.

    Compressed, a frame is a complete record if it is whole and its checksum holds: every
    record inside it must be the event expected. The torn tail is what follows the last such
    frame, if no whole frame with a valid checksum follows the damage; the complete lines at
    the start of a torn final frame are kept (salvaged).

    How deep the caller's stack is does not matter.

    :raises CorruptLogError: naming *path* and the line (or the byte of a damaged frame).
    :raises UnsupportedFormatError: if the header has another format version, the log is not
        a session log, or it holds an event of an unknown type not marked ignorable.
    """
    scan = _scan_zstd if path.name.endswith(".zstd") else _scan_plain
    try:
        return scan(data, path, fresh_stack=False)
    except RecursionError:  # the caller's stack, or a line, is too deep to decode on it
        return on_fresh_stack(partial(scan, data, path, fresh_stack=True))


@dataclass(slots=True)
class _Reader:
    """Reads the event lines of one log, after its header, into :attr:`events`."""

    path: Path
    header: SessionHeader
    fresh_stack: bool
    events: StoredEvents

    def bulk(self, data: bytes, offset: int) -> int:
        """Decode complete lines from *offset* on with the fast paths; return where they
        stopped (at the first run of lines that is not all the events expected)."""
        earlier = self.header.earlier_format
        events = self.events
        with collector_paused():
            while (stop := data.rfind(b"\n", offset, offset + RUN_BYTES)) >= 0 or (
                stop := data.find(b"\n", offset)
            ) >= 0:
                if not decode_run(events, data, offset, stop + 1, earlier=earlier):
                    break
                offset = stop + 1
        return offset

    def line(self, line: bytes) -> Columns:
        """The events of one line, the next ones expected; else :class:`RecordError`."""
        return decode_line(
            line,
            len(self.events),
            earlier=self.header.earlier_format,
            fresh_stack=self.fresh_stack,
        )

    def add(self, columns: Columns) -> None:
        self.events.extend_stored(*columns)

    def refuse(self, line_number: int, error: RecordError) -> NoReturn:
        if error.unsupported:
            raise UnsupportedFormatError(
                f"{self.path}, line {line_number}: session {self.header.id!r}: {error.problem}"
            )
        raise CorruptLogError(self.path, line_number, error.problem, seq=len(self.events))


def _scan_plain(data: bytes, path: Path, *, fresh_stack: bool) -> Scan:
    if data.startswith(_ZSTD_MAGIC):
        _not_a_session_log(path, "it holds Zstandard data (a compressed log ends in .zstd)")
    end = data.find(b"\n")
    if end < 0:
        raise CorruptLogError(path, 1, "the header line is incomplete")
    header = _decode_header(data[:end], path, fresh_stack=fresh_stack)
    reader = _Reader(path, header, fresh_stack, StoredEvents())
    offset = committed = reader.bulk(data, end + 1)
    line_number = 2 + data.count(b"\n", end + 1, offset)
    damage: tuple[int, RecordError, int] | None = None  # the first damaged line, and its seq
    while (end := data.find(b"\n", offset)) >= 0:
        line = data[offset:end]
        offset = end + 1
        try:
            decoded = reader.line(line)
        except RecordError as error:
            if error.complete and damage is not None:
                break  # reported below
            if error.complete:
                reader.refuse(line_number, error)
            damage = damage or (line_number, error, len(reader.events))
        else:
            if damage is not None:
                break
            reader.add(decoded)
            committed = offset
        line_number += 1
    else:
        return Scan(header, reader.events, committed, data[committed:])
    assert damage is not None
    first, problem, seq = damage
    raise CorruptLogError(
        path,
        first,
        f"{problem.problem}; line {line_number} after it is a complete record, so this is not a "
        "torn tail",
        seq=seq,
    )


# -- compressed logs ----------------------------------------------------------------------------


def _frame_end(data: bytes, start: int, structure: list[int] | None = None) -> int | str | None:
    """Where the Zstandard frame at *start* ends, found from its structure without decoding it.

    ``None`` if the frame runs past the end of *data* (a torn frame); a description if *start*
    does not begin a frame of the kind a session log holds (a standard frame with a checksum,
    blocks no larger than a block may be). The offsets of the bytes read to find the end (the
    frame's header and its blocks' headers) are added to *structure*, if given.
    """
    size = len(data)
    if structure is not None:
        structure.extend(range(start, min(size, start + _LONGEST_FRAME_HEADER)))
    if size - start < 4:
        return None
    if data[start : start + 4] != _ZSTD_MAGIC:
        return f"no Zstandard frame starts at byte {start}"
    if start + 4 >= size:
        return None
    descriptor = data[start + 4]
    if descriptor & 0x18:
        return f"the frame at byte {start} sets a reserved bit of its header"
    if not descriptor & _CHECKSUM_FLAG:
        return f"the frame at byte {start} has no checksum"
    single = bool(descriptor & 0x20)
    header = (
        1
        + (0 if single else 1)
        + (0, 1, 2, 4)[descriptor & 3]
        + ((1 if single else 0), 2, 4, 8)[descriptor >> 6]
    )
    position = start + 4 + header
    while True:
        if position + 3 > size:
            return None
        if structure is not None:
            structure.extend(range(position, position + 3))
        block = int.from_bytes(data[position : position + 3], "little")
        kind = (block >> 1) & 3
        if kind == 3:
            return f"the frame at byte {start} has a block of the reserved type at byte {position}"
        if block >> 3 > _LARGEST_BLOCK:
            return f"the frame at byte {start} has a block too large to be one at byte {position}"
        position += 3 + (1 if kind == 1 else block >> 3)
        if position > size:
            return None
        if block & 1:
            break
    position += 4  # the checksum
    return None if position > size else position


def _whole_frames(data: bytes) -> bool:
    """Whether *data* is exactly a sequence of whole frames, each with a valid checksum."""
    offset = 0
    while offset < len(data):
        end = _frame_end(data, offset)
        if not isinstance(end, int) or _decompress(data[offset:end]) is None:
            return False
        offset = end
    return bool(data)


def _one_bit_from_whole_frames(tail: bytes) -> int | None:
    """The offset in *tail* of a bit whose flip would make it whole frames with valid
    checksums, if there is one: then *tail* is damage, not a torn write.

    A write cut short leaves a prefix of a frame: no single bit flipped in it can make it whole
    with a valid checksum (a 32-bit check of its content). Only the bytes that give a frame
    its structure (its header, its blocks' headers) can make whole frames look incomplete or
    foreign, so only those are tried; a flip anywhere else leaves a whole frame whose checksum
    fails, which is damage anyway.
    """
    structure: list[int] = []
    offset = 0
    while isinstance(end := _frame_end(tail, offset, structure), int) and end < len(tail):
        offset = end
    corrected = bytearray(tail)
    for position in sorted(set(structure)):
        for bit in range(8):
            corrected[position] ^= 1 << bit
            if _whole_frames(bytes(corrected)):
                return position
            corrected[position] ^= 1 << bit
    return None


def _decompress(frame: bytes | memoryview) -> bytes | None:
    """The plaintext of one whole frame with a valid checksum, or ``None``."""
    decompressor = zstd.ZstdDecompressor()
    try:
        plaintext: bytes = decompressor.decompress(frame)
    except zstd.ZstdError:
        return None
    return plaintext if decompressor.eof and not decompressor.unused_data else None


def _intact_frame_after(data: bytes, start: int) -> int | None:
    """The first byte after *start* where a whole frame with a valid checksum begins."""
    position = data.find(_ZSTD_MAGIC, start + 1)
    while position >= 0:
        end = _frame_end(data, position)
        if isinstance(end, int) and _decompress(data[position:end]) is not None:
            return position
        position = data.find(_ZSTD_MAGIC, position + 1)
    return None


def _salvage(torn: bytes) -> bytes:
    """The plaintext the complete blocks at the start of a torn frame decode to."""
    try:
        plaintext: bytes = zstd.ZstdDecompressor().decompress(torn)
    except zstd.ZstdError:
        return b""
    return plaintext


def _scan_zstd(data: bytes, path: Path, *, fresh_stack: bool) -> Scan:
    frames: list[tuple[int, int]] = []
    offset, damage, torn_frame = 0, "", False
    while offset < len(data):
        end = _frame_end(data, offset)
        if not isinstance(end, int):
            torn_frame = end is None
            damage = end or f"the frame at byte {offset} is incomplete"
            break
        frames.append((offset, end))
        offset = end
    if not frames:
        if not data or not data.startswith(_ZSTD_MAGIC[: len(data)]):
            _not_a_session_log(path, "it does not start with a Zstandard frame")
        raise CorruptLogError(path, None, "the header frame is incomplete", byte=0)
    first = _decompress(data[: frames[0][1]])
    if first is None:
        raise CorruptLogError(path, None, "the header frame fails its checksum", byte=0)
    if first.find(b"\n") != len(first) - 1:
        raise CorruptLogError(path, 1, "the first frame is not exactly one header line")
    header = _decode_header(first[:-1], path, fresh_stack=fresh_stack)
    reader = _Reader(path, header, fresh_stack, StoredEvents())
    # The frames' text is read a group of frames at a time (about a run of lines of the fast
    # path each, ending at the end of a line), up to the first frame that fails its checksum.
    group: list[bytes] = []
    grouped, line_number = 0, 2
    view = memoryview(data)
    failed: int | None = None  # a whole frame that fails its checksum
    for start, end in frames[1:]:
        plaintext = _decompress(view[start:end])
        if plaintext is None:
            failed = start
            break
        group.append(plaintext)
        grouped += len(plaintext)
        if grouped >= RUN_BYTES and plaintext.endswith(b"\n"):
            line_number = _read_frames(reader, b"".join(group), line_number, last=False)
            group, grouped = [], 0
    _read_frames(reader, b"".join(group), line_number, last=failed is None)
    if failed is not None:
        raise CorruptLogError(
            path,
            None,
            f"the frame at byte {failed} is whole but fails its checksum: a write cut short "
            "never leaves a whole frame, so it held an acknowledged batch",
            byte=failed,
            seq=len(reader.events),
        )
    salvaged = 0
    if offset < len(data):
        intact = _intact_frame_after(data, offset)
        if intact is not None:
            raise CorruptLogError(
                path,
                None,
                f"{damage}; a whole frame with a valid checksum follows it at byte {intact}, "
                "so this is not a torn tail",
                byte=offset,
                seq=len(reader.events),
            )
        flipped = _one_bit_from_whole_frames(data[offset:])
        if flipped is not None:
            raise CorruptLogError(
                path,
                None,
                f"{damage}, but with one bit of byte {offset + flipped} flipped it would be whole "
                "with a valid checksum: it is damaged, not torn, and held an acknowledged batch",
                byte=offset,
                seq=len(reader.events),
            )
        if torn_frame:
            salvaged = _read_salvage(reader, _salvage(data[offset:]))
    return Scan(header, reader.events, offset, data[offset:], salvaged)


def _read_frames(reader: _Reader, text: bytes, line_number: int, *, last: bool) -> int:
    """Read the lines of whole frames, from line *line_number* on: every one must be the event
    expected; the *last* frames' text must end with a whole line. Return the next line's
    number."""
    offset = reader.bulk(text, 0)
    line_number += text.count(b"\n", 0, offset)
    while (end := text.find(b"\n", offset)) >= 0:
        try:
            reader.add(reader.line(text[offset:end]))
        except RecordError as error:
            reader.refuse(line_number, error)
        offset, line_number = end + 1, line_number + 1
    if last and offset < len(text):
        raise CorruptLogError(
            reader.path,
            line_number,
            "a whole frame ends inside this record",
            seq=len(reader.events),
        )
    return line_number


def _read_salvage(reader: _Reader, text: bytes) -> int:
    """Keep the complete events at the start of a torn frame's text, up to the first defect."""
    count, offset = len(reader.events), 0
    while (end := text.find(b"\n", offset)) >= 0:
        try:
            reader.add(reader.line(text[offset:end]))
        except RecordError:
            break
        offset = end + 1
    return len(reader.events) - count


def read_header(head: bytes, path: Path) -> SessionHeader:
    """The header of the log at *path*, from its first bytes (the whole header record at least).

    :raises CorruptLogError, UnsupportedFormatError: as :func:`scan_log`.
    """
    if path.name.endswith(".zstd"):
        end = _frame_end(head, 0)
        record = head[:end] if isinstance(end, int) else head
    else:
        record = head[: head.find(b"\n") + 1] if b"\n" in head else head
    return scan_log(record, path).header


def salvage(scan: Scan, torn: bytes, path: Path) -> Scan:
    """*scan* with the complete events a torn final frame *torn* (cut off before) holds.

    The events an interrupted recovery salvaged, and lost when it stopped after the cut, are
    found again in the copy of the torn bytes it kept.
    """
    if _frame_end(torn, 0) is not None:  # whole, or not a frame: nothing to salvage
        return scan
    reader = _Reader(path, scan.header, True, scan.events.copy())
    text = _salvage(torn)
    try:
        count = _read_salvage(reader, text)
    except RecursionError:
        reader.events = scan.events.copy()
        count = on_fresh_stack(partial(_read_salvage, reader, text))
    return replace(scan, events=reader.events, salvaged=scan.salvaged + count)
