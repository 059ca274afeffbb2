"""A host of another author: its own classes and plugin manager, nothing from the reference host.

It was written from ``docs/writing-a-host.md`` alone, and follows its recipes: it loads the
policy, its companion and the JSONL backend from their entry points, implements the contract's
Protocols structurally (``mypy --strict`` checks that, below), calls the hooks that take one
implementation at a time on their own, builds its events with ``eventdata`` in the shapes
recovery reads, and seeds a resumed session with the log its backend recovered.
``tests/test_third_party_host.py`` runs its turns; ``tests/test_conformance.py`` runs the
conformance kit against it, and ``tests/test_conformance_broken.py`` against broken variants.
"""

from __future__ import annotations

import logging
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

import anyio
import pluggy

from kai_session_checkpoint_policy import eventdata, hookspecs
from kai_session_checkpoint_policy.cancellation import checkpoint_if_cancelled
from kai_session_checkpoint_policy.contract import (
    BlockEnd,
    Finish,
    PersistenceLike,
    PluginHost,
    PreStepDecision,
    SessionPersistenceLike,
    StreamChunk,
    text_block,
    tool_call_block,
)
from kai_session_checkpoint_policy.events import (
    JSON,
    SURFACE_EVENT_TYPES,
    JSONObject,
    SessionEvent,
    SurfaceOp,
    encode_data,
)
from kai_session_checkpoint_policy.hookspecs import PROJECT, hookimpl
from kai_session_checkpoint_policy.results import TextBlock, ToolResult, error_result

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from kai_session_checkpoint_policy.conformance import HostFactory, ScriptedTurn
    from kai_session_checkpoint_policy.hookspecs import (
        FlushThunk,
        PreStepThunk,
        StreamThunk,
        ToolThunk,
    )

logger = logging.getLogger(__name__)

# -- values ----------------------------------------------------------------------------------


class Conversation:
    """A session: an append-only log whose appends are announced to the plugins."""

    def __init__(
        self,
        session_id: str,
        announce: Callable[[Conversation, SessionEvent], None],
        seed: Sequence[SessionEvent] = (),
    ) -> None:
        self.id = session_id
        self._events: list[SessionEvent] = list(seed)  # a resumed log: seqs 0, 1, 2...
        self._announce = announce

    @property
    def events(self) -> Sequence[SessionEvent]:
        return tuple(self._events)

    def record(
        self, event_type: str, data: Mapping[str, Any], sources: Sequence[int] | None = None
    ) -> SessionEvent:
        """Append one event (its data built with ``eventdata``), then announce it."""
        copy, encoded = encode_data(event_type, dict(data))
        surface: SurfaceOp | None = "append" if event_type in SURFACE_EVENT_TYPES else None
        seq, now = len(self._events), time.time_ns() // 1_000_000
        sources = None if sources is None else tuple(sources)
        event = SessionEvent(event_type, seq, now, copy, encoded, surface, sources)
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
    call_id: str
    name: str
    arguments: str = "{}"
    parent: Invocation | None = None
    signal: Signal = field(default_factory=Signal)


@dataclass(frozen=True)
class NextStep:
    agent: Worker


# -- calling hooks one implementation at a time ----------------------------------------------


def each_implementation(
    hook: pluggy.HookCaller, **kwargs: object
) -> Iterator[tuple[str, Callable[[], object]]]:
    """Each implementation of *hook*, in registration order, as a call with *kwargs*.

    An implementation takes the arguments it names, as pluggy passes them; its name is its
    plugin's.
    """
    for impl in hook.get_hookimpls():
        arguments = [kwargs[name] for name in impl.argnames]
        yield impl.plugin_name, partial(impl.function, *arguments)


async def _raise(exc: Exception) -> NoReturn:
    raise exc


# -- services --------------------------------------------------------------------------------


