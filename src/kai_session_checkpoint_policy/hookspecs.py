"""The host contract: the hooks a host calls and the plugins of this package implement.

pluggy calls hooks synchronously, so the three boundary hooks return *thunks*: zero-argument
callables that start the work only when called. A ``wrapper=True`` implementation receives the
downstream thunk from ``yield`` and returns a new thunk; nothing downstream runs until the
returned thunk is called. Errors therefore arrive in two layers: the ``yield`` raises what inner
plugins raised while *building* their thunks, and the returned thunk raises what happens while
it *runs*.

Host services reach implementations as the ``host`` keyword argument (see
:class:`~kai_session_checkpoint_policy.contract.HostServices`); the arguments and the values
that cross the boundaries are declared in :mod:`~kai_session_checkpoint_policy.contract`, so
that any host can implement them. This module imports nothing it describes at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, TypeAlias

import pluggy

from .contract import HostServices

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping

    from .contract import (
        ModelRequestLike,
        PreStepDecision,
        PreStepLike,
        SessionLike,
        StreamChunk,
        ToolCallLike,
    )
    from .events import SessionEvent
    from .results import ToolResult

__all__ = [
    "PROJECT",
    "FlushThunk",
    "HostServices",
    "PreStepThunk",
    "StreamThunk",
    "ToolThunk",
    "hookimpl",
]

PROJECT: Final = "kai"
"""The pluggy project name; also the entry-point group plugins are loaded from."""

hookspec: Final = pluggy.HookspecMarker(PROJECT)
hookimpl: Final = pluggy.HookimplMarker(PROJECT)

StreamThunk: TypeAlias = "Callable[[], AsyncGenerator[StreamChunk, None]]"
"""Starts a model request when called: returns the stream of chunks."""
ToolThunk: TypeAlias = "Callable[[], Awaitable[ToolResult]]"
"""Runs a tool call when called and awaited."""
PreStepThunk: TypeAlias = "Callable[[], Awaitable[PreStepDecision]]"
"""Decides, when called and awaited, whether the agent enters the next step."""
FlushThunk: TypeAlias = "Callable[[], Awaitable[None]]"
"""Makes a session's admitted events durable when called and awaited."""


# -------------------------------------------------------------------------------------------
# Host lifecycle
# -------------------------------------------------------------------------------------------


@hookspec
def host_declare_options() -> Mapping[str, str] | None:
    """Declare the host options this plugin reads.

    :return: Each option's name (``"jsonl.root"``) with a one-line description, or ``None``.

    Called when the host opens, before any plugin is configured. A host option that no plugin
    declares is an error at open, naming it and the declared ones, so that a mistyped option
    cannot switch a plugin off without a word.
    """


@hookspec(historic=True)
def host_configure(host: HostServices[Any]) -> None:
    """Acquire per-host resources once the host is open.

    :param host: The host that was opened.

    Called once for every plugin: when the host opens, and for a plugin registered later, at
    its registration. Pair it with :func:`host_unconfigure`.
    """


@hookspec
def host_opened(host: HostServices[Any]) -> None:
    """Check what the host offers, now that it is open and every plugin is configured.

    :param host: The host that was opened.

    Called once, after ``host_configure`` has been called for every plugin registered by then,
    and before the host is used. A plugin that needs services other plugins provide (the
    policy needs a persistence backend) looks for them here, whatever the order in which the
    plugins were configured.
    """


@hookspec
def host_unconfigure(host: HostServices[Any]) -> None:
    """Release per-host resources.

    :param host: The host that is closing, or from which this plugin is being unregistered.

    Called for every plugin when the host closes, and for one plugin alone when it is
    unregistered from an open host.
    """


