"""Store URLs: a directory for the JSONL backend, or a ``postgresql://`` URI for PostgreSQL.

:func:`open_store` is the one place that chooses a backend from a URL; the command line and
the demo open every store through it. :func:`copy_session` moves a session from one store to
another, whichever their backends. The PostgreSQL backend (and its driver) is imported only
for a PostgreSQL URL.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, TypeAlias
from urllib.parse import parse_qsl, urlencode, urlsplit

from ..contract import SessionExistsError
from .core import DEFAULT_BATCH_WINDOW
from .jsonl.backend import JsonlSessionPersistence
from .values import FORMAT_VERSION

if TYPE_CHECKING:
    from .postgres.backend import PostgresSessionPersistence
    from .values import StoredLog

__all__ = [
    "POSTGRES_SCHEMES",
    "Store",
    "copy_session",
    "display_url",
    "is_postgres_url",
    "open_store",
]

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
"""How a PostgreSQL URI begins (libpq accepts both)."""

Store: TypeAlias = "JsonlSessionPersistence | PostgresSessionPersistence"


def is_postgres_url(url: str | os.PathLike[str]) -> bool:
    """Whether *url* names a PostgreSQL database rather than a directory."""
    return isinstance(url, str) and url.startswith(POSTGRES_SCHEMES)


def open_store(
    url: str | os.PathLike[str],
    *,
    batch_window: float = DEFAULT_BATCH_WINDOW,
    lease_ttl: float | None = None,
) -> Store:
    """The backend for the store *url*: PostgreSQL for a ``postgresql://`` URI, else JSONL.

    Nothing is opened or created yet. *lease_ttl* (seconds) is the PostgreSQL lease's; the
    backend's default when ``None``.

    :raises ValueError: if *lease_ttl* is given for a directory, which has no leases.
    """
    if is_postgres_url(url):
        from .postgres.backend import DEFAULT_LEASE_TTL, PostgresSessionPersistence

        assert isinstance(url, str)
        ttl = DEFAULT_LEASE_TTL if lease_ttl is None else lease_ttl
        return PostgresSessionPersistence(url, lease_ttl=ttl, batch_window=batch_window)
    if lease_ttl is not None:
        raise ValueError(
            f"a lease ttl applies to a PostgreSQL store only, not to the directory {url}"
        )
    return JsonlSessionPersistence(url, batch_window=batch_window)


def display_url(url: str | os.PathLike[str]) -> str:
    """*url* as it can be shown: a PostgreSQL URI with its password masked, a path as it is."""
    if not is_postgres_url(url):
        return os.fspath(url)
    assert isinstance(url, str)
    parts = urlsplit(url)
    netloc, query = parts.netloc, parse_qsl(parts.query, keep_blank_values=True)
    user, at, host = netloc.rpartition("@")
    if ":" in user:
        netloc = f"{user.partition(':')[0]}:***{at}{host}"
    if any(key == "password" for key, _ in query):
        masked = [(key, "***" if key == "password" else value) for key, value in query]
        parts = parts._replace(query=urlencode(masked, safe="/*"))
    # Rebuilt by hand: urlunsplit drops the "//" of an empty host (postgresql:///db).
    shown = f"{parts.scheme}://{netloc}{parts.path}"
    return (
        shown
        + (f"?{parts.query}" if parts.query else "")
        + (f"#{parts.fragment}" if parts.fragment else "")
    )


async def copy_session(source: Store, target: Store, session_id: str) -> StoredLog:
    """Recover *session_id* in *source*, then write its whole log to *target* as a new session.

    The recovery is the source's ``load`` (a session another host or process writes is
    refused as locked, and an interrupted turn is closed there first), so both stores then
    hold the same events, and the same header metadata (working directory, parent, delegation
    depth, seed length, creation time). The log is written as one batch: all of it, or nothing.

    :raises SessionExistsError: if *target* holds the session already; nothing is written.
    """
    if target.session_exists(session_id):
        raise SessionExistsError(f"session {session_id!r} already exists in the target store")
    log = await source.load(session_id)
    header = replace(log.header, version=FORMAT_VERSION, earlier_format=False)
    await target.write_log(session_id, log.events, header)
    return log
