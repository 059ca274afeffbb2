"""The typed facade over ``pm.hook``: the only module that touches pluggy's untyped results."""

from __future__ import annotations

import logging
import sys
from functools import partial
from typing import TYPE_CHECKING, Any, Final, NoReturn, cast

import pluggy

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..contract import HostServices, LlmRequest
    from ..events import SessionEvent
    from ..hookspecs import FlushThunk, PreStepThunk, StreamThunk, ToolThunk
    from .agent import PreStep
    from .sessions import Session
    from .tools import ToolExecution

__all__ = ["HostHooks", "HostPluginManager", "MissingImplementationError"]

logger = logging.getLogger(__name__)

_PER_IMPLEMENTATION: Final = frozenset(
    {"session_flush", "session_event", "session_attach", "session_detach"}
)
"""The hooks whose implementations the host calls one by one, so they take no wrappers."""


def _log_listener_failure(message: str, *args: object) -> None:
    """Log a listener's failure with its traceback (called in the ``except`` block).

    When the application configured no handler at all, the package's ``NullHandler`` would
    keep it silent: it goes to Python's last-resort handler (standard error) then, as it would
    have without the package's handler.
    """
    logger.exception(message, *args)
    resort = logging.lastResort
    if resort is None or not logger.isEnabledFor(logging.ERROR):
        return
    current: logging.Logger | None = logger
    while current is not None:
        if any(not isinstance(handler, logging.NullHandler) for handler in current.handlers):
            return  # the application listens
        current = current.parent if current.propagate else None
    resort.handle(
        logger.makeRecord(logger.name, logging.ERROR, __file__, 0, message, args, sys.exc_info())
    )


class HostPluginManager(pluggy.PluginManager):
    """pluggy's plugin manager, refusing hook wrappers on the hooks it calls one by one.

    The host calls the implementations of ``session_flush``, ``session_event``,
    ``session_attach`` and ``session_detach`` one by one, so that one that raises
    cannot keep the others from running; a wrapper would never run, so registering one is an
    error, raised before the plugin is registered or configured.
    """

    def register(self, plugin: object, name: str | None = None) -> str | None:
        for attribute in dir(plugin):
            opts = self.parse_hookimpl_opts(plugin, attribute)
            if opts is None or (opts.get("specname") or attribute) not in _PER_IMPLEMENTATION:
                continue
            if opts.get("wrapper") or opts.get("hookwrapper"):
                owner = name or self.get_canonical_name(plugin)
                hook = opts.get("specname") or attribute
                raise TypeError(f"{hook} cannot be a hook wrapper ({owner})")
        return super().register(plugin, name)


class MissingImplementationError(LookupError):
    """A firstresult hook returned nothing: no plugin implements the boundary."""


class HostHooks:
    """One typed method per hook, each passing the host as the ``host`` argument."""

    __slots__ = ("_hook", "_host", "_pm")

    def __init__(self, pm: pluggy.PluginManager, host: HostServices[Session]) -> None:
        self._pm = pm
        self._hook = pm.hook
        self._host = host

    def host_declare_options(self) -> dict[str, str]:
        """Every option the registered plugins declare, with its description."""
        declared: dict[str, str] = {}
        for options in self._hook.host_declare_options():
            declared.update(cast("Mapping[str, str]", options))
        return declared

    def host_configure(self) -> None:
        self._hook.host_configure.call_historic(kwargs={"host": self._host})

    def host_opened(self) -> None:
        self._hook.host_opened(host=self._host)

    def host_unconfigure(self, plugin: object | None = None) -> None:
        """Unconfigure every plugin, or only *plugin*."""
        if plugin is None:
            self._hook.host_unconfigure(host=self._host)
            return
        others = [other for other in self._pm.get_plugins() if other is not plugin]
        self._pm.subset_hook_caller("host_unconfigure", others)(host=self._host)

    def llm_stream(self, request: LlmRequest) -> StreamThunk:
        return cast("StreamThunk", self._first("llm_stream", request=request))

    def tools_execute(self, execution: ToolExecution) -> ToolThunk:
        return cast("ToolThunk", self._first("tools_execute", execution=execution))

    def agent_pre_step(self, step: PreStep) -> PreStepThunk:
        return cast("PreStepThunk", self._first("agent_pre_step", step=step))

    def session_flush(self, session: Session) -> list[FlushThunk]:
        """The flush thunks of every participating plugin, in registration order.

        Each implementation is called on its own: one that raises while building its thunk
        gets a thunk raising that error, so it cannot keep the others from being started.
        """
        kwargs = {"session": session, "host": self._host}
        thunks: list[FlushThunk] = []
        for impl in self._hook.session_flush.get_hookimpls():
            try:
                thunk = cast("FlushThunk | None", _call(impl, kwargs))
            except Exception as exc:
                thunk = partial(_raise, exc)
            if thunk is not None:
                thunks.append(thunk)
        return thunks

    def session_event(self, session: Session, event: SessionEvent) -> None:
        """Announce *event* to every listener, last registered first, as pluggy would.

        Each implementation is called on its own, which costs less than pluggy's dispatch on
        this path of every append: one that raises is logged, and the others still hear of it.
        """
        kwargs = {"session": session, "event": event, "host": self._host}
        for impl in reversed(self._hook.session_event.get_hookimpls()):
            try:
                _call(impl, kwargs)
            except Exception:
                _log_listener_failure(
                    "session_event listener %r failed on seq %d of session %r",
                    impl.plugin_name,
                    event.seq,
                    session.id,
                )

    def session_attach(self, session: Session, plugin: object | None = None) -> None:
        """Announce that *session* is live, to every plugin or only to *plugin*, as
        :meth:`session_event` announces."""
        kwargs = {"session": session, "host": self._host}
        for impl in reversed(self._hook.session_attach.get_hookimpls()):
            if plugin is not None and impl.plugin is not plugin:
                continue
            try:
                _call(impl, kwargs)
            except Exception:
                _log_listener_failure(
                    "session_attach listener %r failed on session %r", impl.plugin_name, session.id
                )

    def session_detach(self, session: Session) -> None:
        """Announce that *session* is no longer live, as :meth:`session_event` announces."""
        kwargs = {"session": session, "host": self._host}
        for impl in reversed(self._hook.session_detach.get_hookimpls()):
            try:
                _call(impl, kwargs)
            except Exception:
                _log_listener_failure(
                    "session_detach listener %r failed on session %r", impl.plugin_name, session.id
                )

    def _first(self, name: str, **kwargs: Any) -> object:
        thunk = getattr(self._hook, name)(host=self._host, **kwargs)
        if thunk is None:
            raise MissingImplementationError(f"no plugin returned a thunk for {name}")
        return thunk


def _call(impl: pluggy.HookImpl, kwargs: dict[str, object]) -> object:
    """Call one hook implementation with the arguments it names, as pluggy would."""
    return impl.function(*map(kwargs.get, impl.argnames))


async def _raise(exc: Exception) -> NoReturn:
    raise exc
