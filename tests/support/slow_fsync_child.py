"""``kai-checkpoint agent`` on a disk whose fsync of the tool checkpoint is slow, for SIGINT tests.

Run as ``python slow_fsync_child.py MARKER [--signal-in-worker] ARGS...``: ARGS are the
command line of ``kai-checkpoint``. With ``--signal-in-worker``, the write goes to a worker
thread, and that thread sends SIGINT to itself once the slow fsync has started (instead of the
test sending it to the process): the signal reaches a thread that is not the event loop's.
The fsync that follows the write of a ``tool/call`` writes
``fsync-started`` into MARKER, and then does not finish until the agent's task has been
cancelled (by the SIGINT the test sends): the cancellation is sure to land while the write is
in flight. Nothing else about the file layer changes.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from kai_session_checkpoint_policy import SessionEvent, cli
from kai_session_checkpoint_policy.demo import write_marker
from kai_session_checkpoint_policy.persistence import Compression, JsonlSessionPersistence, OsFiles

_main_task: list[asyncio.Task[object]] = []
_slow_next = threading.Event()


def _patch(marker: Path, *, signal_in_worker: bool) -> None:
    encode, fsync, agent = JsonlSessionPersistence._encode, OsFiles.fsync, cli._agent

    def patched_encode(
        self: JsonlSessionPersistence, events: Sequence[SessionEvent], compression: Compression
    ) -> bytes:
        if any(event.type == "tool/call" for event in events):
            _slow_next.set()  # the fsync of this batch is the slow one
        return encode(self, events, compression)

    def patched_fsync(self: OsFiles, fd: int) -> None:
        if _slow_next.is_set():
            _slow_next.clear()
            write_marker(marker, "fsync-started")
            if signal_in_worker:
                assert threading.current_thread() is not threading.main_thread()
                signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            deadline = time.monotonic() + 30
            while not _cancelling() and time.monotonic() < deadline:
                time.sleep(0.005)  # the slow disk: it finishes once the cancellation is in
        fsync(self, fd)

    async def patched_agent(args: object) -> int:
        task = asyncio.current_task()
        assert task is not None
        _main_task.append(task)
        return await agent(args)  # type: ignore[arg-type]

    if signal_in_worker:
        JsonlSessionPersistence._may_write_inline = (  # type: ignore[method-assign]
            lambda self, writer: False
        )
    JsonlSessionPersistence._encode = patched_encode  # type: ignore[method-assign]
    OsFiles.fsync = patched_fsync  # type: ignore[method-assign]
    cli._agent = patched_agent


def _cancelling() -> bool:
    if sys.version_info >= (3, 11):
        return bool(_main_task[0].cancelling())
    raise RuntimeError("Task.cancelling() is new in Python 3.11")


if __name__ == "__main__":
    arguments = sys.argv[2:]
    in_worker = arguments[:1] == ["--signal-in-worker"]
    _patch(Path(sys.argv[1]), signal_in_worker=in_worker)
    sys.exit(cli.main(arguments[1:] if in_worker else arguments))
