"""The OpenAI Agents SDK integration: the SDK's real ``Runner``, a scripted model, real stores.

What the log holds and when it is durable (read by a fresh backend from inside the model and
the tool body), that a failed checkpoint keeps the model or the tool body from running, and a
real child process killed with SIGKILL inside a paying tool, resumed in a new process: the
payment happened once, and the model is told its outcome is unknown. The SDK's own
``SQLiteSession`` is the control: after the same crash, the call is gone and paid again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import anyio
import pytest
from agents import Agent, Runner, set_tracing_disabled
from agents.items import TResponseOutputItem
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

from kai_session_checkpoint_policy import Host, eventdata, hookimpl, policy
from kai_session_checkpoint_policy.effects import idempotency_key
from kai_session_checkpoint_policy.events import JSONObject, SessionEvent
from kai_session_checkpoint_policy.hookspecs import FlushThunk
from kai_session_checkpoint_policy.integrations.openai_agents import (
    PROVIDER,
    AppendOnlyLogError,
    CheckpointError,
    CheckpointSession,
)
from kai_session_checkpoint_policy.persistence import open_store
from kai_session_checkpoint_policy.results import (
    NOT_STARTED_TEXT,
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    TextBlock,
    ToolResult,
    error_result,
    outcome_unknown,
    outcome_unknown_text,
)

from ..support import doc_snippets
from ..support.markers import kill_at_marker, reap
from .openai_agents_child import (
    ARGUMENTS,
    MARKER_TEXT,
    MODEL_NAME,
    PROMPT,
    TOOL_NAME,
    PaymentModel,
    payment_agent,
    payment_tool,
)

CHILD: Final = Path(__file__).with_name("openai_agents_child.py")
DOCS: Final = Path(__file__).resolve().parents[2] / "docs"
EXAMPLE: Final = DOCS / "examples/integration_openai_agents.py"
PAGE: Final = DOCS / "integrations/openai-agents.md"
SESSION: Final = "invoice-1042"
CALL: Final = "call-pay-1"
SIDE_EFFECTING_UNKNOWN: Final = outcome_unknown_text(
    "side-effecting", idempotency_key(SESSION, CALL)
)
"""What the model reads of the payment killed in its body: the child declares it side-effecting."""

TURN_TYPES: Final = [
    "turn/start",
    "step/start",
    "user/message",
    "request/header",
    "request/context",
    *["assistant/chunk"] * 4,
    "assistant/message",
    "tool/call",
    "tool/result",
    "step/end",
    "step/start",
    *["assistant/chunk"] * 4,
    "assistant/message",
    "step/end",
    "turn/end",
]
"""One paying turn, as the reference agent writes it."""

pytestmark = pytest.mark.anyio
set_tracing_disabled(True)  # no run may try to export its traces over the network


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the SDK runs on asyncio only


def types(events: Any) -> list[str]:
    return [event.type for event in events]


def ledger_lines(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


class BreakingStore:
    """A second persistence participant whose flushes fail once an event of a type is appended."""

    name = "breaking-store"

    def __init__(self, break_on: str) -> None:
        self.break_on = break_on
        self.broken = False

    @hookimpl
    def session_event(self, event: SessionEvent) -> None:
        if event.type == self.break_on:
            self.broken = True

    def mend(self) -> None:
        """Flush again from now on."""
        self.broken, self.break_on = False, ""

    @hookimpl
    def session_flush(self) -> FlushThunk | None:
        if not self.broken:
            return None

        async def fail() -> None:
            raise OSError("no space left on device")

        return fail


# -- one turn --------------------------------------------------------------------------------


async def test_a_turn_is_recorded_in_the_original_format(tmp_path: Path) -> None:
    root, ledger = tmp_path / "sessions", tmp_path / "ledger"
    model = PaymentModel()
    async with CheckpointSession(root, SESSION) as session:
        agent = payment_agent(model, payment_tool(ledger))
        result = await Runner.run(agent, PROMPT, session=session, hooks=session.hooks)
        live = list(session.log.events)
    assert result.final_output == "Invoice 1042 is paid."
    assert types(live) == TURN_TYPES
    data = [event.data for event in live]
    assert data[0] == eventdata.turn_start(1)
    assert data[2] == eventdata.user_message("user-1", PROMPT)
    assert data[3] == eventdata.request_header(PROVIDER, MODEL_NAME, [TOOL_NAME], resumed=False)
    assert data[4] == eventdata.request_context(PROVIDER, MODEL_NAME)
    assert [d["chunk"] for d in data[5:9]] == [
        {"type": "block-start", "index": 0, "blockType": "tool-call"},
        {
            "type": "tool-call-delta",
            "index": 0,
            "id": CALL,
            "name": TOOL_NAME,
            "argumentsDelta": ARGUMENTS,
        },
        {
            "type": "block-end",
            "index": 0,
            "block": {"type": "tool-call", "id": CALL, "name": TOOL_NAME, "arguments": ARGUMENTS},
        },
        {"type": "finish", "reason": {"kind": "tool-calls"}},
    ]
    assert data[9] == eventdata.assistant_message(
        1,
        1,
        [{"type": "tool-call", "id": CALL, "name": TOOL_NAME, "arguments": ARGUMENTS}],
        provider=PROVIDER,
        model=MODEL_NAME,
    )
    assert live[9].source_event_seqs == (5, 6, 7, 8)
    key = idempotency_key(SESSION, CALL)  # the tool's class is not declared: the worst case
    assert data[10] == eventdata.tool_call(
        1, 1, CALL, TOOL_NAME, ARGUMENTS, effect="open-world", idempotency_key=key
    )
    paid = ToolResult((TextBlock("paid 120.00 EUR for invoice 1042"),))
    assert data[11] == eventdata.tool_result(1, 1, CALL, paid)
    assert live[11].source_event_seqs == (10,)
    assert data[13] == eventdata.step_data(1, 2)
    assert data[18] == eventdata.assistant_message(
        1,
        2,
        [{"type": "text", "text": "Invoice 1042 is paid."}],
        provider=PROVIDER,
        model=MODEL_NAME,
    )
    assert data[20] == eventdata.turn_end(1, {"kind": "completed"})
    stored = await open_store(root).inspect(SESSION)
    assert list(stored.events) == live  # the whole turn is on disk once the run has saved it
    assert ledger_lines(ledger) == ['{"invoice": "1042", "amount": "120.00"}']


async def test_the_model_and_the_tool_body_run_only_after_their_checkpoints(
    tmp_path: Path,
) -> None:
    """A fresh backend, reading the store from inside the model and the tool body, finds the
    request's events and the call's ``tool/call`` already on disk."""
    root = tmp_path / "sessions"
    seen: list[tuple[str, int, str | None]] = []

    async def durable(where: str) -> None:
        stored = await open_store(root, batch_window=3600).inspect(SESSION)
        last = stored.events[-1]
        seen.append((where, last.seq, last.type))

    async def at_request(items: list[dict[str, Any]]) -> None:
        await durable("model")

    async def at_body() -> None:
        await durable("tool body")

    model = PaymentModel(probe=at_request)
    async with CheckpointSession(root, SESSION, batch_window=3600) as session:
        agent = payment_agent(model, payment_tool(tmp_path / "ledger", probe=at_body))
        await Runner.run(agent, PROMPT, session=session, hooks=session.hooks)
    assert seen == [
        ("model", 4, "request/context"),
        ("tool body", 10, "tool/call"),
        ("model", 13, "step/start"),
    ]


async def test_a_session_resumes_with_its_transcript(tmp_path: Path) -> None:
    root, ledger = tmp_path / "sessions", tmp_path / "ledger"
    async with CheckpointSession(root, SESSION) as session:
        agent = payment_agent(PaymentModel(), payment_tool(ledger))
        await Runner.run(agent, PROMPT, session=session, hooks=session.hooks)
    model = PaymentModel()
    async with CheckpointSession(root, SESSION) as session:
        agent = payment_agent(model, payment_tool(ledger))
        await Runner.run(agent, "Thanks.", session=session, hooks=session.hooks)
        live = list(session.log.events)
    assert model.requests[0] == [
        {"role": "user", "content": PROMPT},
        {"type": "function_call", "call_id": CALL, "name": TOOL_NAME, "arguments": ARGUMENTS},
        {
            "type": "function_call_output",
            "call_id": CALL,
            "output": "paid 120.00 EUR for invoice 1042",
        },
        {"role": "assistant", "content": "Invoice 1042 is paid."},
        {"role": "user", "content": "Thanks."},
    ]
    second = live[len(TURN_TYPES) :]
    assert types(second)[:5] == [
        "turn/start",
        "step/start",
        "user/message",
        "request/header",
        "request/context",
    ]
    assert second[0].data == eventdata.turn_start(2)
    assert second[2].data == eventdata.user_message("user-2", "Thanks.")
    assert second[3].data["reason"] == "resume"
    assert ledger_lines(ledger) == ['{"invoice": "1042", "amount": "120.00"}']


# -- fail-closed -----------------------------------------------------------------------------


async def test_a_failed_checkpoint_before_the_model_keeps_the_model_from_being_called(
    tmp_path: Path,
) -> None:
    model = PaymentModel()
    breaking = BreakingStore("request/context")
    async with CheckpointSession(tmp_path / "sessions", SESSION, plugins=[breaking]) as session:
        agent = payment_agent(model, payment_tool(tmp_path / "ledger"))
        with pytest.raises(CheckpointError) as raised:
            await Runner.run(agent, PROMPT, session=session, hooks=session.hooks)
        live = types(session.log.events)
        breaking.mend()
    assert str(raised.value) == (
        f"session {SESSION!r}: the checkpoint before the model request failed, so the model "
        "was not called: no space left on device"
    )
    assert isinstance(raised.value.__cause__, OSError)
    assert model.requests == []
    assert live[-1] == "request/context"


async def test_a_failed_checkpoint_before_the_tool_keeps_its_body_from_running(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger"
    bodies: list[str] = []

    async def at_body() -> None:
        bodies.append("ran")

    breaking = BreakingStore("assistant/message")  # the model answered: the store breaks
    async with CheckpointSession(tmp_path / "sessions", SESSION, plugins=[breaking]) as session:
        agent = payment_agent(PaymentModel(), payment_tool(ledger, probe=at_body))
        with pytest.raises(CheckpointError) as raised:
            await Runner.run(agent, PROMPT, session=session, hooks=session.hooks)
        events = list(session.log.events)
        breaking.mend()
    assert str(raised.value) == (
        f"session {SESSION!r}: tool call {CALL!r} ({TOOL_NAME}) was not dispatched, its body "
        "did not run: Error: no space left on device"
    )
    assert isinstance(raised.value.__cause__, OSError)
    assert bodies == []
    assert ledger_lines(ledger) == []
    assert types(events)[-2:] == ["tool/call", "tool/result"]
    failed = error_result("no space left on device")
    assert events[-1].data == eventdata.tool_result(1, 1, CALL, failed)
    assert events[-1].source_event_seqs == (events[-2].seq,)


async def test_a_run_left_open_by_an_error_is_closed_when_the_next_run_starts(
    tmp_path: Path,
) -> None:
    """The next run's history holds the failed call with its error result, not a bare call."""
    breaking = BreakingStore("assistant/message")
    model = PaymentModel()
    async with CheckpointSession(tmp_path / "sessions", SESSION, plugins=[breaking]) as session:
        agent = payment_agent(model, payment_tool(tmp_path / "ledger"))
        with pytest.raises(CheckpointError):
            await Runner.run(agent, PROMPT, session=session, hooks=session.hooks)
        breaking.mend()
        result = await Runner.run(agent, "Try again.", session=session, hooks=session.hooks)
        events = list(session.log.events)
    assert result.final_output.startswith("I cannot tell")
    closed = types(events)[12:15]
    assert closed == ["step/end", "turn/end", "turn/start"]
    assert events[13].data == eventdata.turn_end(1, {"kind": "interrupted"})
    assert model.requests[-1][1:3] == [
        {"type": "function_call", "call_id": CALL, "name": TOOL_NAME, "arguments": ARGUMENTS},
        {
            "type": "function_call_output",
            "call_id": CALL,
            "output": "Error: no space left on device",
        },
    ]


