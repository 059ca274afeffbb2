"""A host of another author: its own classes and plugin manager, nothing from the reference host.

It was written from ``docs/writing-a-host.md`` alone. It loads the policy, its companion and
the JSONL backend from their entry points, implements the contract's Protocols structurally
(``mypy --strict`` checks that, below), and runs one turn in which the model asks for one tool
call. ``tests/test_third_party_host.py`` runs the turn; ``tests/test_conformance.py`` runs the
conformance kit against it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import pluggy

from kai_session_checkpoint_policy import hookspecs
from kai_session_checkpoint_policy.cancellation import checkpoint_if_cancelled
from kai_session_checkpoint_policy.contract import (
    BlockEnd,
    Finish,
    PluginHost,
    PreStepDecision,
    SessionPersistenceLike,
    StreamChunk,
    text_block,
    tool_call_block,
)
from kai_session_checkpoint_policy.events import SessionEvent, encode_data
from kai_session_checkpoint_policy.hookspecs import PROJECT, hookimpl
from kai_session_checkpoint_policy.results import TextBlock, ToolResult, error_result

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from kai_session_checkpoint_policy.conformance import HostUnderTest
    from kai_session_checkpoint_policy.hookspecs import (
        FlushThunk,
        PreStepThunk,
        StreamThunk,
        ToolThunk,
    )

# -- values ----------------------------------------------------------------------------------


class Conversation:
    """A session: an append-only log whose appends are announced to the plugins."""

    def __init__(self, session_id: str, announce: Callable[[Conversation, SessionEvent], None]):
        self.id = session_id
        self._events: list[SessionEvent] = []
        self._announce = announce

    @property
    def events(self) -> Sequence[SessionEvent]:
        return tuple(self._events)

    def record(self, event_type: str, data: dict[str, Any]) -> SessionEvent:
        copy, encoded = encode_data(event_type, data)
        event = SessionEvent(event_type, len(self._events), 0, copy, encoded)
        self._events.append(event)
        self._announce(self, event)
        return event


@dataclass(frozen=True)
class Signal:
    aborted: bool = False


@dataclass(frozen=True)
class Worker:
    """An agent, as the plugins see it: the session it works in."""

    session: Conversation


@dataclass(frozen=True)
class Prompt:
    session_id: str | None
    text: str = ""


@dataclass
class Invocation:
    """A tool call on its way to a tool."""

    agent: Worker | None
    name: str
    parent: Invocation | None = None
    signal: Signal = field(default_factory=Signal)


@dataclass(frozen=True)
class NextStep:
    agent: Worker


# -- services --------------------------------------------------------------------------------


class Conversations:
    """The live sessions, and the one way to flush one."""

    def __init__(self, manager: pluggy.PluginManager, host: MiniHost) -> None:
        self._manager = manager
        self._host = host
        self._live: dict[str, Conversation] = {}

    def create(self, session_id: str | None = None) -> Conversation:
        session = Conversation(session_id or uuid.uuid4().hex, self._announce)
        self._live[session.id] = session
        return session

    def get(self, session_id: str) -> Conversation | None:
        return self._live.get(session_id)

    def _announce(self, session: Conversation, event: SessionEvent) -> None:
        self._manager.hook.session_event(session=session, event=event, host=self._host)

    async def flush(self, session: Conversation) -> bool:
        if self._live.get(session.id) is not session:
            raise LookupError(f"session {session.id!r} is not live in this store")
        thunks: list[FlushThunk] = [
            thunk
            for thunk in self._manager.hook.session_flush(session=session, host=self._host)
            if thunk is not None
        ]
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
        await checkpoint_if_cancelled()
        return bool(thunks)


class Registry:
    """Package-owned invariants: one owner per package name."""

    def __init__(self) -> None:
        self._owners: dict[str, object] = {}

    def register(self, package: str, *, owner: object) -> object:
        if package in self._owners:
            raise ValueError(f"{package} is already registered")
        self._owners[package] = owner
        return owner

    def release(self, package: str, *, owner: object) -> bool:
        if self._owners.get(package) is not owner:
            return False
        del self._owners[package]
        return True


class MiniHost:
    """The host: a plugin manager and the services the contract names."""

    def __init__(self, plugins: Sequence[object] = (), *, options: Mapping[str, object] = {}):
        self.manager = pluggy.PluginManager(PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self.options: Mapping[str, object] = dict(options)
        self.sessions = Conversations(self.manager, self)
        self.llm, self.tools = "llm", "tools"  # the policy only checks they are there
        self.invariants = Registry()
        self._persistence: SessionPersistenceLike | None = None
        self._tasks = AsyncExitStack()  # the task group, closed last
        self._cleanups = AsyncExitStack()  # the plugins' cleanups, closed first, shielded
        self._group: TaskGroup | None = None
        self.manager.register(Builtins(), name="mini-host-builtins")
        if not plugins:
            self.manager.load_setuptools_entrypoints(PROJECT)
        for plugin in plugins:
            self.register(plugin)

    @property
    def session_persistence(self) -> SessionPersistenceLike | None:
        return self._persistence

    @property
    def task_group(self) -> TaskGroup:
        assert self._group is not None, "the host is not open"
        return self._group

    def add_cleanup(self, cleanup: Callable[[], Awaitable[object]]) -> None:
        self._cleanups.push_async_callback(cleanup)

    def register(self, plugin: object, name: str | None = None) -> str:
        registered = self.manager.register(plugin, name or getattr(plugin, "name", None))
        assert registered is not None
        return registered

    def unregister(self, plugin: object) -> None:
        self.manager.subset_hook_caller(
            "host_unconfigure", [p for p in self.manager.get_plugins() if p is not plugin]
        )(host=self)
        self.manager.unregister(plugin)

    def provide_session_persistence(self, backend: SessionPersistenceLike) -> None:
        if self._persistence not in (None, backend):
            raise RuntimeError(f"{backend!r} cannot be the persistence: {self._persistence!r} is")
        self._persistence = backend

    def withdraw_session_persistence(self, backend: SessionPersistenceLike) -> None:
        if self._persistence is backend:
            self._persistence = None

    async def __aenter__(self) -> MiniHost:
        self._group = await self._tasks.enter_async_context(anyio.create_task_group())
        self._tasks.callback(self._group.cancel_scope.cancel)  # after the cleanups
        self.manager.hook.host_configure.call_historic(kwargs={"host": self})
        self.manager.hook.host_opened(host=self)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.manager.hook.host_unconfigure(host=self)
        with anyio.CancelScope(shield=True):  # a backend drains its queues here
            await self._cleanups.aclose()
        await self._tasks.aclose()

    async def run_turn(self, session: Conversation, text: str) -> str:
        """One turn: a model request, the tool calls it asks for, then the answer."""
        session.record("turn/start", {"turn": 1})
        answer = ""
        for step in (1, 2):
            decide = self.manager.hook.agent_pre_step(step=NextStep(Worker(session)), host=self)
            await decide()
            session.record("step/start", {"turn": 1, "step": step})
            stream: StreamThunk = self.manager.hook.llm_stream(
                request=Prompt(session.id, text), host=self
            )
            calls: list[dict[str, Any]] = []
            async for chunk in stream():
                session.record(
                    "assistant/chunk", {"turn": 1, "step": step, "chunk": chunk.to_json()}
                )
                if isinstance(chunk, BlockEnd):
                    if chunk.block["type"] == "tool-call":
                        calls.append(dict(chunk.block))
                    else:
                        answer = str(chunk.block["text"])
            for call in calls:
                session.record("tool/call", {"turn": 1, "step": step, "callId": call["id"]})
                run: ToolThunk = self.manager.hook.tools_execute(
                    execution=Invocation(Worker(session), call["name"]), host=self
                )
                result = await run()
                session.record(
                    "tool/result", {"turn": 1, "step": step, "text": result.content[0].text}
                )
            session.record("step/end", {"turn": 1, "step": step})
            if not calls:
                break
        session.record("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        return answer


class Builtins:
    """The host's own innermost implementations: its model, its one tool, its steps."""

    seen: list[str]

    def __init__(self) -> None:
        self.seen = []

    @hookimpl(trylast=True)
    def llm_stream(self, request: Prompt, host: MiniHost) -> StreamThunk:
        async def answer() -> AsyncGenerator[StreamChunk, None]:
            self.seen.append(f"model sees {await durable(host, request.session_id)} durable")
            session = host.sessions.get(request.session_id or "")
            asked = session is not None and any(e.type == "tool/result" for e in session.events)
            chunks = text_block(0, "Paid.") if asked else tool_call_block(0, "call-1", "pay")
            for chunk in chunks:
                yield chunk
            yield Finish("stop" if asked else "tool-calls")

        return answer

    @hookimpl(trylast=True)
    def agent_pre_step(self) -> PreStepThunk:
        async def enter() -> PreStepDecision:
            return PreStepDecision()

        return enter

    @hookimpl(trylast=True)
    def tools_execute(self, execution: Invocation, host: MiniHost) -> ToolThunk:
        async def pay() -> ToolResult:
            if execution.agent is None:
                return error_result("no agent")
            self.seen.append(f"tool sees {await durable(host, execution.agent.session.id)} durable")
            return ToolResult((TextBlock("paid"),))

        return pay


