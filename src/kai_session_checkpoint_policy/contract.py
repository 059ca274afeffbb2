"""The host contract's types: what the plugins of this package rely on a host to offer.

A host is anything that calls the hooks of :mod:`~kai_session_checkpoint_policy.hookspecs` and
passes itself as their ``host`` argument. It need not use this package's reference host, nor
inherit from anything here: the classes below are :class:`~typing.Protocol` s, and a host's own
classes satisfy them by having the members they name. They are generic in the host's session
type ``S``, so that a host's own session objects flow through ``host.sessions.get`` and
``host.sessions.flush`` with their own type.

Three kinds of things are declared:

* what plugins read from the objects a host passes to the boundary hooks
  (:class:`ModelRequestLike`, :class:`ToolCallLike`, :class:`PreStepLike`, :class:`AgentLike`,
  :class:`AbortSignalLike`) and from the host itself (:class:`HostServices`);
* what a plugin that holds resources, such as a persistence backend, needs besides
  (:class:`PluginHost`);
* the values that cross the boundaries (a model request, the chunks of a response stream, the
  decision before a step), as plain frozen dataclasses any host may use.

This module imports nothing from the rest of the package but the event types, so any host can
use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence

    from anyio.abc import TaskGroup

    from .effects import EffectClass
    from .events import JSONObject, SessionEvent

__all__ = [
    "AbortSignalLike",
    "AgentLike",
    "BlockEnd",
    "BlockStart",
    "Finish",
    "HostServices",
    "InvariantsLike",
    "LlmRequest",
    "ModelRequestLike",
    "PersistenceLike",
    "PluginHost",
    "PreStepDecision",
    "PreStepLike",
    "ReasoningDelta",
    "SessionExistsError",
    "SessionLike",
    "SessionLogLike",
    "SessionPersistenceLike",
    "SessionStoreLike",
    "StoredSessionLike",
    "StreamChunk",
    "TextDelta",
    "ToolCallDelta",
    "ToolCallLike",
    "ToolSpec",
    "Usage",
    "text_block",
    "tool_call_block",
]

S = TypeVar("S", bound="SessionLike")
S_co = TypeVar("S_co", bound="SessionLike", covariant=True)


class SessionExistsError(ValueError):
    """A new session was asked for with the id of a session that has a stored log.

    Raised by a host's ``sessions.create`` and, should two processes race, by a persistence
    backend's first write; the message names the way to continue the stored session.
    """


# -------------------------------------------------------------------------------------------
# What plugins read
# -------------------------------------------------------------------------------------------


class SessionLike(Protocol):
    """A session of the host: plugins only need its id."""

    @property
    def id(self) -> str: ...


class SessionLogLike(SessionLike, Protocol):
    """A session as a persistence backend reads it: its id, and its events so far."""

    @property
    def events(self) -> Sequence[SessionEvent]: ...


class SessionStoreLike(Protocol[S]):
    """The host's live sessions, and the one way to flush one (``host.sessions``).

    ``flush`` runs every ``session_flush`` implementation for *session* and returns once all of
    them have settled; it raises the first failure in registration order, refuses a session
    that is not live, returns whether any plugin took part, and is a cancel point on every
    path (see :func:`~kai_session_checkpoint_policy.cancellation.checkpoint_if_cancelled`).
    """

    def get(self, session_id: str) -> S | None:
        """The live session with this id, or ``None``."""
        ...

    async def flush(self, session: S) -> bool: ...


class AgentLike(Protocol[S_co]):
    """The agent a tool call or a step runs for: plugins read its session."""

    @property
    def session(self) -> S_co: ...


class AbortSignalLike(Protocol):
    """A cooperative cancellation signal, as ``AbortSignal`` in the web platform."""

    @property
    def aborted(self) -> bool: ...


class ModelRequestLike(Protocol):
    """A model request as the ``llm_stream`` hook receives it."""

    @property
    def session_id(self) -> str | None:
        """The session the request belongs to, if any."""
        ...


class ToolCallLike(Protocol[S_co]):
    """One tool call as the ``tools_execute`` hook receives it.

    ``agent`` is the agent the call runs for (``None`` for a direct call), ``parent`` the
    enclosing call of a nested dispatch (``None`` for a call the model made), and ``signal``
    tells whether the call was aborted.
    """

    @property
    def agent(self) -> AgentLike[S_co] | None: ...
    @property
    def parent(self) -> object | None: ...
    @property
    def signal(self) -> AbortSignalLike: ...


class PreStepLike(Protocol[S_co]):
    """The step an agent is about to enter, as the ``agent_pre_step`` hook receives it."""

    @property
    def agent(self) -> AgentLike[S_co]: ...


class InvariantsLike(Protocol):
    """The host's registry of package-owned invariants (``host.invariants``).

    One active registration per package name: ``register`` claims *package* for *owner* and
    raises an error if another owner holds it; ``release`` gives it back if *owner* holds it,
    and returns whether it did.
    """

    def register(self, package: str, *, owner: object) -> object: ...
    def release(self, package: str, *, owner: object) -> bool: ...


class StoredSessionLike(Protocol):
    """A session log as a persistence backend returns it: its events, the repair included."""

    @property
    def events(self) -> Sequence[SessionEvent]: ...


class PersistenceLike(Protocol):
    """A persistence backend, as plugins see it (``host.session_persistence``).

    It declares no member: the plugins of this package only check that a backend is there (the
    policy does nothing without one), and reach it through the ``session_flush`` and
    ``session_event`` hooks, never through this object. A host's own persistence layer fits as
    it is.
    """


@runtime_checkable
class SessionPersistenceLike(PersistenceLike, Protocol):
    """A persistence backend, as a host that resumes sessions sees it.

    No plugin reads these members; the backends of this package offer them, and a host such as
    the reference one uses them to tell a new session from a stored one (``session_exists``,
    which answers at once) and to resume a stored one (``load``, with recovery: the repair is
    durable before it returns). ``isinstance(host.session_persistence, SessionPersistenceLike)``
    tells whether the backend a plugin provided offers them.
    """

    @property
    def name(self) -> str: ...
    def session_exists(self, session_id: str) -> bool: ...
    async def load(self, session_id: str) -> StoredSessionLike: ...


class HostServices(Protocol[S]):
    """The services a host offers its plugins, passed to every hook as ``host``.

    A service is ``None`` when the host does not have it; ``session_persistence`` is ``None``
    until a persistence backend is provided.
    """

    @property
    def sessions(self) -> SessionStoreLike[S]: ...
    @property
    def llm(self) -> object: ...
    @property
    def tools(self) -> object: ...
    @property
    def invariants(self) -> InvariantsLike | None: ...
    @property
    def session_persistence(self) -> PersistenceLike | None: ...


class PluginHost(HostServices[S], Protocol[S]):
    """What a plugin that holds per-host resources needs besides, such as a persistence backend.

    ``options``
        The host's settings for its plugins (``"jsonl.root"``...). A plugin declares the ones
        it reads with the ``host_declare_options`` hook.
    ``task_group``
        Where the plugin runs background work while the host is open; cancelled when it closes,
        after the cleanups.
    ``add_cleanup(cleanup)``
        Awaits *cleanup* when the host closes (last added first), even while the host is closed
        because its caller was cancelled.
    ``register(plugin, name)``
        Adds a plugin the plugin builds (a backend configured from options), configured at once.
    ``provide_session_persistence(backend)`` / ``withdraw_session_persistence(backend)``
        The one way to become ``host.session_persistence``: a second provider is an error that
        names both.
    """

    @property
    def options(self) -> Mapping[str, object]: ...
    @property
    def task_group(self) -> TaskGroup: ...
    def add_cleanup(self, cleanup: Callable[[], Awaitable[object]]) -> None: ...
    def register(self, plugin: object, name: str | None = None) -> str: ...
    def provide_session_persistence(self, backend: PersistenceLike) -> None: ...
    def withdraw_session_persistence(self, backend: PersistenceLike) -> None: ...


# -------------------------------------------------------------------------------------------
# Values that cross the boundaries
# -------------------------------------------------------------------------------------------


def _any_object() -> JSONObject:
    return {"type": "object"}


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What a model is told of one tool: its name, what it does, and the JSON Schema of its input.

    ``parameters`` is a JSON Schema for the tool's arguments, an object schema as model
    endpoints expect; the default, ``{"type": "object"}``, accepts any object. ``effect`` is the
    effect class the tool's calls run under (:mod:`~kai_session_checkpoint_policy.effects`), or
    ``None`` when nothing trusted declares one: its calls then run under the worst case,
    ``"open-world"``.
    """

    name: str
    description: str = ""
    parameters: JSONObject = field(default_factory=_any_object, hash=False)
    effect: EffectClass | None = None