class Conversations:
    """The live sessions, and the one way to flush one."""

    def __init__(self, manager: pluggy.PluginManager, host: MiniHost) -> None:
        self._manager = manager
        self._host = host
        self._live: dict[str, Conversation] = {}

    def create(
        self, session_id: str | None = None, seed: Sequence[SessionEvent] = ()
    ) -> Conversation:
        session = Conversation(session_id or f"mini-{time.time_ns()}", self._announce, seed)
        self._live[session.id] = session
        return session

    def get(self, session_id: str) -> Conversation | None:
        return self._live.get(session_id)

    def _announce(self, session: Conversation, event: SessionEvent) -> None:
        self._tell_each("session_event", session=session, event=event)

    def _tell_each(self, hook_name: str, **kwargs: object) -> None:
        """``session_event``, ``session_detach``: each listener on its own, last registered
        first; one that raises is logged, and the others still hear of it."""
        hook = getattr(self._manager.hook, hook_name)
        listeners = list(each_implementation(hook, host=self._host, **kwargs))
        for plugin, listen in reversed(listeners):
            try:
                listen()
            except Exception:
                logger.exception("%s of plugin %r failed", hook_name, plugin)

    async def close(self, session: Conversation) -> None:
        """Flush *session*, then let it go: the plugins hear of it with ``session_detach``."""
        await self.flush(session)
        del self._live[session.id]
        self._tell_each("session_detach", session=session)

    async def flush(self, session: Conversation) -> bool:
        """``session_flush``: every thunk started at once; the first failure raised."""
        if self._live.get(session.id) is not session:
            raise LookupError(f"session {session.id!r} is not live in this store")
        hook = self._manager.hook.session_flush
        thunks: list[FlushThunk] = []
        for _plugin, build in each_implementation(hook, session=session, host=self._host):
            try:
                thunk: Any = build()
            except Exception as exc:  # that plugin's failure; the others still flush
                thunk = partial(_raise, exc)
            if thunk is not None:
                thunks.append(thunk)
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


class AgentLoop:
    """The agent loop of :class:`MiniHost`: turns of steps, each a model request and the tool
    calls it asks for, every event appended before what it records happens."""

    manager: pluggy.PluginManager

    async def run_turn(self, session: Conversation, text: str) -> str:
        """One turn: model requests, and the tool calls they ask for, until an answer."""
        turn = 1 + sum(event.type == "turn/start" for event in session.events)
        session.record("turn/start", eventdata.turn_start(turn))
        answer, step = "", 0
        while await self.enter_step(session):
            step += 1
            session.record("step/start", eventdata.step_data(turn, step))
            if step == 1:
                session.record("user/message", eventdata.user_message(f"user-{turn}", text))
            content = await self.request(session, turn, step, text)
            calls = [block for block in content if block["type"] == "tool-call"]
            answer = "".join(str(block["text"]) for block in content if block["type"] == "text")
            for call in calls:
                await self.call_tool(session, turn, step, call)
            session.record("step/end", eventdata.step_data(turn, step))
            if not calls:
                break
        session.record("turn/end", eventdata.turn_end(turn, {"kind": "completed"}))
        return answer

    async def enter_step(self, session: Conversation) -> bool:
        decide: PreStepThunk = self.manager.hook.agent_pre_step(
            step=NextStep(Worker(session)), host=self
        )
        return (await decide()).kind == "enter"

    async def request(
        self, session: Conversation, turn: int, step: int, text: str
    ) -> list[JSONObject]:
        """One model request: its chunks recorded as they come, then its message."""
        stream: StreamThunk = self.manager.hook.llm_stream(
            request=Prompt(session.id, text), host=self
        )
        chunks: list[int] = []
        content: list[JSON] = []
        blocks: list[JSONObject] = []
        async for chunk in stream():
            data = eventdata.assistant_chunk(turn, step, chunk.to_json())
            chunks.append(session.record("assistant/chunk", data).seq)
            if isinstance(chunk, BlockEnd):
                content.append(chunk.block)
                blocks.append(chunk.block)
        message = eventdata.assistant_message(turn, step, content, provider="mini", model="m")
        session.record("assistant/message", message, sources=chunks)
        return blocks

    async def call_tool(
        self, session: Conversation, turn: int, step: int, call: JSONObject
    ) -> None:
        """One tool call: its ``tool/call`` recorded before ``tools_execute``, then its result."""
        call_id, name, arguments = str(call["id"]), str(call["name"]), str(call["arguments"])
        started = session.record(
            "tool/call", eventdata.tool_call(turn, step, call_id, name, arguments)
        )
        run: ToolThunk = self.manager.hook.tools_execute(
            execution=Invocation(Worker(session), call_id, name, arguments), host=self
        )
        result = await run()
        session.record(
            "tool/result",
            eventdata.tool_result(turn, step, call_id, result),
            sources=[started.seq],
        )


