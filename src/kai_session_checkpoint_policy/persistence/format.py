"""The JSONL session log format.

Layout under the root directory::

    <root>/                         mode 0700
      <escaped session id>/         mode 0700, one directory per session
        session.jsonl               mode 0600, the log
        session.lock                mode 0600, held (flock) by the one process writing the log
        session.jsonl.torn-<offset> bytes cut from a torn tail by recovery, kept for inspection

``session.jsonl`` is UTF-8 text, one JSON object per line, every line ending in ``\\n``::

    {"format":"kai-session","version":1,"id":"<session id>","createdAt":<epoch ms>}
    {"type":"<event type>","seq":0,"time":<epoch ms>,"data":{...}}
    {"type":"<event type>","seq":1,"time":<epoch ms>,"data":{...}}
    ...

The first line is the header; the event on line ``n`` (1-based) has ``seq == n - 2``. Times
are integers from 0 to :data:`MAX_TIME`; numbers are finite; data nests at most
:data:`~kai_session_checkpoint_policy.events.MAX_JSON_DEPTH` levels. The file is created with
its header and first batch at once (temporary file, fsync, hard link, directory fsync); every
later batch is appended with one write and one fsync. A crash can therefore leave only a *torn
tail*: bytes at the end that are not a complete record (a final fragment without its newline,
or damaged lines none of which is a JSON object). Anything else that is not the event expected
next, wherever it is, is corruption.

Session ids are escaped into directory names: ASCII letters, digits, ``_``, ``-`` and ``.`` stay
as they are; every other character becomes ``~`` and two hex digits per UTF-8 byte. A name made
only of dots is escaped entirely, so no id can name ``.``, ``..`` or a path outside the root.
"""

from __future__ import annotations

import gc
import json
import math
import re
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from typing import TYPE_CHECKING, Final, NoReturn, cast

from ..events import EVENT_TYPES, MAX_JSON_DEPTH, SessionEvent, json_depth, on_fresh_stack
from .errors import CorruptLogError, InvalidSessionIdError, UnsupportedFormatError

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "LOCK_NAME",
    "LOG_NAME",
    "MAX_TIME",
    "Scan",
    "SessionHeader",
    "decode_session_id",
    "encode_events",
    "encode_header",
    "encode_session_id",
    "scan_log",
]

FORMAT: Final = "kai-session"
FORMAT_VERSION: Final = 1
LOG_NAME: Final = "session.jsonl"
LOCK_NAME: Final = "session.lock"
MAX_ESCAPED_ID: Final = 200
"""The longest escaped id, in bytes, kept well below the 255 bytes a file name may have."""
MAX_TIME: Final = 253_402_300_799_999
"""The latest time a log may hold, in epoch milliseconds: the end of the year 9999 (UTC), the
last moment :class:`datetime.datetime` can show."""

_SAFE: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_ESCAPE: Final = re.compile(r"~([0-9A-F]{2})")
_ENVELOPE: Final = frozenset({"type", "seq", "time", "data"})
_BULK_BYTES: Final = 1 << 16
"""About how many bytes of complete lines :func:`_decode_lines` decodes in one call."""
_LINE_DEPTH: Final = MAX_JSON_DEPTH + 1
"""How deep an event line may nest: its data, inside the envelope."""
_OPENERS: Final = bytes.maketrans(b"{", b"[")
_NOT_OPENER_OR_NEWLINE: Final = bytes(set(range(256)) - set(b"[{\n"))
_TOO_MANY_OPENERS: Final = b"[" * (_LINE_DEPTH + 1)
"""Lines translated to their opening brackets hold this if one could nest too deep."""
_TIME_RANGE: Final = f"an integer from 0 to {MAX_TIME} (epoch milliseconds up to the year 9999)"
_EVENT_TYPES: Final = {event_type: event_type for event_type in EVENT_TYPES}
"""One shared copy of each known event type, instead of one string per loaded event."""


@dataclass(frozen=True, slots=True)
class SessionHeader:
    """The first line of a session log."""

    id: str
    created_at: int
    version: int = FORMAT_VERSION


@dataclass(frozen=True, slots=True)
class Scan:
    """What a log holds: its header, the valid events, and where the committed bytes end.

    ``torn`` holds the bytes after ``committed_bytes``: a torn tail that recovery cuts off.
    """

    header: SessionHeader
    events: tuple[SessionEvent, ...]
    committed_bytes: int
    torn: bytes