@dataclass(frozen=True, slots=True)
class LlmRequest:
    """One model request: the route, the transcript, and the session it belongs to.

    ``tools`` names the tools the model may call; ``tool_specs`` describes them (their input
    schemas) for an adapter that must tell a model endpoint what each tool takes. A host that
    has no schemas leaves ``tool_specs`` empty, and an adapter then sends only the names it
    has, each taking any object.
    """

    provider: str
    model: str
    messages: tuple[JSONObject, ...] = ()
    tools: tuple[str, ...] = ()
    session_id: str | None = None
    tool_specs: tuple[ToolSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class BlockStart:
    """A content block of the response starts at *index* (``"text"``, ``"tool-call"``...)."""

    index: int
    block_type: str

    def to_json(self) -> JSONObject:
        return {"type": "block-start", "index": self.index, "blockType": self.block_type}


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the text of the block at *index*."""

    text: str
    index: int = 0

    def to_json(self) -> JSONObject:
        return {"type": "text-delta", "index": self.index, "text": self.text}


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """A piece of the reasoning of the block at *index*."""

    text: str
    index: int = 0

    def to_json(self) -> JSONObject:
        return {"type": "reasoning-delta", "index": self.index, "text": self.text}


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of the raw JSON arguments of the tool call at *index*."""

    index: int
    id: str
    arguments_delta: str
    name: str | None = None

    def to_json(self) -> JSONObject:
        chunk: JSONObject = {"type": "tool-call-delta", "index": self.index, "id": self.id}
        if self.name is not None:
            chunk["name"] = self.name
        chunk["argumentsDelta"] = self.arguments_delta
        return chunk


@dataclass(frozen=True, slots=True)
class BlockEnd:
    """The block at *index* is complete: *block* is all of it, and what the message holds.

    A text block is ``{"type": "text", "text": ...}``; a tool call ``{"type": "tool-call",
    "id": ..., "name": ..., "arguments": <raw JSON text>}``.
    """

    index: int
    block: JSONObject

    def to_json(self) -> JSONObject:
        return {"type": "block-end", "index": self.index, "block": self.block}


@dataclass(frozen=True, slots=True)
class Usage:
    """The tokens the request used (``inputTokens``, ``outputTokens``...)."""

    usage: JSONObject

    def to_json(self) -> JSONObject:
        return {"type": "usage", "usage": self.usage}


@dataclass(frozen=True, slots=True)
class Finish:
    """The end of a response, and why it ended (``reason.kind``)."""

    kind: Literal["stop", "tool-calls", "max-tokens", "aborted", "error"] = "stop"
    failure: JSONObject | None = None

    @property
    def reason(self) -> JSONObject:
        reason: JSONObject = {"kind": self.kind}
        if self.failure is not None:
            reason["failure"] = self.failure
        return reason

    def to_json(self) -> JSONObject:
        return {"type": "finish", "reason": self.reason}


StreamChunk: TypeAlias = (
    BlockStart | TextDelta | ReasoningDelta | ToolCallDelta | BlockEnd | Usage | Finish
)
"""One chunk of a model's response stream, in the shapes the original harness stores."""


def text_block(index: int, text: str) -> tuple[StreamChunk, ...]:
    """The chunks of a whole text block at *index*: its start, one delta, its end."""
    return (
        BlockStart(index, "text"),
        TextDelta(text, index),
        BlockEnd(index, {"type": "text", "text": text}),
    )


def tool_call_block(
    index: int, call_id: str, name: str, arguments: str = "{}"
) -> tuple[StreamChunk, ...]:
    """The chunks of a whole tool-call block at *index*; *arguments* is raw JSON text."""
    block: JSONObject = {"type": "tool-call", "id": call_id, "name": name, "arguments": arguments}
    return (
        BlockStart(index, "tool-call"),
        ToolCallDelta(index, call_id, arguments, name),
        BlockEnd(index, block),
    )


@dataclass(frozen=True, slots=True)
class PreStepDecision:
    """Whether to enter the step; a rejection ends the turn as ``blocked``."""

    kind: Literal["enter", "reject"] = "enter"
    reason: str = ""
