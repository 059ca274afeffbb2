"""The Pydantic AI integration: real agents with Pydantic AI's own offline models.

What the session log holds after a run, what is durable at the moment the model and a tool
body run, a store that cannot be written, and a real child process killed inside a paying tool
and resumed in another: with the integration, and with Pydantic AI's own saved history.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

# Pydantic AI 2.68, the oldest release the integration works with, needs Python 3.11: the test
# extra installs it only from there. (A tuple, not sys.version_info itself: mypy, which checks
# as Python 3.10, would take the rest of this module for unreachable and check none of it.)
if tuple(sys.version_info) < (3, 11):
    pytest.skip(
        "Pydantic AI 2.68, the oldest release the integration works with, needs Python 3.11",
        allow_module_level=True,
    )

from pydantic_ai import Agent, ModelMessagesTypeAdapter, ModelRetry
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RequestUsage

from kai_session_checkpoint_policy import eventdata
from kai_session_checkpoint_policy.effects import idempotency_key
from kai_session_checkpoint_policy.events import SessionEvent
from kai_session_checkpoint_policy.integrations.pydantic_ai import (
    PydanticAISession,
    UnrecordedToolCallError,
    current_idempotency_key,
    history_of,
    open_session,
)
from kai_session_checkpoint_policy.persistence import (
    NOT_STARTED_TEXT,
    JsonlSessionPersistence,
    OsFiles,
    StoredLog,
    open_store,
)
from kai_session_checkpoint_policy.results import (
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    outcome_unknown_text,
)

from ..support import doc_snippets
from ..support.markers import kill_at_marker, reap

CHILD = Path(__file__).with_name("pydantic_ai_child.py")
pytestmark = pytest.mark.anyio

DOCS = Path(__file__).resolve().parents[2] / "docs"
EXAMPLE = DOCS / "examples" / "integrations" / "pydantic_ai_agent.py"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # Pydantic AI runs on asyncio only


async def inspect(store: str | Path, session_id: str) -> StoredLog:
    """The session's log as stored, read by a backend of its own."""
    backend = open_store(store)
    try:
        return await backend.inspect(session_id)
    finally:
        await backend.aclose()


def types(log: StoredLog) -> list[str]:
    return [event.type for event in log.events]


def result_block(event: SessionEvent) -> Any:
    """The ``tool-result`` block of a ``tool/result`` event."""
    data: Any = event.data
    return data["message"]["content"][0]


def paying_model(
    on_request: Any = None,
) -> FunctionModel:
    """A model that asks for ``pay-1`` with its first request, and then reports the result.

    *on_request* (awaited with the messages) runs when the model is called.
    """

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if on_request is not None:
            await on_request(messages)
        if len(messages) == 1:
            call = ToolCallPart("pay", {"invoice": 42}, tool_call_id="pay-1")
            return ModelResponse(
                parts=[TextPart("Paying."), call],
                usage=RequestUsage(input_tokens=30, output_tokens=7),
            )
        return ModelResponse(parts=[TextPart("Paid.")])

    return FunctionModel(model, model_name="payer")


def paying_agent(model: FunctionModel, bodies: list[str], on_body: Any = None) -> Agent[None, str]:
    agent = Agent(model, instructions="Pay what you are asked to pay.")

    @agent.tool_plain
    async def pay(invoice: int) -> str:
        if on_body is not None:
            await on_body()
        bodies.append(f"pay {invoice}")
        return f"invoice {invoice} paid"

    return agent


async def run(session: PydanticAISession, agent: Agent[None, str], prompt: str | None) -> str:
    result = await agent.run(
        prompt, message_history=session.message_history, capabilities=[session.capability]
    )
    return result.output


# -- what a run records ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trusted", "ran_under", "key"),
    [(False, "open-world", idempotency_key("s", "pay-1")), (True, "read-only", None)],
)
async def test_mcp_annotations_in_tool_metadata_set_the_class_only_when_trusted(
    tmp_path: Path, trusted: bool, ran_under: str, key: str | None
) -> None:
    keys: list[str | None] = []
    agent = Agent(paying_model(), instructions="Look it up.")

    @agent.tool_plain(metadata={"annotations": {"readOnlyHint": True, "title": None}})
    async def pay(invoice: int) -> str:
        keys.append(current_idempotency_key())  # what a body hands to a provider
        return "found"

    async with open_session(tmp_path, "s", trust_annotations=trusted) as session:
        await run(session, agent, "Look up invoice 42.")
    stored = await inspect(tmp_path, "s")
    (call,) = [event for event in stored.events if event.type == "tool/call"]
    assert (call.data.get("effect"), call.data.get("idempotencyKey")) == (ran_under, key)
    assert keys == [key]


