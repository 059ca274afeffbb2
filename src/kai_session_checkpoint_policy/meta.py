"""What a session is created with besides its events: the metadata its log's header keeps.

A host gives it when it creates a session (``host.sessions.create(..., meta=SessionMeta(...))``);
a persistence backend writes it into the header of the session's log, and hands it back on
load, listing and inspection. It is the original harness's creation metadata: the session's
working directory (which chooses the project directory a JSONL log lives in), the session it
was forked or delegated from, how many events it was seeded with, how deep in a delegation it
runs, and when it was created.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, final

from .events import MAX_TIME

__all__ = ["ORIGINS", "SessionMeta", "SessionMetaError"]

ORIGINS: Final = ("subagent",)
"""The values ``origin`` may have (besides ``None``)."""


class SessionMetaError(ValueError):
    """Session metadata with a field no session log can hold; the message names it."""


def _count(name: str, value: object) -> None:
    if type(value) is not int or value < 0:
        raise SessionMetaError(
            f"session metadata {name} must be a non-negative integer, not {value!r}"
        )


@final
@dataclass(frozen=True, slots=True)
class SessionMeta:
    """The creation metadata of a session, checked when it is made.

    ``created_at``
        Unix epoch milliseconds; ``None`` lets the host take its clock's time at creation.
    ``cwd``
        The session's working directory, an absolute path, or ``None``.
    ``parent_session``
        The id of the session this one was forked or delegated from.
    ``seed_length``
        How many events of another session this one was created with (a fork's seed).
    ``delegation_depth``
        How many delegations deep the session runs (0 for a top-level session).
    ``origin``
        ``"subagent"`` for a session a delegation created, else ``None``.
    ``agent_preset``
        The name of the agent preset the session runs with, if any.

    :raises SessionMetaError: naming the first field that is not as described.
    """

    created_at: int | None = None
    cwd: str | None = None
    parent_session: str | None = None
    seed_length: int | None = None
    delegation_depth: int = 0
    origin: Literal["subagent"] | None = None
    agent_preset: str | None = None

    def __post_init__(self) -> None:
        created_at: object = self.created_at
        if created_at is not None and (
            type(created_at) is not int or not 0 <= created_at <= MAX_TIME
        ):
            raise SessionMetaError(
                "session metadata created_at must be an integer of Unix epoch milliseconds "
                f"from 0 to {MAX_TIME}, not {created_at!r}"
            )
        cwd: object = self.cwd
        if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
            raise SessionMetaError(f"session metadata cwd must be an absolute path, not {cwd!r}")
        parent: object = self.parent_session
        if parent is not None and (not isinstance(parent, str) or not parent):
            raise SessionMetaError(
                f"session metadata parent_session must be a non-empty string, not {parent!r}"
            )
        if self.seed_length is not None:
            _count("seed_length", self.seed_length)
        _count("delegation_depth", self.delegation_depth)
        origin: object = self.origin
        if origin is not None and origin not in ORIGINS:
            raise SessionMetaError(
                f"session metadata origin must be 'subagent' or None, not {origin!r}"
            )
        preset: object = self.agent_preset
        if preset is not None and not isinstance(preset, str):
            raise SessionMetaError(
                f"session metadata agent_preset must be a string, not {preset!r}"
            )
