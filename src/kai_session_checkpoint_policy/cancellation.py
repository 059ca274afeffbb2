"""Cancellation checks that cost nothing when nothing was cancelled.

A checkpoint is a cancel point: a caller cancelled while it waited for a flush must not go on
to run the adapter or the tool body. anyio's ``checkpoint_if_cancelled`` sees anyio's cancel
scopes; a native ``Task.cancel()`` on asyncio, requested during the current step of the task,
is seen only by the task itself. :func:`checkpoint_if_cancelled` checks both, and yields to the
scheduler only to deliver a cancellation, so the fast path of a flush stays without a round.

This module imports nothing from the rest of the package, so any host can use it.
"""

from __future__ import annotations

import asyncio

import anyio.lowlevel

__all__ = ["cancel_pending", "checkpoint_if_cancelled", "current_asyncio_task"]


def current_asyncio_task() -> asyncio.Task[object] | None:
    """The running asyncio task, or ``None`` on another event loop (trio)."""
    loop = asyncio._get_running_loop()  # None off asyncio: no exception to raise
    return None if loop is None else asyncio.current_task(loop)


def cancel_pending(task: asyncio.Task[object]) -> bool:
    """Whether ``task.cancel()`` was called and *task* has not yet been given its cancellation.

    True while the task runs after a ``cancel()`` of its own, and while it waits for the
    scheduler to resume it with the cancellation (``cancel()`` cancelled what it awaited).
    """
    # anyio reads the same attributes; both the C and the Python tasks have them.
    if getattr(task, "_must_cancel", False):
        return True
    waiter = getattr(task, "_fut_waiter", None)
    return isinstance(waiter, asyncio.Future) and waiter.cancelled()


async def checkpoint_if_cancelled() -> None:
    """Raise the caller's cancellation if one is pending; otherwise return without yielding."""
    task = current_asyncio_task()
    if task is not None and cancel_pending(task):
        await asyncio.sleep(0)  # delivers the cancellation
    await anyio.lowlevel.checkpoint_if_cancelled()
