"""A conformance kit: checks that a host of your own keeps the checkpoint policy's promise.

Subclass :class:`HostConformance` in a test module and override the ``kai_host_factory``
fixture with a factory of your host; pytest then runs every check against it, on each event
loop your ``anyio_backend`` fixture names::

    from kai_session_checkpoint_policy.conformance import HostConformance

    class TestMyHost(HostConformance):
        @pytest.fixture
        def kai_host_factory(self) -> HostFactory:
            return my_host_under_test

The factory receives the plugins the kit brings and opens a host with exactly those, as an
async context manager yielding a :class:`HostUnderTest`: the host itself, how to run one turn
of its agent, and the host's own objects for a session, a model request, a tool call and a
step.

**Whole turns** (:func:`check_turn`). The kit opens the host with a real JSONL backend in a
temporary directory, the policy, and a :class:`ScriptedTurn`, and has the host run one turn
with the scripted model and tool: the model asks for two calls of the tool ``pay`` (``c1`` and
``c2``), then answers. At the moment each downstream runs (the model adapter's stream is
pulled, a tool body starts, the ``agent_pre_step`` hook lets a step begin) the kit reads what
the backend holds on disk, as a fresh reader would after a crash at that instant, and checks
the rules of :data:`RULES`: the request's events are durable before the adapter, each call's
``tool/call`` before its body, the previous step's results before the next request, every
announced event at each boundary; and, at the crash point inside each tool body, that recovery
would answer the call ``TOOL_OUTCOME_UNKNOWN``. After the host has closed, the stored log must
hold every event the host announced, with its turn closed. A broken rule raises
:class:`ConformanceError`, whose first line names it.

:func:`check_turn` also runs on its own, with a :data:`TurnFactory`: a host that needs no
more than :class:`TurnHost`. That fits a framework integration, which opens its backend, its
policy and a session for each run itself: its factory takes the :class:`TurnPlugins` by name,
and its ``run_turn`` opens the session in the kit's store, as a user of the integration would.

**The hooks** (the other tests of :class:`HostConformance`). The kit calls the boundary hooks
through the host's plugin manager, with a recording stand-in backend and innermost
implementations that record when they run, and checks what the policy does: requests without
a live session, direct and nested calls are not checkpointed; a failed checkpoint keeps the
adapter and the body from running; a call aborted, or cancelled, during its checkpoint is not
dispatched; unregistering the policy removes all three wrappers; other wrappers compose around
and inside the policy's.

Without an override, ``kai_host_factory`` opens the package's reference host, which passes.
"""

from __future__ import annotations

from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol, TypeAlias

import anyio
import pytest

from . import eventdata
from .contract import Finish, text_block, tool_call_block
from .hookspecs import hookimpl
from .pytest_plugin import FlushRecorder, Gate
from .results import TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN

if TYPE_CHECKING:
    import os
    from collections.abc import (
        AsyncGenerator,
        AsyncIterator,
        Awaitable,
        Callable,
        Generator,
        Sequence,
    )
    from contextlib import AbstractAsyncContextManager
    from pathlib import Path
    from types import ModuleType

    import pluggy

    from .contract import (
        HostServices,
        ModelRequestLike,
        PreStepDecision,
        PreStepLike,
        SessionLike,
        StreamChunk,
        ToolCallLike,
    )
    from .events import SessionEvent
    from .hookspecs import PreStepThunk, StreamThunk, ToolThunk
    from .persistence import JsonlSessionPersistence, StoredLog
    from .results import ToolResult

__all__ = [
    "RULES",
    "Boundaries",
    "ConformanceError",
    "HostConformance",
    "HostFactory",
    "HostUnderTest",
    "ScriptedTurn",
    "TurnFactory",
    "TurnHost",
    "TurnPlugins",
    "Violation",
    "check_turn",
]


class TurnHost(Protocol):
    """What :func:`check_turn` needs of an open host: how to run one turn of its agent."""

    async def run_turn(self, session_id: str, prompt: str, script: ScriptedTurn) -> object:
        """Run one turn of the host's agent in the session *session_id*.

        The user says *prompt*. The model is ``script.stream()``: each call returns the chunks
        of one response. The one tool is named ``script.tool_name``; its body is ``await
        script.run_tool(call_id)``, whose text is the call's result. Both are reached the way
        the host reaches its own, through the ``llm_stream`` and ``tools_execute`` hooks.
        What the turn returns is not checked; an exception it raises is a broken rule.

        A host with ``live_session`` (a :class:`HostUnderTest`) runs the turn in the live
        session the kit created with it. A host that opens a session for each run itself (a
        framework integration) has no ``live_session``: the turn opens the new session
        *session_id* in the kit's store, with the plugins of :class:`TurnPlugins`.
        """
        ...


