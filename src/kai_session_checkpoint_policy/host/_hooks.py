"""The typed facade over ``pm.hook``: the only module that touches pluggy's untyped results."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn, cast

if TYPE_CHECKING:
    import pluggy

    from ..events import SessionEvent
    from ..hookspecs import FlushThunk, HostServices, PreStepThunk, StreamThunk, ToolThunk
    from .agent import PreStep
    from .llm import LlmRequest
    from .sessions import Session
    from .tools import ToolExecution

__all__ = ["HostHooks", "MissingImplementationError"]


class MissingImplementationError(LookupError):
    """A firstresult hook returned nothing: no plugin implements the boundary."""


class HostHooks:
    """One typed method per hook, each passing the host as the ``host`` argument."""

    __slots__ = ("_hook", "_host", "_pm")

    def __init__(self, pm: pluggy.PluginManager, host: HostServices) -> None:
        self._pm = pm
        self._hook = pm.hook
        self._host = host

    def host_configure(self) -> None:
        self._hook.host_configure.call_historic(kwargs={"host": self._host})

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
        ``session_flush`` has no hook wrappers.
        """
        kwargs = {"session": session, "host": self._host}
        thunks: list[FlushThunk] = []
        for impl in self._hook.session_flush.get_hookimpls():
            if impl.wrapper or impl.hookwrapper:
                raise TypeError(f"session_flush cannot be a hook wrapper ({impl.plugin_name})")
            try:
                thunk = cast("FlushThunk | None", impl.function(*map(kwargs.get, impl.argnames)))
            except Exception as exc:
                thunk = partial(_raise, exc)
            if thunk is not None:
                thunks.append(thunk)
        return thunks

    def session_event(self, session: Session, event: SessionEvent) -> None:
        self._hook.session_event(session=session, event=event, host=self._host)

    def _first(self, name: str, **kwargs: Any) -> object:
        thunk = getattr(self._hook, name)(host=self._host, **kwargs)
        if thunk is None:
            raise MissingImplementationError(f"no plugin returned a thunk for {name}")
        return thunk


async def _raise(exc: Exception) -> NoReturn:
    raise exc
