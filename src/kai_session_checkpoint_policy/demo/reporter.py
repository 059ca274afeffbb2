"""The demo's reporter: each appended event, and at each checkpoint what became durable."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..hookspecs import hookimpl
from ..output import Console, event_line
from ..persistence import (
    SessionPersistence,
)
from ..policy import session_before_request, session_before_step, session_before_tool

if TYPE_CHECKING:
    from collections.abc import (
        AsyncGenerator,
        Generator,
    )

    from ..contract import HostServices, LlmRequest, PreStepDecision, StreamChunk
    from ..events import SessionEvent
    from ..hookspecs import PreStepThunk, StreamThunk, ToolThunk
    from ..host import PreStep, Session, ToolExecution
    from ..results import ToolResult

__all__ = ["CheckpointReporter"]


# -------------------------------------------------------------------------------------------
# Watching checkpoints
# -------------------------------------------------------------------------------------------


class CheckpointReporter:
    """A plugin that prints each appended event and, at each checkpoint, what became durable.

    Its wrappers are ``trylast``, so they sit inside the policy's: when one of its thunks runs,
    the policy's flush has completed, and the backend's durable count shows what it wrote. It
    reports where the policy says it checkpoints (:func:`~.policy.session_before_request` and
    its siblings), and asks the backend through
    :class:`~kai_session_checkpoint_policy.persistence.SessionPersistence`.
    """

    name = "kai-demo-checkpoint-reporter"

    def __init__(self, console: Console) -> None:
        self.console = console
        self._durable: dict[str, int] = {}

    def report(self, host: HostServices[Session], session: Session, where: str) -> None:
        """Print which events of *session* reached the disk since the last report, and *where*."""
        backend = host.session_persistence
        count = backend.durable_count(session.id) if isinstance(backend, SessionPersistence) else 0
        start = self._durable.get(session.id, 0)
        written = session.events[start:count]
        self._durable[session.id] = max(start, count)
        if not written:
            what = "nothing new to write"
        elif len(written) == 1:
            what = f"seq {written[0].seq} on disk ({written[0].type})"
        else:
            kinds = ", ".join(event.type for event in written)
            what = f"seqs {written[0].seq}-{written[-1].seq} on disk ({kinds})"
        console = self.console
        console.line(f"   {console.good('*')} {where}: {what}")

    @hookimpl
    def session_event(self, event: SessionEvent) -> None:
        self.console.line(event_line(self.console, event, mark="   +", paint=self.console.dim))

    @hookimpl(wrapper=True, trylast=True)
    def agent_pre_step(
        self, step: PreStep, host: HostServices[Session]
    ) -> Generator[None, PreStepThunk, PreStepThunk]:
        downstream = yield
        session = session_before_step(step, host)
        if session is None:
            return downstream
        live: Session = session

        async def reported() -> PreStepDecision:
            self.report(host, live, f"checkpoint before step {step.step} (agent_pre_step)")
            return await downstream()

        return reported

    @hookimpl(wrapper=True, trylast=True)
    def llm_stream(
        self, request: LlmRequest, host: HostServices[Session]
    ) -> Generator[None, StreamThunk, StreamThunk]:
        downstream = yield
        session = session_before_request(request, host)
        if session is None:
            return downstream
        live: Session = session

        def reported() -> AsyncGenerator[StreamChunk, None]:
            self.report(host, live, "checkpoint before the model receives the request (llm_stream)")
            return downstream()

        return reported

    @hookimpl(wrapper=True, trylast=True)
    def tools_execute(
        self, execution: ToolExecution, host: HostServices[Session]
    ) -> Generator[None, ToolThunk, ToolThunk]:
        downstream = yield
        session = session_before_tool(execution, host)
        if session is None:
            return downstream
        live: Session = session

        async def reported() -> ToolResult:
            where = f"checkpoint before the {execution.name} body runs (tools_execute)"
            self.report(host, live, where)
            return await downstream()

        return reported