class HostUnderTest(TurnHost, Protocol):
    """An open host, and how the kit runs a turn and gets the host's own objects."""

    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        """The host's plugin manager, with the ``kai`` hookspecs."""
        ...

    @property
    def host(self) -> HostServices[Any]:
        """What the host passes to every hook as ``host``."""
        ...

    def live_session(self, session_id: str) -> SessionLike:
        """A new live session of the host."""
        ...

    def model_request(self, session_id: str | None) -> ModelRequestLike:
        """A model request of the host for the session *session_id* (or for none)."""
        ...

    def tool_call(
        self, session: SessionLike | None, parent: ToolCallLike[Any] | None = None
    ) -> tuple[ToolCallLike[Any], Callable[[], None]]:
        """A tool call the model made in *session* (``None``: a direct call), and how to abort it.

        *parent*, when given, is the call whose body dispatches this one.
        """
        ...

    def pre_step(self, session: SessionLike) -> PreStepLike[Any]:
        """The next step of an agent of *session*."""
        ...

    def unregister(self, plugin: object) -> None:
        """Unregister *plugin* from the open host."""
        ...


HostFactory: TypeAlias = "Callable[[Sequence[object]], AbstractAsyncContextManager[HostUnderTest]]"
"""Opens a host with exactly the given plugins (besides its own innermost implementations)."""


class TurnPlugins(NamedTuple):
    """The plugins :func:`check_turn` opens the host with, in the order to register them.

    A sequence, which a :data:`HostFactory` registers as it is. A host that opens its own
    backend from a store and registers the policy itself (a framework integration) takes them
    by name instead: it opens its backend on ``backend`` (a JSONL backend whose batch window
    holds every event until a flush asks for it), or in ``backend.root`` with
    ``backend.batch_window`` if it takes a directory only; it registers the policy as it always
    does, which must be ``policy``; and it registers ``script`` as one more plugin.
    """

    backend: JsonlSessionPersistence
    policy: ModuleType
    script: ScriptedTurn


TurnFactory: TypeAlias = "Callable[[TurnPlugins], AbstractAsyncContextManager[TurnHost]]"
"""Opens a host with the plugins of :func:`check_turn`; every :data:`HostFactory` is one."""


# -------------------------------------------------------------------------------------------
# Whole turns
# -------------------------------------------------------------------------------------------

RULES: Final = {
    "announced": "every append is announced with the session_event hook",
    "hooks": "the model and the tool bodies are reached through llm_stream and tools_execute",
    "pre-step": "the agent_pre_step hook decides on every step before the step's model request",
    "durable-log": "at each boundary, every event announced before it is durable",
    "request": "the request's events are durable before the model adapter runs",
    "tool-call": "a call's tool/call is durable before its tool body starts",
    "outcome-unknown": "a crash inside a tool body is recovered as TOOL_OUTCOME_UNKNOWN",
    "step-results": "a step's tool results are durable before the next step's model request",
    "turn": "the turn runs every call once, ends with turn/end, and leaves nothing unwritten",
}
"""The rules :func:`check_turn` checks, by the name a :class:`Violation` gives."""

