"""The reference host: a plugin manager and the services plugins reach as ``host``."""

from __future__ import annotations

import os
import sys
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Final

import anyio

from .. import hookspecs
from ..contract import SessionPersistenceLike
from ..hookspecs import PROJECT
from ._hooks import HostHooks, HostPluginManager
from .agent import DefaultPreStep
from .invariants import InvariantRegistry
from .llm import LlmRuntime
from .sessions import HostStateError, SessionStore, epoch_ms
from .tools import ToolRuntime

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
    from types import TracebackType

    from anyio.abc import TaskGroup

    from ..contract import PersistenceLike

__all__ = ["AUTOLOAD_ENV", "Host", "HostOptionError", "HostStateError", "PersistenceConflictError"]

AUTOLOAD_ENV: Final = "KAI_DISABLE_PLUGIN_AUTOLOAD"
"""Set this environment variable to a non-empty value to skip entry-point plugins."""


class HostOptionError(ValueError):
    """A host option that no plugin of the host declares (usually a typing mistake)."""


class PersistenceConflictError(RuntimeError):
    """A second plugin tried to provide the host's ``session_persistence``."""


class Host:
    """A plugin manager with a session store, LLM and tool runtimes, and an invariants registry.

    Plugins come from the ``kai`` entry-point group (unless *autoload* is false or the
    ``KAI_DISABLE_PLUGIN_AUTOLOAD`` environment variable is set), minus the names in *block*,
    then from *plugins*, in that order. Open the host with ``async with`` before use: opening
    configures every plugin; closing unconfigures them and runs their cleanups.

    *options* are settings for plugins, such as ``"jsonl.root"`` for the JSONL persistence
    backend loaded from its entry point. Each must be declared by a plugin of the host (the
    ``host_declare_options`` hook): an unknown one is an error when the host opens.

    The host implements :class:`~kai_session_checkpoint_policy.contract.PluginHost`, for its
    own :class:`~kai_session_checkpoint_policy.host.Session` type.
    """

    def __init__(
        self,
        plugins: Iterable[object] = (),
        *,
        autoload: bool = True,
        block: Iterable[str] = (),
        options: Mapping[str, object] | None = None,
        clock: Callable[[], int] = epoch_ms,
    ) -> None:
        self.pm: Final = HostPluginManager(PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.hooks: Final = HostHooks(self.pm, self)
        self.options: Final[Mapping[str, object]] = dict(options or {})
        self.sessions: Final = SessionStore(self.hooks, clock=clock, host=self)
        self.llm: Final = LlmRuntime(self.hooks)
        self.tools: Final = ToolRuntime(self.hooks)
        self.invariants: InvariantRegistry | None = InvariantRegistry()
        self._session_persistence: SessionPersistenceLike | None = None
        self._lifecycle: AsyncExitStack | None = None  # while open: closes everything in order
        self._stack: AsyncExitStack | None = None  # while open: the plugins' cleanups
        self._task_group: TaskGroup | None = None
        self._closed = False
        for builtin in (self.llm, self.tools, DefaultPreStep()):
            self.pm.register(builtin, name=builtin.name)
        for name in block:
            self.pm.set_blocked(name)
        if autoload and not os.environ.get(AUTOLOAD_ENV):
            self.pm.load_setuptools_entrypoints(PROJECT)
        for plugin in plugins:
            self.register(plugin)

    @property
    def is_open(self) -> bool:
        """Whether the host has been opened (``async with host``) and not yet closed."""
        return self._lifecycle is not None and not self._closed

    @property
    def session_persistence(self) -> SessionPersistenceLike | None:
        """The persistence backend a plugin provided, or ``None``."""
        return self._session_persistence

    def provide_session_persistence(self, backend: PersistenceLike) -> None:
        """Make *backend* the host's ``session_persistence``.

        Plugins need nothing of a backend but its presence; this host also tells new sessions
        from stored ones and resumes them with it, so the backend must offer what
        :class:`~kai_session_checkpoint_policy.contract.SessionPersistenceLike` declares.

        :raises PersistenceConflictError: if another backend already is, naming both.
        :raises TypeError: if *backend* lacks a member this host reads, naming it.
        """
        if not isinstance(backend, SessionPersistenceLike):
            missing = [member for member in _HOST_READS if not hasattr(backend, member)]
            raise TypeError(
                f"{_describe(backend)} cannot be the session persistence of this host: it has "
                f"no {' and no '.join(missing)} (the host tells new sessions from stored ones "
                "and resumes them with these)"
            )
        current = self._session_persistence
        if current is not None and current is not backend:
            raise PersistenceConflictError(
                f"{_describe(backend)} cannot be the host's session persistence: "
                f"{_describe(current)} already is (load one persistence backend per host)"
            )
        self._session_persistence = backend

    def withdraw_session_persistence(self, backend: PersistenceLike) -> None:
        """Stop using *backend* as ``session_persistence``, if it is."""
        if self._session_persistence is backend:
            self._session_persistence = None

    def register(self, plugin: object, name: str | None = None) -> str:
        """Register *plugin* (configured at once if the host is open); return its name.

        The name is *name*, else the plugin's ``name`` attribute, else its module's or its
        class's qualified name (made unique on this host if it is taken).
        """
        if self._closed:
            raise HostStateError("cannot register a plugin on a closed host")
        chosen = name or getattr(plugin, "name", None) or _default_name(plugin)
        if name is None and self.pm.get_plugin(chosen) is not None:
            chosen = f"{chosen}#{len(self.pm.get_plugins())}"
        registered = self.pm.register(plugin, chosen)
        if registered is None:
            raise ValueError(f"plugin {chosen!r} is blocked on this host")
        for session in self.sessions.live():  # a plugin registered while sessions are live
            self.hooks.session_attach(session, plugin)
        return registered

    def unregister(self, plugin: object) -> None:
        """Unconfigure *plugin* if the host is open, then remove all of its hooks.

        The hooks are removed even if unconfiguring raises; the error then propagates.
        """
        try:
            if self._lifecycle is not None:
                self.hooks.host_unconfigure(plugin)
        finally:
            self.pm.unregister(plugin)

    async def dispose(self, plugin: object) -> None:
        """Unconfigure *plugin*, wait until it has released what it holds, then remove it.

        A plugin that holds resources (a persistence backend: queued events, locks, leases,
        connections) releases them in its ``aclose``, awaited here: a backend disposed this way
        writes what its sessions admitted and lets go of their locks, so that the backend
        registered next can go on with the same sessions. Its hooks are removed even if that
        fails; the error then propagates.
        """
        try:
            if self._lifecycle is not None:
                self.hooks.host_unconfigure(plugin)
            close = getattr(plugin, "aclose", None)
            if close is not None:
                await close()
        finally:
            self.pm.unregister(plugin)

    @property
    def task_group(self) -> TaskGroup:
        """The task group for the plugins' background work, while the host is open."""
        if self._task_group is None:
            raise HostStateError("the host is not open; use 'async with host:'")
        return self._task_group

    def add_cleanup(self, cleanup: Callable[[], Awaitable[object]]) -> None:
        """Run *cleanup* when the host closes, before its background tasks are cancelled.

        Cleanups run last-added first; they run even if an earlier one fails.
        """
        if self._stack is None:
            raise HostStateError("the host is not open; use 'async with host:'")
        self._stack.push_async_callback(cleanup)

    async def __aenter__(self) -> Host:
        """Open the host: start its background task group, then configure every plugin.

        Everything opened is closed again, in reverse order, by one exit stack: if a
        ``host_configure`` hook raises, the host is closed at once and the error propagates.
        """
        if self._lifecycle is not None or self._closed:
            raise HostStateError("a host can be opened only once")
        self._check_options()
        lifecycle = self._lifecycle = AsyncExitStack()
        try:
            self._task_group = await lifecycle.enter_async_context(_background_tasks())
            cleanups = self._stack = AsyncExitStack()
            lifecycle.push_async_exit(partial(_exit_shielded, cleanups))
            lifecycle.callback(self.hooks.host_unconfigure)
            self.hooks.host_configure()
            self.hooks.host_opened()
        except BaseException:
            await self._close(*sys.exc_info())
            raise
        return self

    def _check_options(self) -> None:
        """:raises HostOptionError: naming every option no plugin declares, and the declared."""
        declared = self.hooks.host_declare_options()
        unknown = sorted(set(self.options) - set(declared))
        if unknown:
            self._closed = True
            known = ", ".join(sorted(declared)) or "none"
            raise HostOptionError(
                f"unknown host option{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(map(repr, unknown))}: the plugins of this host declare {known}"
            )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._close(exc_type, exc, traceback)

    async def _close(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Unconfigure the plugins, run their cleanups (shielded), stop the background tasks.

        An exception that ends the ``async with`` block passes through as itself.
        """
        lifecycle = self._lifecycle
        assert lifecycle is not None
        self._closed = True
        try:
            await lifecycle.__aexit__(exc_type, exc, traceback)
        finally:
            self._lifecycle = self._stack = self._task_group = None


async def _exit_shielded(
    stack: AsyncExitStack,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    traceback: TracebackType | None,
) -> bool:
    """Close *stack* even while the caller is cancelled: cleanups drain what must be written."""
    with anyio.CancelScope(shield=True):
        suppress = await stack.__aexit__(exc_type, exc, traceback)
    return bool(suppress)


def _default_name(plugin: object) -> str:
    """A readable name for a plugin without one: its module's name, or its class's."""
    module_name = getattr(plugin, "__name__", None)
    if isinstance(module_name, str) and isinstance(plugin, type(sys)):
        return module_name
    kind = type(plugin)
    return f"{kind.__module__}.{kind.__qualname__}"


def _describe(backend: object) -> str:
    return repr(backend)


_HOST_READS: Final = ("name", "session_exists", "load")
"""What this host reads of its persistence backend, besides what plugins need."""


@asynccontextmanager
async def _background_tasks() -> AsyncIterator[TaskGroup]:
    """A task group for background work, cancelled when the block ends.

    The block's own exception is not handed to the task group, so it comes out unwrapped
    (anyio's task groups raise what passes through them inside an exception group).
    """
    group = anyio.create_task_group()
    await group.__aenter__()
    try:
        yield group
    finally:
        group.cancel_scope.cancel()
        await group.__aexit__(None, None, None)
