"""Entry point ``session-persistence-jsonl``: a JSONL backend configured from host options.

A host opened with the option ``"jsonl.root"`` gets a :class:`JsonlSessionPersistence` under
that directory; ``"jsonl.batch_window"`` (seconds) sets its batch window and
``"jsonl.inline_write_limit"`` (seconds) its inline write limit. Without the root option this
plugin does nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..hookspecs import hookimpl
from .jsonl import DEFAULT_BATCH_WINDOW, DEFAULT_INLINE_WRITE_LIMIT, JsonlSessionPersistence

if TYPE_CHECKING:
    from ..host import Host

name: Final = "session-persistence-jsonl"
ROOT_OPTION: Final = "jsonl.root"
WINDOW_OPTION: Final = "jsonl.batch_window"
INLINE_OPTION: Final = "jsonl.inline_write_limit"


@hookimpl
def host_configure(host: Host) -> None:
    root = host.options.get(ROOT_OPTION)
    if root is None:
        return
    if not isinstance(root, str):
        raise TypeError(f"host option {ROOT_OPTION!r} must be a path string, not {root!r}")
    window = _seconds(host, WINDOW_OPTION, DEFAULT_BATCH_WINDOW)
    limit = _seconds(host, INLINE_OPTION, DEFAULT_INLINE_WRITE_LIMIT)
    backend = JsonlSessionPersistence(root, batch_window=window, inline_write_limit=limit)
    host.register(backend, name=f"{name}:{root}")


def _seconds(host: Host, option: str, default: float) -> float:
    value = host.options.get(option, default)
    if not isinstance(value, (int, float)):
        raise TypeError(f"host option {option!r} must be seconds, not {value!r}")
    return value
