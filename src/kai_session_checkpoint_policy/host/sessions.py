"""Sessions: append-only event logs, and the store that knows which of them are live."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from itertools import chain, groupby, islice
from typing import TYPE_CHECKING, Final, Protocol, overload

import anyio

from ..cancellation import checkpoint_if_cancelled
from ..contract import SessionExistsError
from ..events import (
    KNOWN_EVENT_TYPES,
    MAX_TIME,
    SURFACE_EVENT_TYPES,
    EventSequence,
    SessionEvent,
    StoredEvents,
    encode_data,
    envelope_problem,
    time_problem,
)
from ..meta import SessionMeta

if TYPE_CHECKING:
    from collections.abc import Callable, Container, Iterable, Iterator, Sequence

    from ..contract import SessionPersistenceLike
    from ..events import SurfaceOp
    from ..hookspecs import FlushThunk
    from ._hooks import HostHooks

__all__ = [
    "HostStateError",
    "Session",
    "SessionError",
    "SessionEvents",
    "SessionNotLiveError",
    "SessionStore",
    "epoch_ms",
]


SEED_END: Final = "session/end-seed"
"""The event that marks the end of a fork's seed."""

_KEPT_MADE: Final = 256
"""How many of the latest events appended live a session keeps as they were made (the ones
read most: the turn under way)."""
_SETTLED_AT_ONCE: Final = 512
"""How many of the older events appended live are settled into one block at a time, kept as
a loaded log keeps its events (:meth:`StoredEvents.extend_settled`)."""


def epoch_ms() -> int:
    """The current time in Unix epoch milliseconds, the unit of ``SessionEvent.time``."""
    return time.time_ns() // 1_000_000