async def test_a_run_without_the_hooks_is_refused(tmp_path: Path) -> None:
    async with CheckpointSession(tmp_path / "sessions", SESSION) as session:
        agent = payment_agent(PaymentModel(), payment_tool(tmp_path / "ledger"))
        with pytest.raises(RuntimeError, match=r"hooks=session\.hooks"):
            await Runner.run(agent, PROMPT, session=session)


async def test_hooks_without_the_session_are_refused(tmp_path: Path) -> None:
    model = PaymentModel()
    async with CheckpointSession(tmp_path / "sessions", SESSION) as session:
        agent = payment_agent(model, payment_tool(tmp_path / "ledger"))
        with pytest.raises(CheckpointError, match="a model request of a run that does not use"):
            await Runner.run(agent, PROMPT, hooks=session.hooks)
    assert model.requests == []


async def test_the_log_is_append_only(tmp_path: Path) -> None:
    async with CheckpointSession(tmp_path / "sessions", SESSION) as session:
        with pytest.raises(AppendOnlyLogError, match="cannot be popped"):
            await session.pop_item()
        with pytest.raises(AppendOnlyLogError, match="start a session with a new id instead"):
            await session.clear_session()


async def test_a_closed_session_says_so(tmp_path: Path) -> None:
    session = CheckpointSession(tmp_path / "sessions", SESSION)
    with pytest.raises(RuntimeError, match="is not open: use it inside 'async with'"):
        await session.get_items()