# -------------------------------------------------------------------------------------------
# Semantic boundaries
# -------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def llm_stream(request: ModelRequestLike, host: HostServices[Any]) -> StreamThunk | None:
    """Return the thunk that dispatches *request* to a model adapter.

    :param request: The model request; ``request.session_id`` names the session it belongs to.
    :param host: The host services.
    :return: A zero-argument callable returning an async generator of stream chunks.

    Stops at first non-None result. The host implements the innermost thunk (the registered
    adapter). Wrappers receive the downstream thunk from ``yield`` and return a thunk; a
    wrapper that must act before the adapter does so inside its own thunk, before it calls the
    downstream one.
    """


@hookspec(firstresult=True)
def tools_execute(execution: ToolCallLike[Any], host: HostServices[Any]) -> ToolThunk | None:
    """Return the thunk that runs one tool call.

    :param execution: The call: id, tool name, arguments, the agent it runs for (``None`` for
        a direct call), the enclosing ``parent`` of a nested dispatch, and its abort signal.
    :param host: The host services.
    :return: A zero-argument async callable returning a :class:`~.results.ToolResult`.

    Stops at first non-None result. The host implements the innermost thunk (the tool body).
    The tool runtime turns anything a thunk raises, while built or while run, into an error
    result whose text is ``Error: <message>``.
    """


@hookspec(firstresult=True)
def agent_pre_step(step: PreStepLike[Any], host: HostServices[Any]) -> PreStepThunk | None:
    """Return the thunk that decides whether the agent enters its next step.

    :param step: The agent, turn number, step number and abort signal of the coming step.
    :param host: The host services.
    :return: A zero-argument async callable returning a
        :class:`~kai_session_checkpoint_policy.contract.PreStepDecision`.

    Stops at first non-None result. Called before every step, before ``step/start`` is
    appended. An exception from the thunk ends the turn with an error before any model request.
    """


# -------------------------------------------------------------------------------------------
# Session persistence
# -------------------------------------------------------------------------------------------


@hookspec
def session_flush(session: SessionLike, host: HostServices[Any]) -> FlushThunk | None:
    """Return a thunk that makes every event admitted for *session* durable.

    :param session: A live session.
    :param host: The host services.
    :return: A zero-argument async callable, or ``None`` when this plugin has nothing to flush.

    The session store starts every returned thunk concurrently, waits for all of them to
    settle, and then raises the first failure in registration order. An exception raised while
    building the thunk counts as that plugin's failure and does not keep the others from
    starting. Implementations cannot be hook wrappers: registering one raises ``TypeError``.
    """


@hookspec
def session_attach(session: SessionLike, host: HostServices[Any]) -> None:
    """Hear that *session* is live here: created, resumed, or seeded with stored events.

    :param session: The session that is live from now on.
    :param host: The host services.

    Called synchronously, once per session, before anything is appended to it; a plugin
    registered while sessions are live hears of each of them when it is registered. A
    persistence backend knows from it which sessions are live, even those that have not
    appended yet (a load must not repair a log under a live session). Each implementation is
    called on its own, last registered first, like :func:`session_event`; implementations
    cannot be hook wrappers: registering one raises ``TypeError``.
    """


@hookspec
def session_event(session: SessionLike, event: SessionEvent, host: HostServices[Any]) -> None:
    """Admit one event that was just appended to a live session.

    :param session: The session the event was appended to.
    :param event: The committed event; its ``data`` is already a private, validated copy.
    :param host: The host services.

    Called synchronously inside the append: enqueue the event, never block. Each
    implementation is called on its own, last registered first: an exception is logged, and
    neither undoes the append nor keeps the event from the other implementations.
    Implementations cannot be hook wrappers: registering one raises ``TypeError``.
    """


@hookspec
def session_detach(session: SessionLike, host: HostServices[Any]) -> None:
    """Hear that *session* is no longer live: nothing more will be appended to it here.

    :param session: The session that was live until now.
    :param host: The host services.

    Called synchronously, once, when the store detaches the session; each implementation on
    its own, last registered first, like :func:`session_event`. A persistence backend writes
    what the session admitted and then releases what it holds for it (open files, locks, its
    events). Implementations cannot be hook wrappers: registering one raises ``TypeError``.
    """