class MiniHost(AgentLoop):
    """The host: a plugin manager, the services the contract names, and its agent loop."""

    def __init__(self, plugins: Sequence[object] = (), *, options: Mapping[str, object] = {}):
        self.manager = pluggy.PluginManager(PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self.options: Mapping[str, object] = dict(options)
        self.sessions = Conversations(self.manager, self)
        self.llm, self.tools = "llm", "tools"  # the policy only checks they are there
        self.invariants = Registry()
        self.builtins = Builtins()
        self._persistence: PersistenceLike | None = None
        self._tasks = AsyncExitStack()  # the task group, closed last
        self._cleanups = AsyncExitStack()  # the plugins' cleanups, closed first, shielded
        self._group: TaskGroup | None = None
        self.manager.register(self.builtins, name="mini-host-builtins")
        if not plugins:
            self.manager.load_setuptools_entrypoints(PROJECT)
        for plugin in plugins:
            self.register(plugin)

    @property
    def session_persistence(self) -> PersistenceLike | None:
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

    def provide_session_persistence(self, backend: PersistenceLike) -> None:
        if self._persistence not in (None, backend):
            raise RuntimeError(f"{backend!r} cannot be the persistence: {self._persistence!r} is")
        self._persistence = backend

    def withdraw_session_persistence(self, backend: PersistenceLike) -> None:
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


async def resume(host: MiniHost, session_id: str) -> Conversation:
    """The stored session, recovered, live again: its next event continues its seqs."""
    backend = host.session_persistence
    if not isinstance(backend, SessionPersistenceLike):
        raise LookupError(f"no backend that can resume session {session_id!r}")
    stored = await backend.load(session_id)  # the repair is durable once this returns
    return host.sessions.create(session_id, seed=stored.events)


ModelFunction = Callable[[Prompt], AsyncGenerator[StreamChunk, None]]
ToolFunction = Callable[[Invocation], Awaitable[str]]


class Builtins:
    """The host's own innermost implementations: its model, its tools, its steps."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.model: ModelFunction | None = None  # None: the demo model below
        self.tools: dict[str, ToolFunction] = {}  # besides the demo tool "pay"

    @hookimpl(trylast=True)
    def llm_stream(self, request: Prompt, host: MiniHost) -> StreamThunk:
        model = self.model
        if model is not None:
            return partial(model, request)

        async def answer() -> AsyncGenerator[StreamChunk, None]:
            self.seen.append(f"model sees {await durable(host, request.session_id)} durable")
            session = host.sessions.get(request.session_id or "")
            events = () if session is None else session.events
            turn = max(event.seq for event in events if event.type == "turn/start")
            asked = any(event.type == "tool/result" for event in events[turn:])
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
        tool = self.tools.get(execution.name)

        async def run() -> ToolResult:
            if execution.agent is None:
                return error_result("no agent")
            if tool is not None:
                return ToolResult((TextBlock(await tool(execution)),))
            self.seen.append(f"tool sees {await durable(host, execution.agent.session.id)} durable")
            return ToolResult((TextBlock("paid"),))

        return run


async def durable(host: MiniHost, session_id: str | None) -> str:
    """The type of the last event that reached the disk, as a fresh reader finds it."""
    from kai_session_checkpoint_policy import JsonlSessionPersistence

    root = host.options.get("jsonl.root")
    assert isinstance(root, str)
    assert session_id is not None
    stored = await JsonlSessionPersistence(root).inspect(session_id)
    return stored.events[-1].type


_structural: type[PluginHost[Conversation]] = MiniHost  # mypy checks the host has it all


# -- the conformance kit's view of the host ---------------------------------------------------


class UnderTest:
    """What the conformance kit needs of an open :class:`MiniHost`."""

    def __init__(self, host: MiniHost) -> None:
        self.host = host
        self.plugin_manager = host.manager
        self.unregister = host.unregister

    def live_session(self, session_id: str) -> Conversation:
        return self.host.sessions.create(session_id)

    async def run_turn(self, session_id: str, prompt: str, script: ScriptedTurn) -> object:
        self.host.builtins.model = lambda request: script.stream()
        self.host.builtins.tools[script.tool_name] = lambda call: script.run_tool(call.call_id)
        session = self.host.sessions.get(session_id)
        assert session is not None
        return await self.host.run_turn(session, prompt)

    def model_request(self, session_id: str | None) -> Prompt:
        return Prompt(session_id)

    def tool_call(self, session: Any, parent: Any = None) -> tuple[Invocation, Callable[[], None]]:
        agent = None if session is None else Worker(session)
        call = Invocation(agent, "call", "pay", parent=parent)

        def abort() -> None:
            call.signal = Signal(aborted=True)

        return call, abort

    def pre_step(self, session: Any) -> NextStep:
        return NextStep(Worker(session))


def factory_of(host_type: type[MiniHost]) -> HostFactory:
    """A conformance kit factory opening a host of *host_type* with the kit's plugins."""

    @asynccontextmanager
    async def open_host(plugins: Sequence[object]) -> AsyncIterator[UnderTest]:
        async with host_type(plugins) as host:
            yield UnderTest(host)

    return open_host


host_under_test = factory_of(MiniHost)