_PROMPT: Final = "Please pay invoice 1042."
_WINDOW: Final = 3600.0
"""The backend's batch window in the kit: nothing reaches the disk but what a flush asks for."""


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: its name in :data:`RULES`, and what happened."""

    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.message} [{self.rule}: {RULES[self.rule]}]"


class ConformanceError(AssertionError):
    """The host under test broke rules of the contract; the first line names the first one.

    The lines after it list what else the kit found, by rule name, the first
    :attr:`SHOWN` of them.
    """

    SHOWN: Final = 8

    def __init__(self, violations: Sequence[Violation]) -> None:
        self.violations: Final = tuple(violations)
        first, *others = self.violations
        lines = [str(first)]
        lines += [f"then: {other.message} [{other.rule}]" for other in others[: self.SHOWN]]
        if len(others) > self.SHOWN:
            lines.append(f"and {len(others) - self.SHOWN} more")
        super().__init__("\n".join(lines))

    @property
    def rules(self) -> tuple[str, ...]:
        """The names of the broken rules, in the order they were found, each once."""
        return tuple(dict.fromkeys(violation.rule for violation in self.violations))


class ScriptedTurn:
    """The model and the tool of the turn the kit drives, and the checks it makes meanwhile.

    Register it as a plugin of the host: it listens to ``session_event`` and ``session_flush``
    (it flushes nothing) and wraps the three boundary hooks innermost (``trylast``), to see
    that they lead to the model, the tool bodies and the steps. The host wires
    :meth:`stream` as its model and :meth:`run_tool` as the body of the tool
    :attr:`tool_name`.

    *read* returns what the backend holds of the session, as a fresh reader finds it (``None``
    when it holds nothing); the kit calls it at each boundary.
    """

    name: Final = "kai-conformance-turn"
    tool_name: Final = "pay"
    """The one tool the model calls."""
    calls: Final = ("c1", "c2")
    """The ids of the calls the model asks for, both in its first response."""
    answer: Final = "Invoice 1042 is paid."
    """The text of the model's last response."""

    def __init__(self, session_id: str, read: Callable[[], Awaitable[StoredLog | None]]) -> None:
        self.session_id: Final = session_id
        self._read = read
        self.violations: list[Violation] = []
        self.announced: list[SessionEvent] = []
        """The events the host announced for the session, in order."""
        self._flush_marks: list[int] = []  # how many events were announced at each flush
        self.requests = 0
        self.steps = 0
        self.bodies: list[str] = []
        """The ids of the calls whose body started, in order."""
        self._hook_runs = {"llm_stream": 0, "tools_execute": 0}

    # -- what the host wires ------------------------------------------------------------------

    async def stream(self) -> AsyncGenerator[StreamChunk, None]:
        """The model: the chunks of the next response (checks first, at the first pull)."""
        self.requests += 1
        request = self.requests
        await self._at_request(request)
        if request == 1:
            chunks: tuple[StreamChunk, ...] = (
                *tool_call_block(0, self.calls[0], self.tool_name, '{"invoice":1042}'),
                *tool_call_block(1, self.calls[1], self.tool_name, '{"invoice":1043}'),
                Finish("tool-calls"),
            )
        else:
            chunks = (*text_block(0, self.answer), Finish("stop"))
        for chunk in chunks:
            yield chunk

    async def run_tool(self, call_id: str) -> str:
        """The body of the tool: checks what is durable as it starts, then "pays"."""
        self.bodies.append(call_id)
        await self._at_body(call_id)
        return f"paid ({call_id})"

    # -- hooks ----------------------------------------------------------------------------------

    @hookimpl
    def session_event(self, session: SessionLike, event: SessionEvent) -> None:
        if session.id == self.session_id:
            self.announced.append(event)

    @hookimpl
    def session_flush(self, session: SessionLike) -> None:
        if session.id == self.session_id:
            self._flush_marks.append(len(self.announced))

    @hookimpl(wrapper=True, trylast=True)
    def agent_pre_step(self, step: PreStepLike[Any]) -> Generator[None, PreStepThunk, PreStepThunk]:
        downstream = yield
        if step.agent.session.id != self.session_id:
            return downstream

        async def decide() -> PreStepDecision:
            self.steps += 1
            await self._at_step(self.steps)
            return await downstream()

        return decide

    @hookimpl(wrapper=True, trylast=True)
    def llm_stream(self, request: ModelRequestLike) -> Generator[None, StreamThunk, StreamThunk]:
        downstream = yield
        if request.session_id != self.session_id:
            self._broken(
                "hooks",
                f"a model request reached llm_stream with session_id {request.session_id!r}, "
                f"not {self.session_id!r}: the policy checkpoints a request only for the live "
                "session it names",
            )

        def stream() -> AsyncGenerator[StreamChunk, None]:
            self._hook_runs["llm_stream"] += 1
            return downstream()

        return stream

    @hookimpl(wrapper=True, trylast=True)
    def tools_execute(self, execution: ToolCallLike[Any]) -> Generator[None, ToolThunk, ToolThunk]:
        downstream = yield
        if execution.agent is None or execution.parent is not None:
            self._broken(
                "hooks",
                "a call the model asked for reached tools_execute "
                + ("without its agent" if execution.agent is None else "with a parent")
                + ": the policy checkpoints only a call of an agent, with no parent call",
            )

        async def execute() -> ToolResult:
            self._hook_runs["tools_execute"] += 1
            return await downstream()

        return execute

    # -- the checks -----------------------------------------------------------------------------

    def _broken(self, rule: str, message: str) -> None:
        self.violations.append(Violation(rule, message))

    async def _at_step(self, step: int) -> None:
        moment = f"the agent_pre_step hook let step {step} begin"
        before = len(self.announced)  # what a concurrent task announces meanwhile is not due
        stored = await self._read()
        if step > 1:
            self._results_durable(stored, moment)
        self._log_durable(stored, moment, before)

    async def _at_request(self, request: int) -> None:
        moment = f"the model adapter's stream was pulled (model request {request})"
        if self._hook_runs["llm_stream"] < request:
            self._broken(
                "hooks",
                f"model request {request} reached the model without the llm_stream hook: the "
                "host must call the thunk the hook returns, so that the policy's wrapper runs",
            )
        if self.steps < request:
            self._broken(
                "pre-step",
                f"model request {request} was sent without the agent_pre_step hook deciding on "
                f"its step first (the hook ran {self.steps} times): call it before every step",
            )
        if not self.announced:
            self._broken(
                "announced",
                f"the host announced no event of session {self.session_id!r} with the "
                f"session_event hook before {moment}: a backend writes only the appends it "
                "hears of",
            )
        before = len(self.announced)  # what a concurrent task announces meanwhile is not due
        stored = await self._read()
        if request == 1:
            if not _find(stored, self._is_prompt):
                self._broken(
                    "request",
                    f"the user/message of the turn was not durable when {moment}: "
                    f"{self._why(self._is_prompt, 'the model request')}",
                )
        else:
            self._results_durable(stored, moment)
        self._log_durable(stored, moment, before)

    async def _at_body(self, call_id: str) -> None:
        moment = f"the tool body of call {call_id!r} started"
        if self._hook_runs["tools_execute"] < len(self.bodies):
            self._broken(
                "hooks",
                f"the tool body of call {call_id!r} ran without the tools_execute hook: the host "
                "must call the thunk the hook returns, so that the policy's wrapper runs",
            )
        if call_id not in self.calls:
            self._broken("turn", f"a tool body ran for call {call_id!r}, which nobody asked for")
        elif self.bodies.count(call_id) > 1:
            self._broken("turn", f"the tool body of call {call_id!r} ran twice")
        before = len(self.announced)  # what a concurrent task announces meanwhile is not due
        stored = await self._read()

        def is_call(event: SessionEvent) -> bool:
            return event.type == "tool/call" and event.data.get("callId") == call_id

        if not _find(stored, is_call):
            self._broken(
                "tool-call",
                f"the tool/call of call {call_id!r} was not durable when the tool body started: "
                f"{self._why(is_call, 'tools_execute')}",
            )
        answer = _recovered_answer(stored, call_id)
        if answer != TOOL_OUTCOME_UNKNOWN:
            self._broken(
                "outcome-unknown",
                f"a crash while the tool body of call {call_id!r} runs would be recovered as "
                f"{answer}, not TOOL_OUTCOME_UNKNOWN: recovery needs, durable, the turn's "
                "turn/start, the assistant/message that asks for the call and the call's "
                "tool/call, in the shapes eventdata builds",
            )
        self._log_durable(stored, moment, before)

    def _results_durable(self, stored: StoredLog | None, moment: str) -> None:
        for call_id in dict.fromkeys(self.bodies):
            answers = _answering(call_id)
            if not _find(stored, answers):
                self._broken(
                    "step-results",
                    f"the tool/result of call {call_id!r} was not durable when {moment}: "
                    f"{self._why(answers, 'the next step')}",
                )

    def _log_durable(self, stored: StoredLog | None, moment: str, before: int) -> None:
        """Whether the first *before* events announced are among those *stored*."""
        held = 0 if stored is None else len(stored.events)
        missing = [event for event in self.announced[:before] if event.seq >= held]
        if missing:
            first = missing[0]
            types = ", ".join(dict.fromkeys(event.type for event in missing))
            self._broken(
                "durable-log",
                f"the session log was not durable when {moment}: the backend held {held} "
                f"events, and seqs {first.seq}-{missing[-1].seq} ({types}) announced before "
                f"were not among them: {self._why(lambda event: event is first, moment)}",
            )

    def _is_prompt(self, event: SessionEvent) -> bool:
        if event.type != "user/message":
            return False
        content = eventdata.message_of(event.type, event.data).get("content")
        return any(_PROMPT in text for text in eventdata.texts_of(content))

    def _why(self, matches: Callable[[SessionEvent], bool], before: str) -> str:
        """Why an event that *matches* is not durable, as far as the kit can tell."""
        if not self.announced:
            return "the host announced no event of the session with the session_event hook"
        index = next((i for i, event in enumerate(self.announced) if matches(event)), None)
        if index is None:
            return (
                "it had not been appended (or not announced with session_event) by then; "
                f"the host must append it, and announce the append, before {before}"
            )
        seq = self.announced[index].seq
        if not any(mark > index for mark in self._flush_marks):
            return (
                f"it was announced (seq {seq}), but the session_flush hook was not called for "
                "the session after that: the policy's checkpoint calls host.sessions.flush, "
                "which must call every session_flush implementation and wait for them"
            )
        return f"it was announced (seq {seq}) and flushed, but the backend does not hold it"

    def after_close(self, stored: StoredLog | None, error: Exception | None) -> None:
        """The checks once the turn is over and the host closed (the backend drained)."""
        if error is not None:
            self._broken("turn", f"the turn raised {type(error).__name__}: {error}")
        if self.requests < 2:
            self._broken(
                "turn",
                f"the turn sent {self.requests} model requests; the model asks for two calls "
                "and answers only once it has their results, so 2 were expected",
            )
        for call_id in self.calls:
            if call_id not in self.bodies:
                self._broken("turn", f"the tool body of call {call_id!r} never ran")
        held = 0 if stored is None else len(stored.events)
        if held < len(self.announced):
            self._broken(
                "turn",
                f"after the host closed, the backend held {held} of the {len(self.announced)} "
                "events announced: a host's close must let its plugins drain (host_unconfigure, "
                "then their cleanups)",
            )
        elif stored is not None and stored.repair:
            closers = ", ".join(event.type for event in stored.repair)
            self._broken(
                "turn",
                f"after the host closed, the stored turn was still open: recovery would add "
                f"{closers}; a turn ends with turn/end",
            )

    def raise_if_broken(self) -> None:
        """:raises ConformanceError: naming every rule broken so far, the first one first."""
        if self.violations:
            raise ConformanceError(self.violations)