async def test_a_run_is_recorded_in_the_events_of_the_reference_agent(tmp_path: Path) -> None:
    bodies: list[str] = []
    async with open_session(tmp_path, "s") as session:
        assert await run(session, paying_agent(paying_model(), bodies), "Pay invoice 42") == "Paid."
    log = await inspect(tmp_path, "s")
    assert log.repair == ()
    data = [(event.type, dict(event.data)) for event in log.events]
    for _type, item in data:
        item.pop("usage", None)
    route = {"kind": "model", "provider": "function", "model": "payer"}
    call_block = {"type": "tool-call", "id": "pay-1", "name": "pay", "arguments": '{"invoice":42}'}
    result_block = {
        "type": "tool-result",
        "toolCallId": "pay-1",
        "isError": False,
        "content": [{"type": "text", "text": "invoice 42 paid"}],
    }
    assert data == [
        ("turn/start", {"turn": 1}),
        ("step/start", {"turn": 1, "step": 1}),
        ("user/message", dict(eventdata.user_message("user-1", "Pay invoice 42"))),
        (
            "request/header",
            {
                "header": {"config": {"provider": "function", "model": "payer"}, "tools": ["pay"]},
                "reason": "initial",
            },
        ),
        ("request/context", {"provider": "function", "model": "payer"}),
        (
            "assistant/message",
            {
                "turn": 1,
                "step": 1,
                "message": {
                    "id": "assistant-1-1",
                    "role": "assistant",
                    "content": [{"type": "text", "text": "Paying."}, call_block],
                    "source": route,
                },
            },
        ),
        (
            "tool/call",
            {
                "turn": 1,
                "step": 1,
                "callId": "pay-1",
                "name": "pay",
                "arguments": '{"invoice":42}',
                "effect": "open-world",  # the tool declares nothing: the worst case
                "idempotencyKey": idempotency_key("s", "pay-1"),
            },
        ),
        (
            "tool/result",
            {
                "turn": 1,
                "step": 1,
                "message": {
                    "id": "tool-result-pay-1",
                    "role": "user",
                    "source": {"kind": "tool", "callId": "pay-1"},
                    "content": [result_block],
                },
            },
        ),
        ("step/end", {"turn": 1, "step": 1}),
        ("step/start", {"turn": 1, "step": 2}),
        (
            "assistant/message",
            {
                "turn": 1,
                "step": 2,
                "message": {
                    "id": "assistant-1-2",
                    "role": "assistant",
                    "content": [{"type": "text", "text": "Paid."}],
                    "source": route,
                },
            },
        ),
        ("step/end", {"turn": 1, "step": 2}),
        ("turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
    ]
    assert log.events[5].data["usage"] == {"inputTokens": 30, "outputTokens": 7}
    assert log.events[7].source_event_seqs == (6,)  # the result cites its tool/call
    assert bodies == ["pay 42"]


async def test_the_next_run_continues_the_session_from_its_history(tmp_path: Path) -> None:
    seen: list[list[ModelMessage]] = []

    async def remember(messages: list[ModelMessage]) -> None:
        seen.append(list(messages))

    agent = paying_agent(paying_model(remember), [])
    async with open_session(tmp_path, "s") as session:
        await run(session, agent, "Pay invoice 42")
        first = session.message_history
    async with open_session(tmp_path, "s") as session:
        assert _plain(session.message_history) == _plain(first)
        await run(session, agent, "Thanks")
    log = await inspect(tmp_path, "s")
    assert types(log)[13:] == [
        "turn/start",
        "step/start",
        "user/message",
        "request/header",
        "request/context",
        "assistant/message",
        "step/end",
        "turn/end",
    ]
    assert log.events[16].data["reason"] == "resume"
    assert log.events[15].data["id"] == "user-2"
    # The model's request in the second run is the whole conversation, the new prompt last.
    assert _plain(seen[-1][:-1]) == _plain(first)
    last = seen[-1][-1]
    assert isinstance(last, ModelRequest)
    assert [part.content for part in last.parts if isinstance(part, UserPromptPart)] == ["Thanks"]


def _plain(messages: list[ModelMessage]) -> list[tuple[str, list[tuple[str, object]]]]:
    """The kinds and contents of *messages*, without their times and ids of runs."""
    return [
        (
            message.kind,
            [
                (part.part_kind, getattr(part, "content", None) or getattr(part, "args", None))
                for part in message.parts
            ],
        )
        for message in messages
    ]


async def test_every_call_ends_with_one_result_whatever_answered_it(tmp_path: Path) -> None:
    """Pydantic AI's own model calls every tool and gives a structured output by an output
    tool; a retried call gets its retry as an error result; each call is answered once."""
    agent = Agent(TestModel(), output_type=int)
    tries: list[int] = []

    @agent.tool_plain
    async def look_up(key: str) -> str:
        return f"value of {key}"

    @agent.tool_plain(retries=2)
    async def flaky(n: int) -> str:
        tries.append(n)
        if len(tries) == 1:
            raise ModelRetry("try once more")
        return "ok"

    async with open_session(tmp_path, "s") as session:
        result = await agent.run("go", capabilities=[session.capability])
        assert result.output == 0
        history = session.message_history
    log = await inspect(tmp_path, "s")
    asked = [
        call_id
        for event in log.events
        if event.type == "assistant/message"
        for call_id in eventdata.tool_call_ids(event.data)
    ]
    answered = [
        str(eventdata.result_call_id(event.data))
        for event in log.events
        if event.type == "tool/result"
    ]
    assert sorted(answered) == sorted(asked)
    assert len(asked) == len(set(asked))
    errors = [
        result_block(event)
        for event in log.events
        if event.type == "tool/result" and result_block(event)["isError"]
    ]
    assert [eventdata.texts_of(block["content"]) for block in errors] == [["Error: try once more"]]
    assert tries == [0, 0]
    assert types(log)[-1] == "turn/end"
    # The history holds every call's answer: the last response is the output call, answered.
    assert isinstance(history[-1], ModelRequest)
    returns = [part for part in history[-1].parts if isinstance(part, ToolReturnPart)]
    assert [part.content for part in returns] == ["Final result processed."]


async def test_runs_of_one_session_go_one_at_a_time(tmp_path: Path) -> None:
    entered, release = anyio.Event(), anyio.Event()

    async def hold(messages: list[ModelMessage]) -> None:
        entered.set()
        await release.wait()

    agent = paying_agent(paying_model(hold), [])
    async with open_session(tmp_path, "s") as session, anyio.create_task_group() as group:
        group.start_soon(run, session, agent, "Pay invoice 42")
        await entered.wait()
        with pytest.raises(RuntimeError) as refused:
            await run(session, agent, "And another")
        assert str(refused.value) == (
            "session 's' already has a run in progress: the runs of one session go one at a time"
        )
        release.set()


async def test_calls_of_a_history_from_elsewhere_are_refused_before_they_run(
    tmp_path: Path,
) -> None:
    bodies: list[str] = []
    pending: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart("Pay invoice 42")]),
        ModelResponse(parts=[ToolCallPart("pay", {"invoice": 42}, tool_call_id="pay-0")]),
    ]
    agent = paying_agent(paying_model(), bodies)
    async with open_session(tmp_path, "s") as session:
        with pytest.raises(UnrecordedToolCallError) as refused:
            await agent.run(None, message_history=pending, capabilities=[session.capability])
    assert bodies == []
    assert str(refused.value) == (
        "session 's': tool call 'pay-0' (pay) was not asked for by a response recorded in this "
        "session; run the agent with the session's message_history"
    )


