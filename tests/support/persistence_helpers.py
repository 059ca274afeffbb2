"""Building blocks shared by the persistence tests: logs written by hand, and file layers."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from kai_session_checkpoint_policy import TextBlock, ToolResult, eventdata
from kai_session_checkpoint_policy.events import (
    JSON,
    SURFACE_EVENT_TYPES,
    JSONObject,
    SessionEvent,
    SurfaceOp,
    encode_data,
)
from kai_session_checkpoint_policy.persistence import OsFiles
from kai_session_checkpoint_policy.persistence.ids import encode_session_id
from kai_session_checkpoint_policy.persistence.jsonl.format import (
    LOCK_NAME,
    LOG_NAME,
    NO_CWD,
    ZSTD_LOG_NAME,
    Compression,
    compress_frame,
    encode_header,
    scan_log,
)
from kai_session_checkpoint_policy.persistence.values import SessionHeader

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

T0 = 1_700_000_000_000


def event(event_type: str, seq: int, data: JSONObject, time: int = T0) -> SessionEvent:
    """An event as the reference host appends it: a surface event has ``surfaceOp`` append."""
    copy, encoded = encode_data(event_type, data)
    surface: SurfaceOp | None = "append" if event_type in SURFACE_EVENT_TYPES else None
    return SessionEvent(event_type, seq, time + seq, copy, encoded, surface)


def events(*records: tuple[str, JSONObject]) -> list[SessionEvent]:
    """Events with contiguous seqs from 0, times ``T0 + seq``."""
    return [event(event_type, seq, data) for seq, (event_type, data) in enumerate(records)]


def assistant(turn: int, step: int, *call_ids: str) -> tuple[str, JSONObject]:
    content: list[JSON] = [
        {"type": "tool-call", "id": call_id, "name": "write", "arguments": "{}"}
        for call_id in call_ids
    ]
    message: JSONObject = {
        "id": f"a-{turn}-{step}",
        "role": "assistant",
        "content": content,
        "source": {"kind": "model", "provider": "p", "model": "m"},
    }
    return "assistant/message", {"turn": turn, "step": step, "message": message}


def tool_call(turn: int, step: int, call_id: str) -> tuple[str, JSONObject]:
    return "tool/call", {
        "turn": turn,
        "step": step,
        "callId": call_id,
        "name": "write",
        "arguments": "{}",
    }


def tool_result(turn: int, step: int, call_id: str) -> tuple[str, JSONObject]:
    """A ``tool/result`` event as the host records it, answering *call_id* with ``ok``."""
    data = eventdata.tool_result(turn, step, call_id, ToolResult((TextBlock("ok"),)))
    return "tool/result", cast("JSONObject", data)


COMPLETE_TURN: list[tuple[str, JSONObject]] = [
    ("turn/start", {"turn": 1}),
    ("step/start", {"turn": 1, "step": 1}),
    ("user/message", {"id": "u-1", "role": "user", "content": [], "source": {"kind": "prompt"}}),
    ("assistant/message", assistant(1, 1)[1]),
    ("step/end", {"turn": 1, "step": 1}),
    ("turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
]


def log_bytes(session_id: str, logged: Iterable[SessionEvent]) -> bytes:
    body = "".join(f"{item.encode()}\n" for item in logged).encode()
    return encode_header(SessionHeader(session_id, T0)) + body


def log_path(root: Path, session_id: str, compression: Compression = "none") -> Path:
    """Where the log of *session_id* (without a working directory) is under *root*."""
    name = ZSTD_LOG_NAME if compression == "zstd" else LOG_NAME
    return root / NO_CWD / encode_session_id(session_id) / name


def find_log(root: Path, session_id: str) -> Path:
    """The log of *session_id* under *root* (without a working directory), whichever it is."""
    plain = log_path(root, session_id)
    return plain if plain.exists() else log_path(root, session_id, "zstd")


def compressed(data: bytes) -> bytes:
    """A plain log as a compressed one: its header line as a frame, its events as another."""
    end = data.index(b"\n") + 1
    return compress_frame(data[:end]) + (compress_frame(data[end:]) if data[end:] else b"")


def write_log(
    root: Path, session_id: str, data: bytes, *, compression: Compression = "none"
) -> Path:
    """Write a plain log file by hand (compressed, with *compression*), as a crashed writer
    would have left it."""
    path = log_path(root, session_id, compression)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(compressed(data) if compression == "zstd" else data)
    return path


def text_of(path: Path) -> bytes:
    """The text of a log file: its bytes, decompressed if it is compressed."""
    data = path.read_bytes()
    if path.name.endswith(".zstd"):
        return zstd.decompress(data)
    return data


def lines(path: Path) -> list[JSONObject]:
    """The records of a log file, the header first (packed rows as rows)."""
    return [json.loads(line) for line in text_of(path).splitlines()]


def stored_events(path: Path) -> Sequence[SessionEvent]:
    """The events a log file holds, as the backend reads them."""
    return scan_log(path.read_bytes(), path).events


class GatedFiles(OsFiles):
    """Real files whose next ``write`` call waits until :attr:`release` is set.

    The wait blocks the thread that writes: give the backend ``inline_write_limit=0`` so that
    every write runs in a worker thread, never on the event loop's. Put it before another
    layer to gate that one (``class GatedSim(GatedFiles, SimFiles)``): it passes its
    arguments on.
    """

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.gate_next = False

    def write(self, fd: int, data: bytes) -> None:
        if self.gate_next:
            self.gate_next = False
            self.entered.set()
            self.release.wait(30)
        super().write(fd, data)


class FailingFiles(OsFiles):
    """Real files whose chosen calls fail: ``fail["fsync"] = 1`` fails the next fsync once."""

    def __init__(self) -> None:
        super().__init__()
        self.fail: dict[str, int] = {}

    def _maybe_fail(self, call: str) -> None:
        if self.fail.get(call, 0) > 0:
            self.fail[call] -= 1
            raise OSError(5, f"injected {call} failure")

    def write(self, fd: int, data: bytes) -> None:
        self._maybe_fail("write")
        super().write(fd, data[: len(data) // 2])  # a partial write reaches the file first
        self._maybe_fail("write-after-partial")
        super().write(fd, data[len(data) // 2 :])

    def fsync(self, fd: int) -> None:
        self._maybe_fail("fsync")
        super().fsync(fd)

    def truncate(self, fd: int, size: int) -> None:
        self._maybe_fail("truncate")
        super().truncate(fd, size)


def tree(directory: Path, *, locks: bool = True) -> dict[str, tuple[bytes | None, int]]:
    """Every path under *directory* (symbolic links not followed), with its content and mode.

    A file's content is its bytes, a link's its target, a directory's ``None``. Without
    *locks*, the (empty) lock files a refused writer may leave are not listed.
    """
    found: dict[str, tuple[bytes | None, int]] = {}
    for path in sorted(directory.rglob("*")):
        if not locks and path.name == LOCK_NAME:
            continue
        if path.is_symlink():
            content: bytes | None = f"-> {os.readlink(path)}".encode()
        else:
            content = path.read_bytes() if path.is_file() else None
        found[path.relative_to(directory).as_posix()] = (content, path.lstat().st_mode)
    return found
