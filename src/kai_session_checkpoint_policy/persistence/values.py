"""The values persistence hands out: a stored log, its header, statistics, listings.

They belong to no backend: a log read from a file and one read from a database are the same
:class:`StoredLog`, and both backends list sessions as a :class:`SessionListing`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, final

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from ..events import SessionEvent
    from ..meta import SessionMeta
    from .errors import PersistenceError

__all__ = [
    "FORMAT_VERSION",
    "PersistenceStatistics",
    "RawArtifact",
    "SessionHeader",
    "SessionListing",
    "SessionLocation",
    "SessionProblem",
    "SessionSnapshot",
    "StoredLog",
    "StoredSuffix",
]

FORMAT_VERSION: Final = 0
"""The format version a session header names (the original harness's)."""


@final
@dataclass(frozen=True, slots=True)
class SessionHeader:
    """The first record of a session log.

    ``cwd`` is the session's working directory (it chooses the project directory of the
    layout); ``parent_session``, ``seed_length``, ``origin`` and ``agent_preset`` are kept as a
    log of the original harness has them. ``earlier_format`` tells a log in this project's
    earlier format (``version`` 1).
    """

    id: str
    created_at: int
    version: int = FORMAT_VERSION
    cwd: str | None = None
    delegation_depth: int = 0
    parent_session: str | None = None
    seed_length: int | None = None
    origin: str | None = None
    agent_preset: str | None = None
    earlier_format: bool = False

    @classmethod
    def of(cls, session_id: str, meta: SessionMeta, created_at: int) -> SessionHeader:
        """The header of a new session *session_id* created with *meta*; *created_at* is the
        creation time when *meta* names none."""
        return cls(
            session_id,
            created_at if meta.created_at is None else meta.created_at,
            cwd=meta.cwd,
            delegation_depth=meta.delegation_depth,
            parent_session=meta.parent_session,
            seed_length=meta.seed_length,
            origin=meta.origin,
            agent_preset=meta.agent_preset,
        )

    def fields(self) -> dict[str, str | int]:
        """The metadata fields beyond id, version and creation time, named and ordered as the
        original harness's header names them (``delegationDepth`` always, the others when
        set)."""
        fields: dict[str, str | int] = {}
        for key, value in (
            ("cwd", self.cwd),
            ("parentSession", self.parent_session),
            ("seedLength", self.seed_length),
            ("origin", self.origin),
        ):
            if value is not None:
                fields[key] = value
        fields["delegationDepth"] = self.delegation_depth
        if self.agent_preset is not None:
            fields["agentPreset"] = self.agent_preset
        return fields


@final
@dataclass(frozen=True, slots=True)
class StoredLog:
    """A session log as stored, and the repair that closes its open turn.

    From ``inspect``, ``events`` are the stored events and ``repair`` the closers recovery
    *would* append. From ``load``, ``events`` already end with ``repair``, which that call
    appended. ``location`` names where the log is: a file, or a database and session.
    """

    header: SessionHeader
    events: Sequence[SessionEvent]
    repair: tuple[SessionEvent, ...]
    torn_bytes: int
    location: str

    def __repr__(self) -> str:
        # Not every event: a long log would take longer to show than to load.
        return (
            f"StoredLog(header={self.header!r}, events=<{len(self.events)} events>, "
            f"repair=<{len(self.repair)} events>, torn_bytes={self.torn_bytes}, "
            f"location={self.location!r})"
        )


@dataclass(frozen=True, slots=True)
class PersistenceStatistics:
    """Counters of one backend since it was created (a backend's own add to them)."""

    sessions: int
    """Sessions the backend holds a writer for: those live on its host, and those detached
    whose last events are still being written."""
    pending_events: int
    """Events admitted and not yet durable."""
    batches: int
    """Batches made durable."""


@final
@dataclass(frozen=True, slots=True)
class SessionProblem:
    """A session under a root that cannot be listed: its directory, and why."""

    directory: Path
    error: PersistenceError | OSError


@final
@dataclass(frozen=True, slots=True)
class SessionListing:
    """What a backend's ``scan_sessions`` found.

    ``headers`` are those of the intact sessions, oldest first; ``problems`` the sessions whose
    log cannot be read (corrupt, unsupported, not a regular file, unreadable), by directory.
    """

    headers: tuple[SessionHeader, ...]
    problems: tuple[SessionProblem, ...]
    logs: tuple[Path, ...] = ()
    """The log file of each of ``headers``, in the same order (a directory's sessions only)."""


@final
@dataclass(frozen=True, slots=True)
class SessionLocation:
    """Where a backend stores a session: its kind (``"jsonl"``, ``"postgres"``) and a path (an
    absolute file path, or the database and session)."""

    kind: str
    path: str


@final
@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    """A stored session's header and its revision: an opaque token, the same while the stored
    log is unchanged, another once an append or a repair changed it."""

    header: SessionHeader
    revision: str


@final
@dataclass(frozen=True, slots=True)
class StoredSuffix:
    """The stored events of a session from seq ``from_seq`` on, exactly as stored (no repair,
    nothing cut), and the revision they were read at."""

    header: SessionHeader
    from_seq: int
    events: tuple[SessionEvent, ...]
    revision: str

    def __repr__(self) -> str:
        return (
            f"StoredSuffix(header={self.header!r}, from_seq={self.from_seq}, "
            f"events=<{len(self.events)} events>, revision={self.revision!r})"
        )


@final
@dataclass(frozen=True, slots=True)
class RawArtifact:
    """A session's artifact as the backend stored it, decoded from its encoding but otherwise
    verbatim (key order, packed rows and line breaks as written): ``content`` is the text of
    ``filename`` (``session.jsonl`` for a JSONL log, compressed or not)."""

    header: SessionHeader
    filename: str
    content: bytes

    def __repr__(self) -> str:
        return (
            f"RawArtifact(header={self.header!r}, filename={self.filename!r}, "
            f"content=<{len(self.content)} bytes>)"
        )


def check_from_seq(from_seq: object) -> int:
    """*from_seq*, if it is a seq a suffix can start at: a non-negative integer.

    :raises ValueError: naming what it is otherwise.
    """
    if type(from_seq) is not int or from_seq < 0:
        raise ValueError(f"from_seq must be a non-negative integer, not {from_seq!r}")
    return from_seq