async def test_a_store_of_another_kind_is_refused() -> None:
    with pytest.raises(TypeError) as refused:
        async with open_session(42, "s"):  # type: ignore[arg-type]
            pass
    assert str(refused.value) == (
        "the store must be a directory, a postgresql:// URL or a persistence backend, not 42"
    )


# -- the checkpoints ------------------------------------------------------------------------


async def test_the_checkpoints_hold_when_the_model_and_the_tool_body_run(tmp_path: Path) -> None:
    """With a batch window of an hour, only the checkpoints write: what the model and the tool
    body find on disk is what the checkpoints made durable before them."""
    durable: list[list[str]] = []

    async def look() -> None:
        durable.append(types(await inspect(tmp_path, "s")))

    async def on_request(messages: list[ModelMessage]) -> None:
        await look()

    agent = paying_agent(paying_model(on_request), [], on_body=look)
    async with open_session(open_store(tmp_path, batch_window=3600), "s") as session:
        await run(session, agent, "Pay invoice 42")
    request = ["turn/start", "step/start", "user/message", "request/header", "request/context"]
    called = [*request, "assistant/message", "tool/call"]
    assert durable == [
        request,  # the first request, before the model
        called,  # the call, before the tool body
        [*called, "tool/result", "step/end", "step/start"],  # the step's result, then the request
    ]


