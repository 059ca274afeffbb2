"""One small plugin for each hook of the host contract, and a run that exercises them all.

python docs/examples/hooks.py
"""

from __future__ import annotations

import tempfile
import warnings
from collections import Counter
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import anyio

from kai_session_checkpoint_policy import (
    Agent,
    Host,
    PreStepDecision,
    SessionEvent,
    error_result,
    hookimpl,
    policy,
)
from kai_session_checkpoint_policy.demo import PROVIDER, ScriptedModel, make_payment_tool
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Generator, Mapping

    from kai_session_checkpoint_policy import (
        HostServices,
        ModelRequestLike,
        PreStepLike,
        SessionLike,
        StreamChunk,
        ToolCallLike,
        ToolResult,
    )
    from kai_session_checkpoint_policy.hookspecs import (
        FlushThunk,
        PreStepThunk,
        StreamThunk,
        ToolThunk,
    )


class HostLifetime:
    """Holds a per-host resource from ``host_configure`` until ``host_unconfigure``."""

    name = "example-host-lifetime"

    def __init__(self) -> None:
        self.open_hosts: list[HostServices[Any]] = []

    @hookimpl
    def host_configure(self, host: HostServices[Any]) -> None:
        self.open_hosts.append(host)  # acquire: open a file, a connection, a pool...

    @hookimpl
    def host_unconfigure(self, host: HostServices[Any]) -> None:
        self.open_hosts.remove(host)  # release what host_configure acquired


class AuditLog:
    """Declares the host option it reads; warns at open if the host cannot persist."""

    name = "example-audit-log"

    @hookimpl
    def host_declare_options(self) -> Mapping[str, str]:
        return {"audit.enabled": "record every tool call in an audit log"}

    @hookimpl
    def host_opened(self, host: HostServices[Any]) -> None:
        if host.session_persistence is None:  # every plugin is configured by now
            warnings.warn("audit log: the host has no persistence backend", stacklevel=2)


class ChunkCounter:
    """Counts the chunks every model response streams, per session."""

    name = "example-chunk-counter"

    def __init__(self) -> None:
        self.chunks: Counter[str] = Counter()

    @hookimpl(wrapper=True)
    def llm_stream(
        self, request: ModelRequestLike, host: HostServices[Any]
    ) -> Generator[None, StreamThunk, StreamThunk]:
        downstream = yield  # the thunk of everything inside this wrapper
        session_id = request.session_id or "(no session)"

        async def counted() -> AsyncGenerator[StreamChunk, None]:
            async with aclosing(downstream()) as stream:
                async for chunk in stream:
                    self.chunks[session_id] += 1
                    yield chunk

        return counted


class DryRun:
    """Answers calls to the named tools with an error instead of running them."""

    name = "example-dry-run"

    def __init__(self, tools: set[str]) -> None:
        self.tools = tools

    @hookimpl(wrapper=True)
    def tools_execute(
        self, execution: ToolCallLike[Any], host: HostServices[Any]
    ) -> Generator[None, ToolThunk, ToolThunk]:
        downstream = yield
        if getattr(execution, "name", None) not in self.tools:
            return downstream

        async def refused() -> ToolResult:
            return error_result(f"dry run: {getattr(execution, 'name', '?')} was not called")

        return refused


class StepBudget:
    """Ends a turn as ``blocked`` instead of entering a step beyond the budget."""

    name = "example-step-budget"

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps

    @hookimpl(wrapper=True)
    def agent_pre_step(
        self, step: PreStepLike[Any], host: HostServices[Any]
    ) -> Generator[None, PreStepThunk, PreStepThunk]:
        downstream = yield
        if getattr(step, "step", 1) <= self.max_steps:  # the reference host's PreStep has it
            return downstream

        async def reject() -> PreStepDecision:
            return PreStepDecision("reject", f"step budget of {self.max_steps} spent")

        return reject


class MemoryMirror:
    """A second, in-memory store: queues every event, keeps it once a flush asks for it."""

    name = "example-memory-mirror"

    def __init__(self) -> None:
        self.queued: dict[str, list[SessionEvent]] = {}
        self.kept: dict[str, list[SessionEvent]] = {}

    @hookimpl
    def session_event(self, session: SessionLike, event: SessionEvent) -> None:
        self.queued.setdefault(session.id, []).append(event)  # never block in here

    @hookimpl
    def session_flush(self, session: SessionLike) -> FlushThunk | None:
        if not self.queued.get(session.id):
            return None  # nothing to flush: take no part

        async def keep() -> None:
            batch, self.queued[session.id] = self.queued[session.id], []
            self.kept.setdefault(session.id, []).extend(batch)

        return keep


async def main() -> None:
    lifetime, counter, mirror = HostLifetime(), ChunkCounter(), MemoryMirror()
    with tempfile.TemporaryDirectory() as root:
        plugins = [JsonlSessionPersistence(root), policy, lifetime, counter, mirror, AuditLog()]
        options = {"audit.enabled": True}
        async with Host(plugins, autoload=False, options=options) as host:
            assert lifetime.open_hosts == [host]
            host.llm.register_adapter(PROVIDER, ScriptedModel())
            host.tools.register(make_payment_tool(announce=lambda text: None))
            session = host.sessions.create("hooks")
            await Agent(host, session, provider=PROVIDER, model="demo").run_turn("Pay 1042.")
            await host.sessions.flush(session)
        assert lifetime.open_hosts == []
        assert counter.chunks["hooks"] == 8  # a tool-call block, then a text block, each 3 + finish
        assert mirror.kept["hooks"] == list(session.events)

    async with Host([DryRun({"send_payment"}), StepBudget(max_steps=1)], autoload=False) as host:
        host.llm.register_adapter(PROVIDER, ScriptedModel())
        host.tools.register(make_payment_tool(announce=lambda text: None))
        session = host.sessions.create("guarded")
        outcome = await Agent(host, session, provider=PROVIDER, model="demo").run_turn("Pay.")
    assert outcome.reason == {"kind": "blocked", "reason": "step budget of 1 spent"}
    (result,) = [event for event in session.events if event.type == "tool/result"]
    assert "dry run: send_payment was not called" in result.encode()
    print("every hook example ran")


if __name__ == "__main__":
    anyio.run(main)
