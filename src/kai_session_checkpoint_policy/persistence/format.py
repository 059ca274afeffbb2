"""Moved: the file format to :mod:`.jsonl.format`, one event record to :mod:`.records`, session
ids to :mod:`.ids`, the header to :mod:`.values`. This module re-exports their names until
version 0.4."""

from .ids import decode_session_id, earlier_directory, encode_session_id, project_directory
from .jsonl.format import (
    COMPRESSIONS,
    EARLIER_FORMAT,
    EARLIER_FORMAT_VERSION,
    LOCK_NAME,
    LOG_NAME,
    NO_CWD,
    ZSTD_LOG_NAME,
    Compression,
    Scan,
    compress_frame,
    encode_events,
    encode_header,
    log_name,
    read_header,
    salvage,
    scan_log,
)
from .records import MAX_TIME, RecordError, decode_event
from .values import FORMAT_VERSION, SessionHeader

__all__ = [
    "COMPRESSIONS",
    "EARLIER_FORMAT",
    "EARLIER_FORMAT_VERSION",
    "FORMAT_VERSION",
    "LOCK_NAME",
    "LOG_NAME",
    "MAX_TIME",
    "NO_CWD",
    "ZSTD_LOG_NAME",
    "Compression",
    "RecordError",
    "Scan",
    "SessionHeader",
    "compress_frame",
    "decode_event",
    "decode_session_id",
    "earlier_directory",
    "encode_events",
    "encode_header",
    "encode_session_id",
    "log_name",
    "project_directory",
    "read_header",
    "salvage",
    "scan_log",
]
