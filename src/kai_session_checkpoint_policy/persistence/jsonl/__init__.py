"""The JSONL backend: one log file per session, in the original harness's format.

:mod:`.format` is the file format (its docstring is the specification), :mod:`.files` the file
layer, :mod:`.backend` the backend class, :mod:`.plugin` the entry point
``session-persistence-jsonl``. Importing this package imports none of them; the names below
(those of the module this package replaces, ``persistence.jsonl``) are imported when first used.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from ..values import SessionListing, SessionProblem
    from .backend import (
        DEFAULT_COMPRESSION,
        DEFAULT_INLINE_WRITE_LIMIT,
        DEFAULT_PACK_CHUNKS,
        JsonlSessionPersistence,
        JsonlStatistics,
    )

_LAZY: _typing.Final = {
    "DEFAULT_COMPRESSION": ".backend",
    "DEFAULT_INLINE_WRITE_LIMIT": ".backend",
    "DEFAULT_PACK_CHUNKS": ".backend",
    "JsonlSessionPersistence": ".backend",
    "JsonlStatistics": ".backend",
    "SessionListing": "..values",
    "SessionProblem": "..values",
}
"""Where each name is defined: imported from there when first used."""

__all__ = [
    "DEFAULT_COMPRESSION",
    "DEFAULT_INLINE_WRITE_LIMIT",
    "DEFAULT_PACK_CHUNKS",
    "JsonlSessionPersistence",
    "JsonlStatistics",
    "SessionListing",
    "SessionProblem",
]


def _load(name: str) -> object:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = getattr(_importlib.import_module(module_name, __name__), name)
    globals()[name] = value
    return value


if not _typing.TYPE_CHECKING:  # type checkers see the imports above
    __getattr__ = _load


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
