"""What can go wrong when reading or writing a session log."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "CorruptLogError",
    "CorruptRecordError",
    "DatabaseError",
    "DuplicateLogError",
    "EncodingMismatchError",
    "EventTimeError",
    "InvalidSessionIdError",
    "LeaseLostError",
    "LiveSessionError",
    "LogChangedError",
    "MisplacedLogError",
    "NotARegularFileError",
    "PersistenceError",
    "RecoveryRequiredError",
    "RollbackError",
    "SeedMismatchError",
    "SeqMismatchError",
    "SessionLockedError",
    "SessionNotFoundError",
    "UnsupportedFormatError",
]


class PersistenceError(Exception):
    """Base class of every persistence error."""


class InvalidSessionIdError(PersistenceError, ValueError):
    """The session id cannot name a session (empty, or too long)."""


class SessionNotFoundError(PersistenceError, LookupError):
    """No log exists for the session id."""


class CorruptLogError(PersistenceError):
    """A log is damaged inside its committed region; nothing was changed.

    ``line`` is the damaged line (of the decompressed text, in a compressed log), or ``None``
    when the damage is a frame of a compressed log, which starts at ``byte``, or the data of
    an event recovery had to read (decoded only then), with ``seq``. ``seq`` is the seq of the
    first event that could not be read (the events before it are intact), when known.
    """

    def __init__(
        self,
        path: Path,
        line: int | None,
        problem: str,
        *,
        seq: int | None = None,
        byte: int | None = None,
    ) -> None:
        where = (
            f"line {line}"
            if line is not None
            else f"byte {byte}"
            if byte is not None
            else f"seq {seq}"
        )
        super().__init__(f"corrupt session log {path}, {where}: {problem}")
        self.path = path
        self.line = line
        self.problem = problem
        self.seq = seq
        self.byte = byte


class CorruptRecordError(CorruptLogError):
    """A stored event of a log in a database is damaged; nothing was changed.

    ``location`` names the database and the session, ``seq`` the damaged event.
    """

    def __init__(self, location: str, seq: int, problem: str) -> None:
        PersistenceError.__init__(self, f"corrupt session log {location}, seq {seq}: {problem}")
        self.location = location
        self.line = None
        self.byte = None
        self.seq = seq
        self.problem = problem


class EventTimeError(PersistenceError, ValueError):
    """An event's time is one no log can hold (not an integer of epoch milliseconds from 1970
    to the year 9999): the batch is refused before anything of it is written, since a log
    holding it could not be read back."""


class DuplicateLogError(PersistenceError):
    """A session has logs in two places (two project directories, or both a plain and a
    compressed log); neither was read or written."""


class MisplacedLogError(PersistenceError):
    """A log's header names another session, or a place other than where the log is (a log
    copied or moved by hand); it was not read or written as the session asked for."""


class RecoveryRequiredError(PersistenceError):
    """A log must be loaded with recovery before it is written to: it ends in a torn tail, or
    is in this project's earlier format; nothing was written."""


class LogChangedError(PersistenceError):
    """A log changed under its writer (another process wrote or cut it while this one held
    what it had written); nothing more was written."""


class DatabaseError(PersistenceError):
    """A database call failed, or the database could not be reached in time; the driver's
    exception is the cause. A batch that failed this way stays queued for the next flush."""


class UnsupportedFormatError(PersistenceError):
    """A log this release does not read, though it may be intact: another format version, an
    event type it does not know, or a file that is not a session log at all."""


class EncodingMismatchError(PersistenceError):
    """A root holds logs in one encoding, and a new session would be written in the other."""


class NotARegularFileError(PersistenceError):
    """A path the backend reads or writes is not a regular file; it was not read or written.

    A FIFO, a device, a directory, a socket or a symbolic link where a log, a kept torn tail
    or a lock file belongs is refused without blocking, naming the path and what it is.
    """

    def __init__(self, path: Path, kind: str) -> None:
        if kind == "a symbolic link":
            message = f"{path} is a symbolic link; refusing to follow it"
        else:
            message = f"{path} is {kind}, not a regular file; refusing to open it"
        super().__init__(message)
        self.path = path
        self.kind = kind


class SeqMismatchError(PersistenceError):
    """A batch does not continue the durable log exactly; nothing was written."""


class SeedMismatchError(PersistenceError):
    """A live session's seed is not the log stored for its id; nothing was written.

    ``seq`` is the first seq at which they differ: an event that differs, or one that only
    the stored log or only the seed has.
    """

    def __init__(self, message: str, seq: int) -> None:
        super().__init__(message)
        self.seq = seq


class SessionLockedError(PersistenceError):
    """Another writer (usually another process) holds the session's log."""


class LeaseLostError(PersistenceError):
    """The writer's lease on a session expired or was taken over; nothing was written."""


class LiveSessionError(PersistenceError):
    """The session is live here with an open turn; it cannot be loaded until the turn ends."""


class RollbackError(PersistenceError):
    """A failed append could not be rolled back; the log file needs recovery before use."""

    def __init__(self, path: Path, error: BaseException, rollback_error: BaseException) -> None:
        super().__init__(
            f"failed to roll back a failed append to {path}: {rollback_error} "
            f"(the append failed with: {error})"
        )
        self.path = path
        self.error = error
        self.rollback_error = rollback_error
