"""Moved to :mod:`.jsonl.files`; this module re-exports its names until version 0.4."""

from .jsonl.files import TEMPORARY_NAME, LockedError, OsFiles

__all__ = ["TEMPORARY_NAME", "LockedError", "OsFiles"]