def encode_session_id(session_id: str) -> str:
    """Escape *session_id* into a single, safe directory name.

    :raises InvalidSessionIdError: if the id is empty, or too long once escaped.
    """
    checked: object = session_id
    if not isinstance(checked, str) or not checked:
        raise InvalidSessionIdError(f"a session id must be a non-empty string, not {checked!r}")
    raw = session_id.encode("utf-8", "surrogatepass")
    if raw.strip(b".") == b"":
        escaped = "".join(f"~{byte:02X}" for byte in raw)
    else:
        escaped = "".join(chr(byte) if byte in _SAFE else f"~{byte:02X}" for byte in raw)
    if len(escaped) > MAX_ESCAPED_ID:
        raise InvalidSessionIdError(
            f"session id is too long: {len(escaped)} bytes once escaped, "
            f"at most {MAX_ESCAPED_ID} (id starts {session_id[:40]!r})"
        )
    return escaped


def decode_session_id(name: str) -> str:
    """Invert :func:`encode_session_id`."""
    raw = _ESCAPE.sub(lambda match: chr(int(match.group(1), 16)), name).encode("latin-1")
    return raw.decode("utf-8", "surrogatepass")


def encode_header(header: SessionHeader) -> bytes:
    line = {
        "format": FORMAT,
        "version": header.version,
        "id": header.id,
        "createdAt": header.created_at,
    }
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


def _decode_header(line: bytes, path: Path, *, fresh_stack: bool) -> SessionHeader:
    try:
        record = json.loads(line)
    except ValueError:
        record = None
    except RecursionError:
        if not fresh_stack:
            raise
        record = None  # too deep for a whole stack
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise CorruptLogError(path, 1, "the first line is not a kai-session header")
    version = record.get("version")
    if type(version) is int and version > FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"{path} was written in session format version {version}, newer than version "
            f"{FORMAT_VERSION} which this release reads; upgrade kai-session-checkpoint-policy"
        )
    if version != FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"{path} has session format version {version!r}; this release reads only "
            f"version {FORMAT_VERSION}"
        )
    session_id, created_at = record.get("id"), record.get("createdAt")
    if not isinstance(session_id, str) or not session_id:
        raise CorruptLogError(path, 1, "the header has no session id")
    if type(created_at) is not int or not 0 <= created_at <= MAX_TIME:
        raise CorruptLogError(path, 1, f"the header's createdAt is not {_TIME_RANGE}")
    return SessionHeader(session_id, created_at, version)


def encode_events(events: Sequence[SessionEvent]) -> bytes:
    """The log lines of *events*, each ending in a newline; nothing for no events."""
    if not events:
        return b""
    return ("\n".join([event.encode() for event in events]) + "\n").encode()


class _NotFinite(ValueError):
    """A number a session log cannot hold: NaN, an infinity, or a float that overflows."""