class BreakableFiles(OsFiles):
    """The operating system's files, whose writes fail while ``broken`` is set."""

    broken = False

    def write(self, fd: int, data: bytes) -> None:
        if self.broken:
            raise OSError(28, "No space left on device (injected)")
        super().write(fd, data)


async def test_a_tool_whose_checkpoint_fails_never_runs(tmp_path: Path) -> None:
    files = BreakableFiles()
    bodies: list[str] = []

    async def break_the_store(messages: list[ModelMessage]) -> None:
        files.broken = True  # after the request's checkpoint, before the call's

    agent = paying_agent(paying_model(break_the_store), bodies)
    backend = JsonlSessionPersistence(tmp_path, batch_window=3600, files=files)
    async with open_session(backend, "s") as session:
        with pytest.raises(OSError, match=r"No space left on device \(injected\)"):
            await run(session, agent, "Pay invoice 42")
        assert bodies == []
        assert types(await inspect(tmp_path, "s"))[-1] == "request/context"
        files.broken = False
    log = await inspect(tmp_path, "s")
    assert types(log)[5:] == [
        "assistant/message",
        "tool/call",
        "tool/result",
        "step/end",
        "turn/end",
    ]
    message = "[Errno 28] No space left on device (injected)"
    assert result_block(log.events[7])["content"] == [{"type": "text", "text": f"Error: {message}"}]
    assert log.events[9].data["reason"] == {
        "kind": "error",
        "error": {"message": message, "code": "UNKNOWN"},
    }


async def test_a_model_whose_checkpoint_fails_is_never_called(tmp_path: Path) -> None:
    files = BreakableFiles()
    requests: list[int] = []

    async def count(messages: list[ModelMessage]) -> None:
        requests.append(len(messages))

    backend = JsonlSessionPersistence(tmp_path, batch_window=3600, files=files)
    async with open_session(backend, "s") as session:
        files.broken = True
        with pytest.raises(OSError, match=r"No space left on device \(injected\)"):
            await run(session, paying_agent(paying_model(count), []), "Pay invoice 42")
        assert requests == []
        files.broken = False
    assert types(await inspect(tmp_path, "s")) == ["turn/start", "turn/end"]


# -- a crash, and a resume in another process ------------------------------------------------


def start_child(
    mode: str, store: str | Path, workdir: Path, *extra: str
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), mode, str(store), "crash", str(workdir), *extra],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def run_child(mode: str, store: str | Path, workdir: Path, *extra: str) -> None:
    child = start_child(mode, store, workdir, *extra)
    try:
        _, errors = child.communicate(timeout=60)
        assert child.returncode == 0, errors.decode(errors="replace")
    finally:
        reap(child)


def kill_inside_the_payment(mode: str, store: str | Path, workdir: Path, *extra: str) -> None:
    marker = workdir / "marker"
    marker.write_bytes(b"")  # pre-created empty: only its content signals the moment
    kill_at_marker(start_child(mode, store, workdir, *extra), marker, "paid")


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def requests_seen(workdir: Path) -> list[list[ModelMessage]]:
    return [
        ModelMessagesTypeAdapter.validate_json(line)
        for line in (workdir / "requests.jsonl").read_bytes().splitlines()
    ]


def returns_of(request: ModelMessage) -> dict[str, ToolReturnPart]:
    assert isinstance(request, ModelRequest)
    return {part.tool_call_id: part for part in request.parts if isinstance(part, ToolReturnPart)}


def check_resumed_through_the_integration(workdir: Path) -> None:
    assert lines(workdir / "ledger") == ["paid invoice 42"]  # once: the body never ran again
    assert lines(workdir / "receipts") == []  # the call after it never started, nor was run
    first, resumed = requests_seen(workdir)
    assert len(first) == 1
    answers = returns_of(resumed[-1])
    assert sorted(answers) == ["pay-1", "receipt-1"]
    # The payment tool declares itself side-effecting (in its metadata): verify first, and the
    # key its body was handed is named.
    seen = outcome_unknown_text("side-effecting", idempotency_key("crash", "pay-1"))
    assert answers["pay-1"].content == f"[{TOOL_OUTCOME_UNKNOWN}] Error: {seen}"
    assert answers["pay-1"].outcome == "failed"
    assert answers["pay-1"].metadata == {
        "error": {"name": "ToolOutcomeUnknownError", "code": TOOL_OUTCOME_UNKNOWN}
    }
    assert answers["receipt-1"].content == f"[{TOOL_NOT_STARTED}] Error: {NOT_STARTED_TEXT}"


