"""Marks left by a backend's own threads and tasks, for a test to wait on instead of time.

A backend that gathers the batches of many sessions into one job
(:class:`~kai_session_checkpoint_policy.persistence.workers.Gathering`) queues them while a job
runs; :func:`gathering_marks` makes each one queued leave a mark.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Final

import anyio.to_thread

if TYPE_CHECKING:
    from collections.abc import Callable

    from kai_session_checkpoint_policy.persistence.workers import Gathering

__all__ = ["WAIT", "Marks", "gathering_marks"]

WAIT: Final = 10.0
"""Seconds a test waits at most for a state its backend's threads or tasks reach."""


class Marks:
    """Marks that the backend's own threads or tasks leave as they go (a batch queued behind a
    group commit, a lease renewal's outcome), which wake a test waiting for a state."""

    def __init__(self) -> None:
        self._count = 0
        self._marked = threading.Condition()

    def mark(self, *_: object) -> None:
        with self._marked:
            self._count += 1
            self._marked.notify_all()

    async def until(self, condition: Callable[[], object], what: str) -> None:
        """Wait (bounded) for a state that the backend's own threads or tasks reach: *what*,
        checked on the loop's thread at first and after each mark."""
        deadline = time.monotonic() + WAIT
        while True:
            with self._marked:
                seen = self._count
            if condition():
                return

            def marked(seen: int = seen) -> bool:
                left = max(deadline - time.monotonic(), 0)
                with self._marked:
                    return self._marked.wait_for(lambda: self._count > seen, left)

            assert await anyio.to_thread.run_sync(marked), f"never reached: {what}"


class _MarkedQueue(list[Any]):
    """A gathering's queue that marks each item queued."""

    def __init__(self, marks: Marks) -> None:
        super().__init__()
        self._marks = marks

    def append(self, item: Any) -> None:
        super().append(item)
        self._marks.mark()


def gathering_marks(gathering: Gathering[Any]) -> Marks:
    """Marks of the items queued from now on behind *gathering*'s job in flight (which took
    the items queued before)."""
    marks = Marks()
    assert gathering.busy
    assert not gathering._waiting
    gathering._waiting = _MarkedQueue(marks)
    return marks