def _find(stored: StoredLog | None, matches: Callable[[SessionEvent], bool]) -> bool:
    return stored is not None and any(matches(event) for event in stored.events)


def _answering(call_id: str) -> Callable[[SessionEvent], bool]:
    """Whether an event is the ``tool/result`` of *call_id*."""

    def answers(event: SessionEvent) -> bool:
        return event.type == "tool/result" and eventdata.result_call_id(event.data) == call_id

    return answers


def _recovered_answer(stored: StoredLog | None, call_id: str) -> str:
    """What recovery would tell the model of *call_id*, were the process to die now."""
    for event in () if stored is None else stored.repair:
        if _answering(call_id)(event):
            error = eventdata.error_of(event.data)
            code = "an error result without a code" if error is None else error["code"]
            return _MEANING.get(code, code)
    if _find(stored, _answering(call_id)):
        return "the result the log already holds"
    return "nothing (the call would vanish from the model's context)"


_MEANING: Final = {
    TOOL_NOT_STARTED: f"{TOOL_NOT_STARTED} (the model would be told it had no effect and may "
    "be retried)",
}


async def _read(root: str | os.PathLike[str], session_id: str) -> StoredLog | None:
    from .persistence import JsonlSessionPersistence, SessionNotFoundError

    try:
        return await JsonlSessionPersistence(root).inspect(session_id)
    except SessionNotFoundError:
        return None