def _reject_constant(name: str) -> NoReturn:
    raise _NotFinite(f"{name} is not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(f"{text} is not a finite number")
    return value


_decoder: Final = json.JSONDecoder(parse_float=_finite_float, parse_constant=_reject_constant)
_first: Final = itemgetter(0)


def _decode_event(
    line: bytes, expected_seq: int, *, fresh_stack: bool
) -> SessionEvent | tuple[str, bool]:
    """Decode one event line, or say why it is not the event expected next.

    A line that is not the event expected comes with whether it is a complete record all the
    same (a JSON object, NaN and infinities allowed, or a line nested too deep to decode): such
    a line is never a torn tail.
    """
    try:
        text = line.decode("utf-8", "surrogatepass")  # as the fast path decodes it
        record = _decoder.decode(text)
    except RecursionError:
        if not fresh_stack:
            raise
        return _nested_too_deep(f"more than {_LINE_DEPTH}"), True
    except _NotFinite as exc:
        try:
            lenient = json.loads(text)
        except (ValueError, RecursionError):
            lenient = None
        return str(exc), isinstance(lenient, dict)
    except ValueError as exc:
        return f"not valid JSON ({exc})", False
    if not isinstance(record, dict):
        return "not a JSON object", False
    # A line nests no deeper than it has brackets: most lines need not be measured.
    if line.count(b"[") + line.count(b"{") > _LINE_DEPTH:
        depth = json_depth(record)
        if depth > _LINE_DEPTH:
            return _nested_too_deep(str(depth)), True
    if record.keys() != _ENVELOPE:
        return "not an event envelope with exactly type, seq, time and data", True
    event_type, seq, time, data = record["type"], record["seq"], record["time"], record["data"]
    if not isinstance(event_type, str) or not event_type:
        return "the event type is not a non-empty string", True
    if type(time) is not int or not 0 <= time <= MAX_TIME:
        return f"the event time is not {_TIME_RANGE}", True
    if type(seq) is not int:
        return "the event seq is not an integer", True
    if seq != expected_seq:
        return f"seq {seq} where {expected_seq} was expected", True
    if not isinstance(data, dict):
        return "the event data is not a JSON object", True
    return SessionEvent(event_type, seq, time, data)


def _nested_too_deep(depth: str) -> str:
    return (
        f"the line is nested {depth} levels deep; an event line nests at most {_LINE_DEPTH} "
        f"(its data at most {MAX_JSON_DEPTH})"
    )


def _decode_lines(data: bytes, start: int, end: int, seq: int) -> list[SessionEvent] | None:
    """Decode the complete lines ``data[start:end]`` at once, if all are the events expected.

    The fast path of :func:`scan_log`: the lines are wrapped as ``[[line],[line],...]`` and
    decoded in one call, which also shares one copy of each key among all the events. A line
    boundary can only separate the wrappers if every line is a complete JSON value (a string
    cannot span lines), and a wrapper must hold exactly one value, so a line is accepted here
    only if decoding it alone gives the same event. Anything else returns ``None``: the caller
    then decodes line by line, which alone reports or cuts damage.
    """
    lines = data[start:end]
    try:
        text = lines.decode("utf-8", "surrogatepass")
        wrapped = _decoder.decode("[[" + text.replace("\n", "\n],[")[:-2] + "]")
    except (ValueError, RecursionError):  # damage, or a deep stack: decoded line by line
        return None
    # Checked a column at a time with builtins, which is several times faster than a loop.
    if len(wrapped) != lines.count(b"\n") or set(map(len, wrapped)) != {1}:
        return None  # not exactly one value per line
    records = list(map(_first, wrapped))
    try:
        if set(map(len, records)) != {len(_ENVELOPE)}:
            return None
        columns = [list(map(itemgetter(key), records)) for key in ("type", "seq", "time", "data")]
    except (TypeError, KeyError):  # not objects, or four keys but not the envelope's
        return None
    types, seqs, times, datas = columns
    if (
        set(map(type, types)) != {str}
        or "" in types
        or set(map(type, seqs)) != {int}
        or seqs != list(range(seq, seq + len(seqs)))
        or set(map(type, times)) != {int}
        or min(times) < 0
        or max(times) > MAX_TIME
        or set(map(type, datas)) != {dict}
        # Only where a line has more brackets than it may nest levels, measure the data.
        or (
            _TOO_MANY_OPENERS in lines.translate(_OPENERS, _NOT_OPENER_OR_NEWLINE)
            and json_depth(datas) > MAX_JSON_DEPTH + 1
        )
    ):
        return None
    types = cast("list[str]", list(map(_EVENT_TYPES.get, types, types)))
    return list(map(SessionEvent, types, seqs, times, datas))


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a log's events are created.

    Every few hundred new containers trigger a collection, and each full collection walks
    every live object, so creating a million long-lived events spends most of its time in
    collections that free nothing. The collector is restored as it was (as Mercurial's
    ``util.nogc`` does); reference counting frees everything else meanwhile.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def scan_log(data: bytes, path: Path) -> Scan:
    """Read a whole log; separate its committed events from a torn tail.

    The torn tail is what follows the last event, if none of it is a complete record: a final
    line without its newline, and lines that are not JSON objects (garbage, zeros). A line that
    is not the event expected next is corruption if it is a complete record all the same (a
    JSON object: another envelope, a seq out of order, a non-finite number, a time out of
    range, nesting too deep), or if one follows it. How deep the caller's stack is does not
    matter.

    :raises CorruptLogError: naming *path* and the line.
    :raises UnsupportedFormatError: if the header has another format version.
    """
    try:
        return _scan(data, path, fresh_stack=False)
    except RecursionError:  # the caller's stack, or a line, is too deep to decode on it
        return on_fresh_stack(partial(_scan, data, path, fresh_stack=True))


def _scan(data: bytes, path: Path, *, fresh_stack: bool) -> Scan:
    end = data.find(b"\n")
    if end < 0:
        raise CorruptLogError(path, 1, "the header line is incomplete")
    header = _decode_header(data[:end], path, fresh_stack=fresh_stack)
    events: list[SessionEvent] = []
    offset = end + 1
    with _collector_paused():
        while (stop := data.rfind(b"\n", offset, offset + _BULK_BYTES)) >= 0 or (
            stop := data.find(b"\n", offset)
        ) >= 0:
            lines = _decode_lines(data, offset, stop + 1, len(events))
            if lines is None:
                break
            events += lines
            offset = stop + 1
    committed = offset
    line_number = 1 + len(events)
    damage: tuple[int, str] | None = None  # the first damaged line after the last event
    while (end := data.find(b"\n", offset)) >= 0:
        line_number += 1
        decoded = _decode_event(data[offset:end], len(events), fresh_stack=fresh_stack)
        offset = end + 1
        if isinstance(decoded, SessionEvent) and damage is None:
            events.append(decoded)
            committed = offset
            continue
        problem, record = ("", True) if isinstance(decoded, SessionEvent) else decoded
        if record and damage is not None:
            raise CorruptLogError(
                path,
                damage[0],
                f"{damage[1]}; line {line_number} after it is a complete record, so this is "
                "not a torn tail",
            )
        if record:
            raise CorruptLogError(path, line_number, problem)
        damage = damage or (line_number, problem)
    return Scan(header, tuple(events), committed, data[committed:])
