"""Entry point ``session-persistence-jsonl``: a JSONL backend configured from host options.

A host opened with the option ``"jsonl.root"`` (a path) gets a
:class:`~kai_session_checkpoint_policy.persistence.JsonlSessionPersistence` under that
directory; ``"jsonl.batch_window"`` (seconds) sets its batch window and
``"jsonl.inline_write_limit"`` (seconds) its inline write limit, ``"jsonl.compression"``
(``"zstd"`` or ``"none"``) how new logs are written, ``"jsonl.pack_chunks"`` (a bool)
whether runs of deltas are packed, and ``"jsonl.shared_sync"`` (a bool) whether batches
written at once share one ``syncfs``. Without the root option this plugin does nothing, and
imports nothing more.

It needs only what :class:`~kai_session_checkpoint_policy.contract.PluginHost` declares.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Final

from ...hookspecs import hookimpl
from ..options import seconds_option

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ...contract import PluginHost

__all__ = [
    "COMPRESSION_OPTION",
    "INLINE_OPTION",
    "PACK_OPTION",
    "ROOT_OPTION",
    "SHARED_SYNC_OPTION",
    "WINDOW_OPTION",
    "name",
]

name: Final = "session-persistence-jsonl"
ROOT_OPTION: Final = "jsonl.root"
WINDOW_OPTION: Final = "jsonl.batch_window"
INLINE_OPTION: Final = "jsonl.inline_write_limit"
COMPRESSION_OPTION: Final = "jsonl.compression"
PACK_OPTION: Final = "jsonl.pack_chunks"
SHARED_SYNC_OPTION: Final = "jsonl.shared_sync"


@hookimpl
def host_declare_options() -> Mapping[str, str]:
    return {
        ROOT_OPTION: "the directory of the JSONL session logs (loads the JSONL backend)",
        WINDOW_OPTION: "seconds an event may wait for a background batch (default 0.2)",
        INLINE_OPTION: "seconds a write may take to stay on the event loop's thread (0.002)",
        COMPRESSION_OPTION: "how new logs are written: 'zstd' (the default) or 'none'",
        PACK_OPTION: "whether runs of three or more deltas are packed into one row (True)",
        SHARED_SYNC_OPTION: "whether batches written at once share one syncfs (True)",
    }


@hookimpl
def host_configure(host: PluginHost[Any]) -> None:
    options = host.options
    root = options.get(ROOT_OPTION)
    if root is None:
        return
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"host option {ROOT_OPTION!r} must be a path, not {root!r}")
    from ..core import DEFAULT_BATCH_WINDOW
    from .backend import (
        DEFAULT_COMPRESSION,
        DEFAULT_INLINE_WRITE_LIMIT,
        DEFAULT_PACK_CHUNKS,
        JsonlSessionPersistence,
    )

    compression = options.get(COMPRESSION_OPTION, DEFAULT_COMPRESSION)
    if compression not in ("zstd", "none"):
        raise TypeError(
            f"host option {COMPRESSION_OPTION!r} must be 'zstd' or 'none', not {compression!r}"
        )
    pack = options.get(PACK_OPTION, DEFAULT_PACK_CHUNKS)
    if not isinstance(pack, bool):
        raise TypeError(f"host option {PACK_OPTION!r} must be True or False, not {pack!r}")
    shared = options.get(SHARED_SYNC_OPTION, True)
    if not isinstance(shared, bool):
        raise TypeError(f"host option {SHARED_SYNC_OPTION!r} must be True or False, not {shared!r}")
    backend = JsonlSessionPersistence(
        os.fspath(root),
        batch_window=seconds_option(options, WINDOW_OPTION, DEFAULT_BATCH_WINDOW),
        inline_write_limit=seconds_option(options, INLINE_OPTION, DEFAULT_INLINE_WRITE_LIMIT),
        compression=compression,
        pack_chunks=pack,
        shared_sync=shared,
    )
    host.register(backend, name=f"{name}:{backend.root}")
