"""Entry point ``session-persistence-jsonl``: a JSONL backend configured from host options.

A host opened with the option ``"jsonl.root"`` gets a :class:`JsonlSessionPersistence` under
that directory; ``"jsonl.batch_window"`` (seconds) sets its batch window. Without the root
option this plugin does nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..hookspecs import hookimpl
from .jsonl import DEFAULT_BATCH_WINDOW, JsonlSessionPersistence

if TYPE_CHECKING:
    from ..host import Host

name: Final = "session-persistence-jsonl"
ROOT_OPTION: Final = "jsonl.root"
WINDOW_OPTION: Final = "jsonl.batch_window"


@hookimpl
def host_configure(host: Host) -> None:
    root = host.options.get(ROOT_OPTION)
    if root is None:
        return
    if not isinstance(root, str):
        raise TypeError(f"host option {ROOT_OPTION!r} must be a path string, not {root!r}")
    window = host.options.get(WINDOW_OPTION, DEFAULT_BATCH_WINDOW)
    if not isinstance(window, (int, float)):
        raise TypeError(f"host option {WINDOW_OPTION!r} must be seconds, not {window!r}")
    host.register(JsonlSessionPersistence(root, batch_window=window), name=f"{name}:{root}")
