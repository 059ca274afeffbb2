"""What a session id may be, and how it becomes a directory name.

Any non-empty string is a session id (:func:`check_session_id`); a backend may refuse ids it
cannot store, naming why. On disk, an id is escaped one UTF-16 unit at a time into a single,
safe directory name (:func:`encode_session_id`): ASCII letters, digits, ``.``, ``_`` and ``-``
stay as they are, every other unit (``~`` included) becomes ``~`` and four upper-case hex
digits; the ids ``.`` and ``..`` are escaped whole. A working directory becomes a project key
the same way, with each run of ``/``, ``\\`` and ``:`` written as one ``-``
(:func:`project_directory`). This project's earlier layout escaped an id per UTF-8 byte as
``~XX`` (:func:`earlier_directory`), and is still read.
"""

from __future__ import annotations

import re
import struct
from typing import Final

from .errors import InvalidSessionIdError

__all__ = [
    "MAX_ESCAPED_ID",
    "MAX_PROJECT_KEY",
    "NO_CWD",
    "check_session_id",
    "decode_earlier_directory",
    "decode_session_id",
    "earlier_directory",
    "encode_session_id",
    "project_directory",
]

NO_CWD: Final = "_no-cwd"
"""The project directory of the sessions without a working directory."""
MAX_ESCAPED_ID: Final = 255
"""The longest escaped id: the longest name a directory may have."""
MAX_PROJECT_KEY: Final = 251

_SAFE: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_SAFE_ID: Final = re.compile(r"[A-Za-z0-9._-]+")
_SEPARATORS: Final = frozenset(b"/\\:")
_UNIT_ESCAPE: Final = re.compile(r"~([0-9A-F]{4})|(.)", re.DOTALL)
_BYTE_ESCAPE: Final = re.compile(r"~([0-9A-F]{2})")


def _units(text: str) -> tuple[int, ...]:
    raw = text.encode("utf-16-le", "surrogatepass")
    return struct.unpack(f"<{len(raw) // 2}H", raw)


def _escape_unit(unit: int) -> str:
    return chr(unit) if unit in _SAFE else f"~{unit:04X}"


def check_session_id(session_id: object) -> str:
    """*session_id*, if it can name a session: a non-empty string.

    :raises InvalidSessionIdError: if it is not.
    """
    if not isinstance(session_id, str) or not session_id:
        raise InvalidSessionIdError(f"a session id must be a non-empty string, not {session_id!r}")
    return session_id


def encode_session_id(session_id: str) -> str:
    """Escape *session_id* into a single, safe directory name.

    :raises InvalidSessionIdError: if the id is empty, or too long once escaped.
    """
    check_session_id(session_id)
    if session_id in (".", ".."):
        escaped = "~002E" * len(session_id)
    elif _SAFE_ID.fullmatch(session_id):
        escaped = session_id
    else:
        escaped = "".join(map(_escape_unit, _units(session_id)))
    if len(escaped) > MAX_ESCAPED_ID:
        raise InvalidSessionIdError(
            f"session id is too long: {len(escaped)} bytes once escaped, "
            f"at most {MAX_ESCAPED_ID} (id starts {session_id[:40]!r})"
        )
    return escaped


def decode_session_id(name: str) -> str:
    """Invert :func:`encode_session_id`."""
    units = [
        int(escape, 16) if escape else ord(literal)
        for escape, literal in _UNIT_ESCAPE.findall(name)
    ]
    return struct.pack(f"<{len(units)}H", *units).decode("utf-16-le", "surrogatepass")


def project_directory(cwd: str | None) -> str:
    """The project directory of a session whose working directory is *cwd* (or none).

    :raises InvalidSessionIdError: if *cwd* is empty.
    """
    if cwd is None:
        return NO_CWD
    if not cwd:
        raise InvalidSessionIdError("a working directory must be a non-empty path")
    parts: list[str] = []
    separated = False
    for unit in _units(cwd):
        if unit in _SEPARATORS:
            if not separated:
                parts.append("-")
            separated = True
        else:
            parts.append(_escape_unit(unit))
            separated = False
    key = "".join(parts).lstrip("-") or "root"
    return f"--{key[:MAX_PROJECT_KEY]}--"


def earlier_directory(session_id: str) -> str:
    """The directory of *session_id* in this project's earlier layout (``~XX`` per byte)."""
    raw = session_id.encode("utf-8", "surrogatepass")
    if raw.strip(b".") == b"":
        return "".join(f"~{byte:02X}" for byte in raw)
    return "".join(chr(byte) if byte in _SAFE else f"~{byte:02X}" for byte in raw)


def decode_earlier_directory(name: str) -> str:
    """Invert :func:`earlier_directory`."""
    raw = _BYTE_ESCAPE.sub(lambda match: chr(int(match.group(1), 16)), name).encode("latin-1")
    return raw.decode("utf-8", "surrogatepass")