async def check_turn(
    factory: TurnFactory, root: str | os.PathLike[str], *, session_id: str = "conformance"
) -> ScriptedTurn:
    """Run one scripted turn through the host *factory* opens, and check it (see the module).

    The host is opened with the :class:`TurnPlugins`: a JSONL backend under *root* (a
    directory of its own), the policy and the :class:`ScriptedTurn`. The turn runs in a new
    session *session_id*: a live session the kit creates first if the host has
    ``live_session``, else one the turn opens (see :meth:`TurnHost.run_turn`).

    :return: The scripted turn, with what it saw.
    :raises ConformanceError: if the host broke a rule, naming it.
    """
    from . import policy
    from .persistence import JsonlSessionPersistence

    backend = JsonlSessionPersistence(root, batch_window=_WINDOW)
    script = ScriptedTurn(session_id, partial(_read, root, session_id))
    error: Exception | None = None
    async with factory(TurnPlugins(backend, policy, script)) as under_test:
        live_session = getattr(under_test, "live_session", None)
        if live_session is not None:
            live_session(session_id)
        try:
            await under_test.run_turn(session_id, _PROMPT, script)
        except Exception as exc:
            error = exc
    script.after_close(await _read(root, session_id), error)
    if error is not None and script.violations:
        raise ConformanceError(script.violations) from error
    script.raise_if_broken()
    return script


# -------------------------------------------------------------------------------------------
# The hooks
# -------------------------------------------------------------------------------------------


