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
import sys

import anyio.lowlevel

__all__ = ["checkpoint_if_cancelled"]


def _native_cancel_pending() -> bool:
    """Whether ``cancel()`` was called on the running asyncio task and not yet delivered."""
    if "asyncio" not in sys.modules:  # pragma: no cover - anyio imports it
        return False
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running asyncio loop: trio
        return False
    # anyio reads the same attribute; both the C and the Python tasks have it.
    return task is not None and bool(getattr(task, "_must_cancel", False))


async def checkpoint_if_cancelled() -> None:
    """Raise the caller's cancellation if one is pending; otherwise return without yielding."""
    if _native_cancel_pending():
        await asyncio.sleep(0)  # delivers the cancellation
    await anyio.lowlevel.checkpoint_if_cancelled()
