"""Moved to :mod:`.jsonl.plugin` (the entry point ``session-persistence-jsonl``); this module
re-exports its names until version 0.4, hook implementations included."""

from .jsonl.plugin import (
    COMPRESSION_OPTION,
    INLINE_OPTION,
    PACK_OPTION,
    ROOT_OPTION,
    WINDOW_OPTION,
    host_configure,
    host_declare_options,
    name,
)

__all__ = [
    "COMPRESSION_OPTION",
    "INLINE_OPTION",
    "PACK_OPTION",
    "ROOT_OPTION",
    "WINDOW_OPTION",
    "host_configure",
    "host_declare_options",
    "name",
]
