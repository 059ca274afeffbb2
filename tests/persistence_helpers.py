"""Building blocks shared by the persistence tests: logs written by hand, and file layers."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from kai_session_checkpoint_policy import TextBlock, ToolResult
from kai_session_checkpoint_policy.events import (
    JSON,
    JSONObject,
    SessionEvent,
    encode_data,
    tool_result_data,
)
from kai_session_checkpoint_policy.persistence import OsFiles
from kai_session_checkpoint_policy.persistence.format import (
    LOCK_NAME,
    LOG_NAME,
    SessionHeader,
    encode_header,
    encode_session_id,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

T0 = 1_700_000_000_000


def event(event_type: str, seq: int, data: JSONObject, time: int = T0) -> SessionEvent:
    copy, encoded = encode_data(event_type, data)
    return SessionEvent(event_type, seq, time + seq, copy, encoded)


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
    return "tool/result", tool_result_data(turn, step, call_id, ToolResult((TextBlock("ok"),)))


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


def write_log(root: Path, session_id: str, data: bytes) -> Path:
    """Write a log file by hand, as a crashed writer would have left it."""
    directory = root / encode_session_id(session_id)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOG_NAME
    path.write_bytes(data)
    return path


def lines(path: Path) -> list[JSONObject]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


class GatedFiles(OsFiles):
    """Real files whose next ``write`` call waits until :attr:`release` is set.

    The wait blocks the thread that writes: give the backend ``inline_write_limit=0`` so that
    every write runs in a worker thread, never on the event loop's.
    """

    def __init__(self) -> None:
        super().__init__()
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
