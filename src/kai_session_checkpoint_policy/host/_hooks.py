"""The typed facade over ``pm.hook``: the only module that touches pluggy's untyped results."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

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
        for impl in reversed(self._hook.host_unconfigure.get_hookimpls()):
            if impl.plugin is plugin:
                impl.function(host=self._host)

    def llm_stream(self, request: LlmRequest) -> StreamThunk:
        return cast("StreamThunk", self._first("llm_stream", request=request))

    def tools_execute(self, execution: ToolExecution) -> ToolThunk:
        return cast("ToolThunk", self._first("tools_execute", execution=execution))

    def agent_pre_step(self, step: PreStep) -> PreStepThunk:
        return cast("PreStepThunk", self._first("agent_pre_step", step=step))

    def session_flush(self, session: Session) -> list[FlushThunk]:
        """The flush thunks of every participating plugin, in registration order."""
        thunks: list[FlushThunk] = self._hook.session_flush(session=session, host=self._host)
        thunks.reverse()
        return thunks

    def session_event(self, session: Session, event: SessionEvent) -> None:
        self._hook.session_event(session=session, event=event, host=self._host)

    def _first(self, name: str, **kwargs: Any) -> object:
        thunk = getattr(self._hook, name)(host=self._host, **kwargs)
        if thunk is None:
            raise MissingImplementationError(f"no plugin returned a thunk for {name}")
        return thunk