class Boundaries:
    """The innermost implementations of the three boundaries: each records when it runs."""

    name = "kai-conformance-boundaries"

    def __init__(self, order: list[str]) -> None:
        self.order = order

    @hookimpl
    def llm_stream(self) -> StreamThunk:
        return self._stream

    async def _stream(self) -> AsyncGenerator[StreamChunk, None]:
        from .contract import Finish

        self.order.append("adapter")
        yield Finish("stop")

    @hookimpl
    def tools_execute(self) -> ToolThunk:
        return self._tool

    async def _tool(self) -> ToolResult:
        from .results import TextBlock, ToolResult

        self.order.append("tool body")
        return ToolResult((TextBlock("done"),))

    @hookimpl
    def agent_pre_step(self) -> PreStepThunk:
        return self._enter

    async def _enter(self) -> PreStepDecision:
        from .contract import PreStepDecision

        self.order.append("step")
        return PreStepDecision()


class _Recording:
    """Records *label* when one of its wrappers' thunks starts."""

    def __init__(self, label: str, order: list[str]) -> None:
        self.name = f"kai-conformance-{label}"
        self.label = label
        self.order = order

    def _wrap_stream(self, downstream: StreamThunk) -> StreamThunk:
        async def stream() -> AsyncGenerator[StreamChunk, None]:
            self.order.append(self.label)
            async for chunk in downstream():
                yield chunk

        return stream

    def _wrap(self, downstream: Callable[[], Any]) -> Callable[[], Any]:
        async def run() -> Any:
            self.order.append(self.label)
            return await downstream()

        return run


class _Outer(_Recording):
    """Wrappers that run before the policy's (``tryfirst``)."""

    @hookimpl(wrapper=True, tryfirst=True)
    def llm_stream(self) -> Generator[None, StreamThunk, StreamThunk]:
        return self._wrap_stream((yield))

    @hookimpl(wrapper=True, tryfirst=True)
    def tools_execute(self) -> Generator[None, ToolThunk, ToolThunk]:
        return self._wrap((yield))


class _Inner(_Recording):
    """Wrappers that run inside the policy's (``trylast``)."""

    @hookimpl(wrapper=True, trylast=True)
    def llm_stream(self) -> Generator[None, StreamThunk, StreamThunk]:
        return self._wrap_stream((yield))

    @hookimpl(wrapper=True, trylast=True)
    def tools_execute(self) -> Generator[None, ToolThunk, ToolThunk]:
        return self._wrap((yield))


@asynccontextmanager
async def reference_host(plugins: Sequence[object]) -> AsyncIterator[HostUnderTest]:
    """A :data:`HostFactory` for this package's reference host."""
    from .host import AbortController, Agent, Host, PreStep, Tool, ToolExecution

    async with Host(plugins, autoload=False) as host:

        class Reference:
            plugin_manager = host.pm
            unregister = staticmethod(host.unregister)

            def __init__(self) -> None:
                self.host = host

            def live_session(self, session_id: str) -> SessionLike:
                return host.sessions.create(session_id)

            async def run_turn(self, session_id: str, prompt: str, script: ScriptedTurn) -> object:
                host.llm.register_adapter("conformance", lambda request: script.stream())
                tool = Tool(script.tool_name, lambda execution: script.run_tool(execution.call_id))
                host.tools.register(tool)
                live = host.sessions.get(session_id)
                assert live is not None, f"session {session_id!r} is not live"
                agent = Agent(host, live, provider="conformance", model="model")
                return await agent.run_turn(prompt)

            def model_request(self, session_id: str | None) -> ModelRequestLike:
                from .contract import LlmRequest

                return LlmRequest("conformance", "model", session_id=session_id)

            def tool_call(
                self, session: SessionLike | None, parent: ToolCallLike[Any] | None = None
            ) -> tuple[ToolCallLike[Any], Callable[[], None]]:
                controller = AbortController()
                agent = None if session is None else self._agent(session)
                outer = parent if isinstance(parent, ToolExecution) else None
                execution = ToolExecution("call", "tool", {}, controller.signal, agent, outer)
                return execution, controller.abort

            def pre_step(self, session: SessionLike) -> PreStepLike[Any]:
                return PreStep(self._agent(session), 1, 1, AbortController().signal)

            def _agent(self, session: SessionLike) -> Agent:
                live = host.sessions.get(session.id)
                assert live is not None, f"session {session.id!r} is not live"
                return Agent(host, live, provider="conformance", model="model")

        yield Reference()