def _require_name(what: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise SessionError(f"{what} must be a non-empty string, not {value!r}")


class SessionError(ValueError):
    """A session was created or seeded with something it cannot hold."""


class SessionNotLiveError(SessionError):
    """The session is not (or no longer) live in this store."""


class HostStateError(RuntimeError):
    """The host was used in a state that does not allow it (not open, or already closed)."""


class _StoreHost(Protocol):
    """What the store needs of its host."""

    @property
    def is_open(self) -> bool: ...
    @property
    def session_persistence(self) -> SessionPersistenceLike | None: ...


class SessionEvents(EventSequence):
    """A snapshot of a session's log: it does not change as the session goes on.

    It holds the events the session started with (a loaded log's, made into objects only as
    they are read: see :class:`~kai_session_checkpoint_policy.events.StoredEvents`), the older
    events appended since (kept the same way, in blocks), and the latest ones, up to when it
    was taken; taking one copies nothing.
    """

    __slots__ = ("_appended", "_count", "_stored", "_stored_count")

    def __init__(
        self,
        stored: Sequence[SessionEvent],
        appended: list[SessionEvent],
        count: int,
        stored_count: int | None = None,
    ) -> None:
        self._stored, self._appended, self._count = stored, appended, count
        # The events of *stored* that are the snapshot's (a session's stored events grow as
        # its older appended events are settled: a snapshot keeps the list it was taken with).
        self._stored_count = len(stored) if stored_count is None else stored_count

    def __len__(self) -> int:
        return self._stored_count + self._count

    @overload
    def __getitem__(self, index: int) -> SessionEvent: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[SessionEvent, ...]: ...
    def __getitem__(self, index: int | slice) -> SessionEvent | tuple[SessionEvent, ...]:
        stored = self._stored_count
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return tuple(self[i] for i in range(start, stop, step))
            head = tuple(self._stored[start : min(stop, stored)]) if start < stored else ()
            tail = self._appended[max(start - stored, 0) : max(stop - stored, 0)]
            return (*head, *tail)
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError("session event index out of range")
        if position < stored:
            return self._stored[position]
        return self._appended[position - stored]

    def __iter__(self) -> Iterator[SessionEvent]:
        stored = self._stored
        head = stored if len(stored) == self._stored_count else islice(stored, self._stored_count)
        return chain(head, islice(self._appended, self._count))

    def fresh(self, seqs: Iterable[int]) -> Iterator[SessionEvent]:
        """The events at *seqs*, in that order, made for the caller and not kept: of the
        stored events not made yet, each is made anew (see :meth:`StoredEvents.fresh`).

        :raises IndexError: for a seq the snapshot does not hold.
        """
        stored, count = self._stored, self._stored_count
        checked = map(self._checked, seqs)
        if not isinstance(stored, StoredEvents):
            return map(self.__getitem__, checked)
        return self._fresh(stored, count, checked)

    def _fresh(
        self, stored: StoredEvents, count: int, seqs: Iterator[int]
    ) -> Iterator[SessionEvent]:
        # Each run of stored seqs goes to the stored events at once, so that a block is made
        # once for a run through it, not once for each of its events.
        for in_stored, run in groupby(seqs, count.__gt__):
            made = stored.fresh(run) if in_stored else map(self.__getitem__, run)  # noqa: B031
            yield from made

    def _checked(self, seq: int) -> int:
        if type(seq) is not int or not 0 <= seq < len(self):
            raise IndexError("session event index out of range")
        return seq

    def select(self, types: Container[str], start: int = 0) -> list[SessionEvent]:
        """The events from seq *start* on whose type is in *types*.

        Of the stored events, only those selected are made into objects.
        """
        stored, count = self._stored, self._stored_count
        start = max(start, 0)
        if isinstance(stored, StoredEvents):
            found = stored.select(types, start, count) if start < count else []
        else:
            found = [event for event in stored[start:count] if event.type in types]
        appended = self._appended[max(start - count, 0) : self._count]
        return found + [event for event in appended if event.type in types]


class Session:
    """An append-only event log whose ``seq`` always equals its length.

    A session created by a :class:`SessionStore` is *live*: each append is announced to the
    host's plugins through the ``session_event`` hook. A session built directly is detached.
    """

    __slots__ = (
        "__weakref__",
        "_appended",
        "_clock",
        "_on_append",
        "_shared",
        "_stored",
        "first_live_seq",
        "id",
        "meta",
        "seed_stored",
    )

    def __init__(
        self,
        session_id: str,
        events: Iterable[SessionEvent] = (),
        *,
        clock: Callable[[], int] = epoch_ms,
        on_append: Callable[[Session, SessionEvent], None] | None = None,
        meta: SessionMeta | None = None,
        mark_seed: bool = False,
    ) -> None:
        """
        :param events: The events the session starts with: a stored log it continues, or the
            seed of a fork.
        :param meta: The creation metadata; its ``created_at`` is the clock's time now unless
            given.
        :param mark_seed: Whether *events* are a seed taken from another session: then a
            ``session/end-seed`` event marks where the session's own events begin (unless the
            seed ends with one already). It is part of the seed, and is not announced.
        """
        _require_name("a session id", session_id)
        if meta is not None and not isinstance(meta, SessionMeta):
            raise SessionError(f"meta must be a SessionMeta, not {meta!r}")
        self.id = session_id
        # A loaded log's events are kept as they are (they are contiguous from seq 0).
        self._stored: Sequence[SessionEvent]
        if isinstance(events, StoredEvents):
            self._stored = events
        else:
            self._stored = tuple(events)
            for index, event in enumerate(self._stored):
                if event.seq != index:
                    raise SessionError(
                        f"session {session_id!r}: events must be contiguous from seq 0, "
                        f"but event {index} has seq {event.seq}"
                    )
        # Whether _stored is the caller's own StoredEvents: copied before it is extended.
        self._shared = isinstance(self._stored, StoredEvents)
        self._appended: list[SessionEvent] = []
        self._clock = clock
        self._on_append = None
        meta = SessionMeta() if meta is None else meta
        if meta.created_at is None:
            now = clock()
            if type(now) is int and 0 <= now <= MAX_TIME:  # else no event can be appended
                meta = replace(meta, created_at=now)
        self.meta: SessionMeta = meta
        """The creation metadata; a persistence backend writes it into the log's header."""
        if mark_seed and not (self._stored and self._stored[-1].type == SEED_END):
            self.append(SEED_END, {})
        self.seed_stored = False
        """Whether the events the session started with are its log just loaded from the
        persistence backend (a resumed session): the backend need not check them."""
        self.first_live_seq: int = self.seq
        """The seq of the first event appended live: the events before it (a stored log, or a
        seed and its marker) were there when the session was made, and were not announced."""
        self._on_append = on_append

    def __repr__(self) -> str:
        return f"<Session {self.id!r} seq={self.seq}>"

    @property
    def seq(self) -> int:
        """The seq the next event will get: the number of events in the log."""
        return len(self._stored) + len(self._appended)

    @property
    def events(self) -> SessionEvents:
        """A snapshot of the log."""
        stored = self._stored
        return SessionEvents(stored, self._appended, len(self._appended), len(stored))

    def append(
        self,
        event_type: str,
        data: object,
        *,
        surface_op: SurfaceOp | None = None,
        source_event_seqs: Sequence[int] | None = None,
        ignorable: bool = False,
    ) -> SessionEvent:
        """Append an event and announce it; return the committed event.

        :param surface_op: How a surface event (``user/message``, ``assistant/message``,
            ``tool/result``) changes the transcript; ``"append"`` unless given. Other types
            have none.
        :param source_event_seqs: The seqs of the earlier events a surface event was made
            from (the chunks of a response, the ``tool/call`` a result answers).
        :param ignorable: Whether a reader that does not know *event_type* may skip the
            event. An event of a type that is not one of
            :data:`~kai_session_checkpoint_policy.events.KNOWN_EVENT_TYPES` must be, or no
            reader could read the log.
        :raises EventDataError: if *data* is not a lossless JSON object; nothing is appended.
        :raises SessionError: if the type is unknown and the event not ignorable, or the
            surface fields do not fit the event; nothing is appended.
        """
        appended = self._appended
        seq = len(self._stored) + len(appended)
        if (
            surface_op is None
            and source_event_seqs is None
            and ignorable is False
            and type(event_type) is str
            and event_type in KNOWN_EVENT_TYPES
        ):  # the fast path: a known type, no envelope field to check
            copy, encoded = encode_data(event_type, data)
            surface: SurfaceOp | None = "append" if event_type in SURFACE_EVENT_TYPES else None
            event = SessionEvent(event_type, seq, self._time(seq), copy, encoded, surface)
        else:
            _require_name("an event type", event_type)
            sources = None if source_event_seqs is None else tuple(source_event_seqs)
            if event_type in SURFACE_EVENT_TYPES and surface_op is None:
                surface_op = "append"
            if type(ignorable) is not bool:
                raise SessionError(f"ignorable must be True or False, not {ignorable!r}")
            if not ignorable and event_type not in KNOWN_EVENT_TYPES:
                raise SessionError(
                    f"{event_type!r} is not an event type of the session format: append it "
                    "with ignorable=True, so that readers that do not know it can skip it"
                )
            problem = envelope_problem(event_type, seq, surface_op, sources)
            if problem is not None:
                raise SessionError(f"session {self.id!r}, seq {seq}: {problem}")
            copy, encoded = encode_data(event_type, data)
            event = SessionEvent(
                event_type, seq, self._time(seq), copy, encoded, surface_op, sources, ignorable
            )
        appended.append(event)
        if len(appended) >= _KEPT_MADE + _SETTLED_AT_ONCE:
            self._settle()
        if self._on_append is not None:
            self._on_append(self, event)
        return event

    def _settle(self) -> None:
        """Move the oldest of the events appended here to the stored events, as one block
        (:meth:`StoredEvents.extend_settled`): a long live log then holds about what the
        same log loaded from storage does, rather than an object, a copy of its data and its
        text per event. Any of them read again is made again, equal.

        The latest events go on in a new list: a snapshot taken before keeps the old one.
        """
        stored = self._stored
        if not isinstance(stored, StoredEvents):
            stored = StoredEvents(stored)
        elif self._shared:
            stored = stored.copy()
        self._stored, self._shared = stored, False
        appended = self._appended
        stored.extend_settled(appended[:_SETTLED_AT_ONCE])
        self._appended = appended[_SETTLED_AT_ONCE:]

    def _time(self, seq: int) -> int:
        """The clock's time for the event *seq*, if a log can hold it; else nothing is appended.

        A log refuses to be read with an event at a time it cannot hold, so such an event is
        refused here, before anything (a checkpoint, a tool body) takes it as recorded.

        :raises SessionError: naming the time and what is wrong with it.
        """
        time = self._clock()
        if type(time) is not int or not 0 <= time <= MAX_TIME:
            raise SessionError(f"session {self.id!r}, seq {seq}: {time_problem(time)}")
        return time


class SessionStore:
    """The live sessions of one host, and the single entry point for flushing them.

    Sessions are used while the host is open: creating, resuming or flushing one before (or
    after) is a :class:`HostStateError`.
    """

    def __init__(
        self, hooks: HostHooks, *, clock: Callable[[], int] = epoch_ms, host: _StoreHost
    ) -> None:
        self._hooks = hooks
        self._clock = clock
        self._host = host
        self._live: dict[str, Session] = {}

    def _require_open(self) -> None:
        if not self._host.is_open:
            raise HostStateError("the host is not open: use its sessions inside 'async with host:'")

    def create(
        self,
        session_id: str | None = None,
        *,
        seed: Iterable[SessionEvent] | None = None,
        meta: SessionMeta | None = None,
    ) -> Session:
        """Create a live session, optionally with a *seed* of events, and its metadata.

        A *seed* for an id the persistence backend has a log of continues that log: the
        backend checks that the seed is what it stores, and writes only what follows. Any
        other seed is a fork: the session starts with it and a ``session/end-seed`` event,
        and the backend writes them once, before the session's own events.

        :param meta: The creation metadata (working directory, parent session, delegation
            depth, seed length, creation time), written in the log's header.
        :raises SessionExistsError: if, without a *seed*, the persistence backend already has
            a log for this id (:meth:`resume` continues it).
        :raises SessionError: if a live session already has this id.
        """
        return self._create(session_id, seed, meta, seed_stored=False)

    def _create(
        self,
        session_id: str | None,
        seed: Iterable[SessionEvent] | None,
        meta: SessionMeta | None,
        *,
        seed_stored: bool,
    ) -> Session:
        self._require_open()
        session_id = uuid.uuid4().hex if session_id is None else session_id
        if session_id in self._live:
            raise SessionError(f"a live session {session_id!r} already exists")
        persistence = self._host.session_persistence
        events = seed if isinstance(seed, StoredEvents) else tuple(seed or ())
        try:
            stored = persistence is not None and persistence.session_exists(session_id)
        except Exception:
            if seed is None:
                raise
            stored = True  # not a fork; the backend refuses the id again, naming why
        if seed is None and stored:
            assert persistence is not None
            raise SessionExistsError(
                f"session {session_id!r} already has a log in {persistence.name}: continue it "
                f"with 'await host.sessions.resume({session_id!r})', which recovers it first"
            )
        session = Session(
            session_id,
            events,
            clock=self._clock,
            on_append=self._hooks.session_event,
            meta=meta,
            mark_seed=seed is not None and not stored,
        )
        session.seed_stored = seed_stored
        self._live[session_id] = session
        self._hooks.session_attach(session)
        return session

    async def resume(self, session_id: str) -> Session:
        """Load a stored session with recovery, and return it live: its turns go on.

        The repair recovery adds (closing a turn a crash left open) is durable before this
        returns.

        :raises HostStateError: if the host has no persistence backend.
        :raises SessionError: if a live session already has this id.
        :raises Exception: what the backend's ``load`` raises (an unknown session, a log that
            is corrupt or locked by another process).
        """
        self._require_open()
        persistence = self._host.session_persistence
        if persistence is None:
            raise HostStateError(
                f"cannot resume session {session_id!r}: the host has no persistence backend"
            )
        if session_id in self._live:
            raise SessionError(f"a live session {session_id!r} already exists")
        stored = await persistence.load(session_id)
        return self._create(session_id, stored.events, _meta_of(stored), seed_stored=True)

    def fork(
        self, source: Session, through: int | None = None, session_id: str | None = None
    ) -> Session:
        """Create a live session seeded with *source*'s events up to seq *through* (all of
        them by default): a branch, a retry from a point, a subagent's start.

        The new session keeps *source*'s working directory, names *source* as its parent,
        and records the seed's length; its log holds the seed once, then a
        ``session/end-seed`` event, then its own events.

        :raises SessionError: if *through* is not the seq of one of *source*'s events.
        """
        events = source.events
        if through is not None and (type(through) is not int or not 0 <= through < len(events)):
            raise SessionError(
                f"cannot fork session {source.id!r} through seq {through!r}: it holds "
                f"seqs 0 to {len(events) - 1}"
            )
        seed = events[: len(events) if through is None else through + 1]
        meta = SessionMeta(cwd=source.meta.cwd, parent_session=source.id, seed_length=len(seed))
        return self.create(session_id, seed=seed, meta=meta)

    async def open(self, session_id: str) -> Session:
        """:meth:`resume` the session if the persistence backend has it, else :meth:`create` it."""
        self._require_open()
        persistence = self._host.session_persistence
        if persistence is not None and persistence.session_exists(session_id):
            return await self.resume(session_id)
        return self.create(session_id)

    def get(self, session_id: str) -> Session | None:
        """Return the live session with this id, or ``None``."""
        return self._live.get(session_id)

    def is_live(self, session: Session) -> bool:
        return self._live.get(session.id) is session

    def live(self) -> tuple[Session, ...]:
        return tuple(self._live.values())

    def detach(self, session: Session) -> None:
        """Stop treating *session* as live; its later appends are no longer announced.

        The plugins hear of it (``session_detach``): a persistence backend writes what the
        session admitted, in the background, and then releases what it held for it.
        """
        if self.is_live(session):
            del self._live[session.id]
            session._on_append = None
            self._hooks.session_detach(session)

    async def close(self, session: Session) -> None:
        """Flush *session*, then detach it: its events are durable and its resources released.

        :raises SessionNotLiveError: if *session* is not live here.
        :raises Exception: what the flush raised; the session then stays live.
        """
        await self.flush(session)
        self.detach(session)

    async def flush(self, session: Session) -> bool:
        """Make every event admitted for *session* durable.

        Every ``session_flush`` thunk is started concurrently; all of them settle before this
        returns, and the first failure in registration order is raised.

        :return: whether any plugin took part.
        :raises SessionNotLiveError: if *session* is not live here; no plugin is called.
        """
        self._require_open()
        if not self.is_live(session):
            raise SessionNotLiveError(f"session {session.id!r} is not live in this store")
        thunks = self._hooks.session_flush(session)
        if len(thunks) == 1:
            await thunks[0]()
        elif thunks:
            await _settle_all(thunks)
        await checkpoint_if_cancelled()  # even a flush with nothing to do is a cancel point
        return bool(thunks)


def _meta_of(stored: object) -> SessionMeta | None:
    """The creation metadata of a stored log, if its header tells it."""
    header = getattr(stored, "header", None)
    if header is None:
        return None
    origin = getattr(header, "origin", None)
    return SessionMeta(
        created_at=getattr(header, "created_at", None),
        cwd=getattr(header, "cwd", None),
        parent_session=getattr(header, "parent_session", None),
        seed_length=getattr(header, "seed_length", None),
        delegation_depth=getattr(header, "delegation_depth", 0),
        origin="subagent" if origin == "subagent" else None,
        agent_preset=getattr(header, "agent_preset", None),
    )


async def _settle_all(thunks: Sequence[FlushThunk]) -> None:
    """Run every thunk concurrently until all settle; raise the first failure in their order."""
    failures: list[Exception | None] = [None] * len(thunks)

    async def settle(index: int) -> None:
        try:
            await thunks[index]()
        except Exception as exc:
            failures[index] = exc

    async with anyio.create_task_group() as group:
        for index in range(len(thunks)):
            group.start_soon(settle, index)
    for failure in failures:
        if failure is not None:
            raise failure