async def durable(host: MiniHost, session_id: str | None) -> str:
    """The type of the last event that reached the disk, as a fresh reader finds it."""
    from kai_session_checkpoint_policy import JsonlSessionPersistence

    root = host.options.get("jsonl.root")
    assert isinstance(root, str)
    assert session_id is not None
    stored = await JsonlSessionPersistence(root).inspect(session_id)
    return stored.events[-1].type


_structural: type[PluginHost[Conversation]] = MiniHost  # mypy checks the host has it all


@asynccontextmanager
async def host_under_test(plugins: Sequence[object]) -> AsyncIterator[HostUnderTest]:
    """The conformance kit's view of this host."""

    class UnderTest:
        def __init__(self, host: MiniHost) -> None:
            self.host = host
            self.plugin_manager = host.manager
            self.unregister = host.unregister

        def live_session(self, session_id: str) -> Conversation:
            return self.host.sessions.create(session_id)

        def model_request(self, session_id: str | None) -> Prompt:
            return Prompt(session_id)

        def tool_call(
            self, session: Any, parent: Any = None
        ) -> tuple[Invocation, Callable[[], None]]:
            call = Invocation(None if session is None else Worker(session), "pay", parent)

            def abort() -> None:
                call.signal = Signal(aborted=True)

            return call, abort

        def pre_step(self, session: Any) -> NextStep:
            return NextStep(Worker(session))

    async with MiniHost(plugins) as host:
        yield UnderTest(host)