class HostConformance:
    """The policy's specification, run against the host of the ``kai_host_factory`` fixture."""

    CHECKPOINT = ("flush:start", "flush:end")

    @pytest.fixture
    def kai_host_factory(self) -> Any:
        """Override with a factory of your host (see :data:`HostFactory`)."""
        return reference_host

    @pytest.fixture
    def kai_conformance_order(self) -> list[str]:
        return []

    # -- whole turns -------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_a_turn_is_durable_at_every_boundary(
        self, anyio_backend: object, kai_host_factory: Any, tmp_path: Path
    ) -> None:
        script = await check_turn(kai_host_factory, tmp_path / "sessions")
        assert script.bodies == list(script.calls)

    @pytest.fixture
    def kai_conformance_recorder(self, kai_conformance_order: list[str]) -> FlushRecorder:
        return FlushRecorder(kai_conformance_order)

    @pytest.fixture
    async def kai_conformance_host(
        self,
        anyio_backend: object,
        kai_host_factory: Any,
        kai_conformance_order: list[str],
        kai_conformance_recorder: FlushRecorder,
    ) -> AsyncIterator[HostUnderTest]:
        from . import policy

        plugins = [kai_conformance_recorder.plugin, policy, Boundaries(kai_conformance_order)]
        async with kai_host_factory(plugins) as under_test:
            yield under_test

    # -- the request boundary ----------------------------------------------------------------

    @pytest.mark.anyio
    async def test_the_request_is_durable_before_the_adapter_runs(
        self, kai_conformance_host: HostUnderTest, kai_conformance_order: list[str]
    ) -> None:
        under_test = kai_conformance_host
        under_test.live_session("conformance")
        await _drain(under_test, under_test.model_request("conformance"))
        assert kai_conformance_order == [*self.CHECKPOINT, "adapter"]

    @pytest.mark.anyio
    async def test_a_request_without_a_live_session_is_not_checkpointed(
        self, kai_conformance_host: HostUnderTest, kai_conformance_order: list[str]
    ) -> None:
        await _drain(kai_conformance_host, kai_conformance_host.model_request(None))
        await _drain(kai_conformance_host, kai_conformance_host.model_request("not-live"))
        assert kai_conformance_order == ["adapter", "adapter"]

    @pytest.mark.anyio
    async def test_a_failed_request_checkpoint_keeps_the_adapter_from_running(
        self,
        kai_conformance_host: HostUnderTest,
        kai_conformance_order: list[str],
        kai_conformance_recorder: FlushRecorder,
    ) -> None:
        kai_conformance_host.live_session("conformance")
        kai_conformance_recorder.fail_with(OSError(28, "No space left on device"))
        request = kai_conformance_host.model_request("conformance")
        with pytest.raises(OSError, match="No space left on device"):
            await _drain(kai_conformance_host, request)
        assert kai_conformance_order == ["flush:start", "flush:failed"]

    # -- the tool boundary -------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_the_tool_call_is_durable_before_the_body_runs(
        self, kai_conformance_host: HostUnderTest, kai_conformance_order: list[str]
    ) -> None:
        session = kai_conformance_host.live_session("conformance")
        call, _abort = kai_conformance_host.tool_call(session)
        await _execute(kai_conformance_host, call)
        assert kai_conformance_order == [*self.CHECKPOINT, "tool body"]

    @pytest.mark.anyio
    async def test_direct_and_nested_calls_are_not_checkpointed(
        self, kai_conformance_host: HostUnderTest, kai_conformance_order: list[str]
    ) -> None:
        session = kai_conformance_host.live_session("conformance")
        direct, _abort = kai_conformance_host.tool_call(None)
        await _execute(kai_conformance_host, direct)
        outer, _abort = kai_conformance_host.tool_call(session)
        nested, _abort = kai_conformance_host.tool_call(session, parent=outer)
        await _execute(kai_conformance_host, nested)
        assert kai_conformance_order == ["tool body", "tool body"]

    @pytest.mark.anyio
    async def test_a_call_aborted_during_its_checkpoint_is_not_dispatched(
        self,
        kai_conformance_host: HostUnderTest,
        kai_conformance_order: list[str],
        kai_conformance_recorder: FlushRecorder,
    ) -> None:
        from .results import ABORTED_BEFORE_DISPATCH

        session = kai_conformance_host.live_session("conformance")
        call, abort = kai_conformance_host.tool_call(session)
        gate = kai_conformance_recorder.hold()
        async with anyio.create_task_group() as group:
            outcome: list[ToolResult] = []
            group.start_soon(_collect, outcome, partial(_execute, kai_conformance_host, call))
            await anyio.wait_all_tasks_blocked()
            abort()
            gate.release()
        (result,) = outcome
        assert result.error is not None
        assert result.error.info is not None
        assert result.error.info.code == ABORTED_BEFORE_DISPATCH
        assert kai_conformance_order == list(self.CHECKPOINT)

    @pytest.mark.anyio
    async def test_a_call_cancelled_during_its_checkpoint_is_not_dispatched(
        self,
        kai_conformance_host: HostUnderTest,
        kai_conformance_order: list[str],
        kai_conformance_recorder: FlushRecorder,
    ) -> None:
        session = kai_conformance_host.live_session("conformance")
        call, _abort = kai_conformance_host.tool_call(session)
        gate: Gate = kai_conformance_recorder.hold()
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(_execute, kai_conformance_host, call)
                await anyio.wait_all_tasks_blocked()
                scope.cancel()
                gate.release()
        assert scope.cancelled_caught
        assert "tool body" not in kai_conformance_order

    @pytest.mark.anyio
    async def test_a_failed_tool_checkpoint_keeps_the_body_from_running(
        self,
        kai_conformance_host: HostUnderTest,
        kai_conformance_order: list[str],
        kai_conformance_recorder: FlushRecorder,
    ) -> None:
        session = kai_conformance_host.live_session("conformance")
        call, _abort = kai_conformance_host.tool_call(session)
        kai_conformance_recorder.fail_with(OSError(5, "Input/output error"))
        with pytest.raises(OSError, match="Input/output error"):
            await _execute(kai_conformance_host, call)
        assert kai_conformance_order == ["flush:start", "flush:failed"]

    # -- the step boundary -------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_the_previous_step_is_durable_before_the_next_starts(
        self,
        kai_conformance_host: HostUnderTest,
        kai_conformance_order: list[str],
        kai_conformance_recorder: FlushRecorder,
    ) -> None:
        session = kai_conformance_host.live_session("conformance")
        await _pre_step(kai_conformance_host, kai_conformance_host.pre_step(session))
        kai_conformance_recorder.fail_with(OSError(5, "Input/output error"))
        with pytest.raises(OSError, match="Input/output error"):
            await _pre_step(kai_conformance_host, kai_conformance_host.pre_step(session))
        assert kai_conformance_order == [*self.CHECKPOINT, "step", "flush:start", "flush:failed"]

    # -- plugins -----------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_unregistering_the_policy_removes_all_three_checkpoints(
        self, kai_conformance_host: HostUnderTest, kai_conformance_order: list[str]
    ) -> None:
        from . import policy

        under_test = kai_conformance_host
        session = under_test.live_session("conformance")
        under_test.unregister(policy)
        await _drain(under_test, under_test.model_request("conformance"))
        call, _abort = under_test.tool_call(session)
        await _execute(under_test, call)
        await _pre_step(under_test, under_test.pre_step(session))
        assert kai_conformance_order == ["adapter", "tool body", "step"]

    @pytest.mark.anyio
    async def test_other_wrappers_compose_around_and_inside_the_checkpoint(
        self, kai_conformance_host: HostUnderTest, kai_conformance_order: list[str]
    ) -> None:
        under_test = kai_conformance_host
        manager = under_test.plugin_manager
        outer, inner = (
            _Outer("outer", kai_conformance_order),
            _Inner("inner", kai_conformance_order),
        )
        for wrapper in (outer, inner):
            manager.register(wrapper, name=wrapper.name)
        session = under_test.live_session("conformance")
        try:
            await _drain(under_test, under_test.model_request("conformance"))
            call, _abort = under_test.tool_call(session)
            await _execute(under_test, call)
        finally:
            for wrapper in (outer, inner):
                with suppress(ValueError):
                    manager.unregister(wrapper)
        each = ["outer", *self.CHECKPOINT, "inner"]
        assert kai_conformance_order == [*each, "adapter", *each, "tool body"]


async def _drain(under_test: HostUnderTest, request: ModelRequestLike) -> None:
    thunk = under_test.plugin_manager.hook.llm_stream(request=request, host=under_test.host)
    async for _chunk in thunk():
        pass


async def _execute(under_test: HostUnderTest, call: ToolCallLike[Any]) -> ToolResult:
    thunk = under_test.plugin_manager.hook.tools_execute(execution=call, host=under_test.host)
    result: ToolResult = await thunk()
    return result


async def _pre_step(under_test: HostUnderTest, step: PreStepLike[Any]) -> PreStepDecision:
    thunk = under_test.plugin_manager.hook.agent_pre_step(step=step, host=under_test.host)
    decision: PreStepDecision = await thunk()
    return decision


async def _collect(outcome: list[ToolResult], run: Callable[[], Any]) -> None:
    outcome.append(await run())