# -- a real crash ----------------------------------------------------------------------------


def child_command(mode: str, store: Path, prompt: str) -> list[str]:
    """The child's command line; it runs in the test's directory, next to its ledger."""
    return [sys.executable, str(CHILD), mode, str(store), SESSION, "ledger", "requests", prompt]


def run_child(tmp_path: Path, mode: str, store: Path, prompt: str) -> str:
    """Run the child to the end; return what it printed."""
    done = subprocess.run(
        child_command(mode, store, prompt),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def crash_child(tmp_path: Path, mode: str, store: Path) -> None:
    """Run the child until its tool has paid, then kill it with SIGKILL there."""
    marker = tmp_path / "marker"
    marker.write_bytes(b"")
    child = subprocess.Popen(
        [*child_command(mode, store, PROMPT), "--marker", str(marker)],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        kill_at_marker(child, marker, MARKER_TEXT)
    finally:
        reap(child)


def requests_made(tmp_path: Path) -> list[list[dict[str, Any]]]:
    lines = (tmp_path / "requests").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.crash
def test_a_payment_killed_mid_tool_is_answered_unknown_and_never_repeated(tmp_path: Path) -> None:
    store = tmp_path / "sessions"
    crash_child(tmp_path, "checkpoint", store)
    assert ledger_lines(tmp_path / "ledger") == ['{"invoice": "1042", "amount": "120.00"}']
    answer = run_child(tmp_path, "checkpoint", store, "Is invoice 1042 paid?")

    assert (
        answer == "I cannot tell whether invoice 1042 was paid; I will check before paying again."
    )
    assert ledger_lines(tmp_path / "ledger") == ['{"invoice": "1042", "amount": "120.00"}']
    first, resumed = requests_made(tmp_path)  # the resumed run asked the model once: no call
    assert first == [{"role": "user", "content": PROMPT}]
    assert resumed == [
        {"role": "user", "content": PROMPT},
        {"type": "function_call", "call_id": CALL, "name": TOOL_NAME, "arguments": ARGUMENTS},
        {
            "type": "function_call_output",
            "call_id": CALL,
            "output": f"{TOOL_OUTCOME_UNKNOWN}: Error: {SIDE_EFFECTING_UNKNOWN}",
        },
        {"role": "user", "content": "Is invoice 1042 paid?"},
    ]
    stored = list(anyio_run_inspect(store))
    assert types(stored)[9:16] == [
        "assistant/message",
        "tool/call",
        "tool/result",
        "step/end",
        "turn/end",
        "turn/start",
        "step/start",
    ]
    repair = stored[11]
    unknown = outcome_unknown("side-effecting", idempotency_key(SESSION, CALL))
    assert repair.data == eventdata.tool_result(
        1, 1, CALL, unknown, message_id=eventdata.interrupted_result_id(CALL, 11)
    )
    assert stored[13].data == eventdata.turn_end(1, {"kind": "interrupted"})


@pytest.mark.crash
def test_without_the_checkpoint_the_killed_call_is_lost_and_paid_again(tmp_path: Path) -> None:
    """The control: the SDK's own SQLiteSession saves a step's calls with their outputs."""
    store = tmp_path / "sessions.sqlite"
    crash_child(tmp_path, "sqlite", store)
    assert ledger_lines(tmp_path / "ledger") == ['{"invoice": "1042", "amount": "120.00"}']
    answer = run_child(tmp_path, "sqlite", store, "Is invoice 1042 paid?")

    first, resumed, after = requests_made(tmp_path)
    assert first == [{"role": "user", "content": PROMPT}]
    assert resumed == [  # the call that paid is gone from the model's context
        {"role": "user", "content": PROMPT},
        {"role": "user", "content": "Is invoice 1042 paid?"},
    ]
    assert after[-1]["call_id"] == "call-pay-2"  # so the model asked to pay again...
    assert ledger_lines(tmp_path / "ledger") == [  # ...and the invoice was paid twice
        '{"invoice": "1042", "amount": "120.00"}',
        '{"invoice": "1042", "amount": "120.00"}',
    ]
    assert answer == "Invoice 1042 is paid."


def anyio_run_inspect(store: Path, session_id: str = SESSION) -> tuple[SessionEvent, ...]:
    """The stored log of *session_id*, read in a loop of its own."""

    async def inspect() -> tuple[SessionEvent, ...]:
        return tuple((await open_store(store).inspect(session_id)).events)

    return anyio.run(inspect)


# -- the example -----------------------------------------------------------------------------


def test_the_page_shows_the_example_as_it_is() -> None:
    assert doc_snippets.sources(PAGE) == {EXAMPLE}
    assert doc_snippets.rendered(PAGE) == PAGE.read_text()


def test_the_example_runs_and_resumes_its_session(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), str(root)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == "Done: sent 120.00 EUR for invoice 1042.\n"
    stored = anyio_run_inspect(root, "invoice-1042")
    ends = [event.data for event in stored if event.type == "turn/end"]
    assert ends == [eventdata.turn_end(turn, {"kind": "completed"}) for turn in (1, 2)]


async def test_a_streamed_run_checkpoints_its_request_after_saving_its_input(
    tmp_path: Path,
) -> None:
    """``Runner.run_streamed`` saves the input after announcing the request: the request's
    checkpoint waits for it, and still comes before the model (the SDK's own scripted model)."""
    root = tmp_path / "sessions"
    seen: list[str] = []

    async def durable() -> None:
        stored = await open_store(root, batch_window=3600).inspect(SESSION)
        seen.append(stored.events[-1].type)

    async def ask(call: ModelCall) -> list[TResponseOutputItem]:
        await durable()
        return [function_call(TOOL_NAME, ARGUMENTS, call_id=CALL)]

    async def answer(call: ModelCall) -> list[TResponseOutputItem]:
        await durable()
        return [assistant_message("Invoice 1042 is paid.")]

    model = ScriptedModel([ModelStep.respond(ask), ModelStep.respond(answer)])
    async with CheckpointSession(root, SESSION, batch_window=3600) as session:
        tool = payment_tool(tmp_path / "ledger", probe=durable)
        agent = Agent(name="payments", model=model, tools=[tool])
        streamed = Runner.run_streamed(agent, PROMPT, session=session, hooks=session.hooks)
        async for _event in streamed.stream_events():
            pass
        live = list(session.log.events)
    assert streamed.final_output == "Invoice 1042 is paid."
    with_usage = [  # this model reports usage: one chunk more per response
        *TURN_TYPES[:9],
        "assistant/chunk",
        *TURN_TYPES[9:18],
        "assistant/chunk",
        *TURN_TYPES[18:],
    ]
    assert types(live) == with_usage
    assert seen == ["request/context", "tool/call", "step/start"]


async def test_a_call_the_log_proves_never_started_reaches_the_model_as_not_started(
    tmp_path: Path,
) -> None:
    """A stored turn whose model asked for a call that never got its ``tool/call``."""
    root = tmp_path / "sessions"
    async with Host([open_store(root), policy], autoload=False) as host:
        stored = host.sessions.create(SESSION)
        stored.append("turn/start", eventdata.turn_start(1))
        stored.append("step/start", eventdata.step_data(1, 1))
        stored.append("user/message", eventdata.user_message("user-1", PROMPT))
        block: JSONObject = {"type": "tool-call", "id": CALL, "name": TOOL_NAME}
        block["arguments"] = ARGUMENTS
        asked = eventdata.assistant_message(1, 1, [block], provider=PROVIDER, model=MODEL_NAME)
        stored.append("assistant/message", asked)
        await host.sessions.close(stored)
    model = PaymentModel()
    async with CheckpointSession(root, SESSION) as session:
        agent = payment_agent(model, payment_tool(tmp_path / "ledger"))
        await Runner.run(agent, "Is invoice 1042 paid?", session=session, hooks=session.hooks)
    assert model.requests[0][1:3] == [
        {"type": "function_call", "call_id": CALL, "name": TOOL_NAME, "arguments": ARGUMENTS},
        {
            "type": "function_call_output",
            "call_id": CALL,
            "output": f"{TOOL_NOT_STARTED}: Error: {NOT_STARTED_TEXT}",
        },
    ]


async def test_a_postgresql_store_keeps_the_turn_too(tmp_path: Path, postgres_dsn: str) -> None:
    async with CheckpointSession(postgres_dsn, SESSION) as session:
        agent = payment_agent(PaymentModel(), payment_tool(tmp_path / "ledger"))
        await Runner.run(agent, PROMPT, session=session, hooks=session.hooks)
        live = list(session.log.events)
    reader = open_store(postgres_dsn)
    try:
        stored = await reader.inspect(SESSION)
    finally:
        await reader.aclose()  # its connections, before the pool is collected
    assert types(live) == TURN_TYPES
    assert list(stored.events) == live