@pytest.mark.crash
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
async def test_a_payment_killed_in_its_body_is_unknown_after_a_resume_never_paid_again(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    kill_inside_the_payment("pay", store, tmp_path)
    assert lines(tmp_path / "ledger") == ["paid invoice 42"]
    stored = await inspect(store, "crash")
    # On disk at the kill: the call, durable before its body ran.
    assert types(stored)[-2:] == ["assistant/message", "tool/call"]
    assert stored.events[-1].data["callId"] == "pay-1"

    run_child("resume", store, tmp_path)

    check_resumed_through_the_integration(tmp_path)
    log = await inspect(store, "crash")
    assert log.repair == ()
    assert types(log)[7:] == [
        "tool/result",  # the recovery's: pay-1 started, its outcome unknown
        "tool/result",  # receipt-1 never started
        "step/end",
        "turn/end",
        "turn/start",  # the resumed run: its request is the recovered results
        "step/start",
        "request/header",
        "request/context",
        "assistant/message",
        "step/end",
        "turn/end",
    ]
    assert [eventdata.error_of(log.events[seq].data) for seq in (7, 8)] == [
        {"name": "ToolOutcomeUnknownError", "code": TOOL_OUTCOME_UNKNOWN},
        {"name": "ToolNotStartedError", "code": TOOL_NOT_STARTED},
    ]
    assert log.events[10].data["reason"] == {"kind": "interrupted"}
    assert log.events[-1].data == {"turn": 2, "reason": {"kind": "completed"}}
    (answer,) = history_of(log.events)[-1].parts
    assert isinstance(answer, TextPart)
    assert answer.content.startswith(f"[{TOOL_OUTCOME_UNKNOWN}]")


@pytest.mark.crash
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_without_the_integration_a_resumed_history_pays_again(tmp_path: Path) -> None:
    """The control: Pydantic AI's own history, saved after every node of the run, ends with
    the calls of the last response; resumed, Pydantic AI runs them again."""
    kill_inside_the_payment("pay-native", "-", tmp_path)
    assert lines(tmp_path / "ledger") == ["paid invoice 42"]

    run_child("resume-native", "-", tmp_path)

    assert lines(tmp_path / "ledger") == ["paid invoice 42", "paid invoice 42"]  # paid twice
    assert lines(tmp_path / "receipts") == ["receipt for invoice 42"]
    _first, resumed = requests_seen(tmp_path)
    answers = returns_of(resumed[-1])
    assert {call_id: part.content for call_id, part in answers.items()} == {
        "pay-1": "invoice 42 paid",
        "receipt-1": "receipt sent",
    }
    assert TOOL_OUTCOME_UNKNOWN not in (tmp_path / "requests.jsonl").read_text()


@pytest.mark.crash
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
async def test_a_payment_killed_in_its_body_on_postgresql(
    tmp_path: Path, postgres_dsn: str
) -> None:
    ttl = "1"  # the killed writer's lease holds the session this long
    kill_inside_the_payment("pay", postgres_dsn, tmp_path, ttl)
    stored = await inspect(postgres_dsn, "crash")
    assert types(stored)[-2:] == ["assistant/message", "tool/call"]

    run_child("resume", postgres_dsn, tmp_path, ttl)

    check_resumed_through_the_integration(tmp_path)
    assert types(await inspect(postgres_dsn, "crash"))[-1] == "turn/end"


# -- the example ----------------------------------------------------------------------------


def test_the_example_runs(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, str(EXAMPLE), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    first_turn = (
        "turn/start, step/start, user/message, request/header, request/context, "
        "assistant/message, tool/call, tool/result, step/end, "
        "step/start, assistant/message, step/end, turn/end"
    )
    second_turn = (
        "turn/start, step/start, user/message, request/header, request/context, "
        "assistant/message, step/end, turn/end"
    )
    assert completed.stdout.splitlines() == [
        "Invoice 42 is paid.",
        "You are welcome.",
        f"{first_turn}, {second_turn}",
    ]


def test_the_page_shows_the_example_as_it_is() -> None:
    page = DOCS / "integrations" / "pydantic-ai.md"
    assert doc_snippets.sources(page) == {EXAMPLE}
    assert doc_snippets.rendered(page) == page.read_text()
