"""Group commit: the batches of different sessions that are due together share one transaction.

The flushes of a live host gather their batches on the event loop, one worker job for each
group (``Gathering``, in the backend). Blocking writes made in threads of their own (an inline
write, a whole log, a batch written again on its own) meet here instead: worker threads hand
their batches to one :class:`GroupCommit`. A thread that finds no commit in progress commits
everything queued, its own batch included; threads that arrive meanwhile queue up and wait, and
are committed together by the next commit. Either way, 100 sessions checkpointing at once cost a
few transactions (a few WAL flushes), not 100. If the shared transaction refuses one batch (a
lease lost, a seq that does not follow), each batch is written again in a transaction of its
own, so that the refusal reaches only its session.
"""

from __future__ import annotations

import copy
import threading
from typing import TYPE_CHECKING

from ..errors import LeaseLostError, SeqMismatchError

if TYPE_CHECKING:
    from .store import Batch, PostgresSessionStore

__all__ = ["GroupCommit"]


class _Queued:
    """One session's batch waiting for a group commit, and what became of it."""

    __slots__ = ("alone", "batch", "done", "error", "wake")

    def __init__(self, batch: Batch, wake: threading.Event | None) -> None:
        self.batch = batch
        self.wake = wake  # set once done, or to lead the next commit; None: it leads at once
        self.done = False
        self.alone = False  # the shared transaction refused a batch: write this one on its own
        self.error: BaseException | None = None


class GroupCommit:
    """Commits the batches that worker threads hand it, those queued together in one transaction.

    A thread that finds no commit in progress commits everything queued, its own batch
    included. Threads that arrive meanwhile queue up and wait; when the commit is over, its
    leader wakes the threads whose batches it wrote, and the first of those queued since, who
    commits all of them. Nothing waits for company: a lone batch is committed at once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[_Queued] = []
        self._committing = False
        self.transactions = 0

    def committed(self) -> None:
        """Count a transaction committed for a group outside :meth:`append`."""
        with self._lock:
            self.transactions += 1

    @property
    def busy(self) -> bool:
        """Whether a commit is in progress (a thread calling :meth:`append` might wait)."""
        return self._committing

    def append(self, store: PostgresSessionStore, batch: Batch) -> None:
        """Make *batch* durable, maybe in one transaction with batches of other sessions."""
        with self._lock:
            leader = not self._committing
            # Only a batch that waits needs an event to be woken by (made under the lock,
            # before anyone can see the batch queued).
            mine = _Queued(batch, None if leader else threading.Event())
            self._queue.append(mine)
            self._committing = True
        if mine.wake is not None:
            mine.wake.wait()
            leader = not mine.done  # woken to lead the next commit
        if leader:
            with self._lock:
                group, self._queue = self._queue, []
            try:
                self._commit(store, group)
            finally:
                with self._lock:
                    successor = self._queue[0] if self._queue else None
                    self._committing = successor is not None
                for queued in group:
                    if queued.wake is not None:
                        queued.wake.set()
                if successor is not None:
                    assert successor.wake is not None  # it was queued behind a commit
                    successor.wake.set()
        if mine.alone:
            store.append_many([batch])
            with self._lock:
                self.transactions += 1
        elif mine.error is not None:
            if leader:
                raise mine.error
            raise copy.copy(mine.error) from mine.error  # an exception of this thread's own

    def _commit(self, store: PostgresSessionStore, group: list[_Queued]) -> None:
        try:
            store.append_many([queued.batch for queued in group])
        except (LeaseLostError, SeqMismatchError) as refused:
            # Nothing was written; the error names one session. The others go on alone.
            for queued in group:
                queued.alone = len(group) > 1
                queued.error = None if queued.alone else refused
        except Exception as exc:
            for queued in group:
                queued.error = exc
        else:
            with self._lock:
                self.transactions += 1
        finally:
            for queued in group:
                queued.done = True
