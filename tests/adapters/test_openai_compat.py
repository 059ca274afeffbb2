"""The OpenAI-compatible model adapter against an endpoint on the loopback address.

The endpoint (:mod:`.sse_server`) replays recorded event streams from ``streams/``, whole or cut
short (ended early, dropped mid-body, or stalled), and answers refusals. Turns run through the
reference host with the JSONL backend and the checkpoint policy, so the log on disk shows what a
failed response leaves behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest

from kai_session_checkpoint_policy import (
    Agent,
    BlockEnd,
    BlockStart,
    Finish,
    Host,
    LlmRequest,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    invariant,
    policy,
)
from kai_session_checkpoint_policy.adapters.openai_compat import (
    ModelStatusError,
    ModelStreamError,
    ModelTimeoutError,
    OpenAICompatibleModel,
)
from kai_session_checkpoint_policy.cli import main as cli_main
from kai_session_checkpoint_policy.demo import (
    PAYMENT,
    PAYMENT_PARAMETERS,
    PROMPT,
    TOOL_NAME,
    make_payment_tool,
)
from kai_session_checkpoint_policy.effects import idempotency_key
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence

from ..support import doc_snippets
from .sse_server import ModelServer, Received, Refuse, Replay

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kai_session_checkpoint_policy import JSON, JSONObject, StreamChunk

pytestmark = pytest.mark.anyio

KEY = "sk-test-4f9c2a7e81b3d05c6e1fa9"
MODEL = "gpt-4o-mini"
CALL = "call_Q7mQ2pX0dW1hYkS8vN3bT6rJ"
PIECES = [
    *('{"', "invoice", '":"', "104", "2", '","', "to", '":"', "AC", "ME", " Corp", '","'),
    *("amount", '":"', "120", ".", "00", '","', "currency", '":"', "EUR", '"}'),
]
ARGUMENTS = "".join(PIECES)
RECEIPT = f"sent 120.00 EUR to ACME Corp for invoice 1042, receipt R-{CALL}"
DESCRIPTION = "Pay an invoice. Each call moves money: it is not safe to repeat."
REPO = Path(__file__).resolve().parents[2]
USER_MESSAGE: JSONObject = {
    "id": "user-1",
    "role": "user",
    "content": [{"type": "text", "text": PROMPT}],
    "source": {"kind": "prompt"},
}


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer() as server:
        yield server


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    return KEY


def payment_request() -> LlmRequest:
    tool = make_payment_tool(announce=lambda _: None)
    return LlmRequest(
        "openai",
        MODEL,
        messages=(USER_MESSAGE,),
        tools=(TOOL_NAME,),
        tool_specs=(tool.spec,),
    )


async def stream(model: OpenAICompatibleModel, request: LlmRequest) -> list[StreamChunk]:
    with anyio.fail_after(20):
        return [chunk async for chunk in model(request)]


async def stream_error(model: OpenAICompatibleModel, request: LlmRequest) -> ModelStreamError:
    with pytest.raises(ModelStreamError) as caught:
        await stream(model, request)
    return caught.value


async def pay(
    root: Path, server: ModelServer, announced: list[str]
) -> tuple[str, str | None, str, object]:
    """Run one turn that may pay through the reference host; return how it ended."""
    model = OpenAICompatibleModel(server.url)
    async with Host([JsonlSessionPersistence(root), policy, invariant], autoload=False) as host:
        host.llm.register_adapter("openai", model)
        host.tools.register(make_payment_tool(announce=announced.append))
        session = host.sessions.create("pay-1")
        outcome = await Agent(host, session, provider="openai", model=MODEL).run_turn(PROMPT)
        await host.sessions.flush(session)
    error = None if outcome.error is None else str(outcome.error)
    return str(outcome.reason["kind"]), error, outcome.text, outcome.reason


async def stored_types(root: Path, session_id: str = "pay-1") -> list[str]:
    log = await JsonlSessionPersistence(root).inspect(session_id)
    return [event.type for event in log.events]


def squeezed(types: list[str]) -> list[str]:
    """*types* with each run of ``assistant/chunk`` as one ``assistant/chunk*<count>``."""
    out: list[str] = []
    for kind in types:
        if kind == "assistant/chunk" and out and out[-1].startswith("assistant/chunk"):
            count = int(out[-1].partition("*")[2] or 1) + 1
            out[-1] = f"assistant/chunk*{count}"
        else:
            out.append(kind)
    return out


# -------------------------------------------------------------------------------------------
# Whole streams
# -------------------------------------------------------------------------------------------


async def test_a_whole_text_stream_is_exactly_its_chunks(server: ModelServer, api_key: str) -> None:
    server.reply(Replay("text_answer.sse"))
    chunks = await stream(OpenAICompatibleModel(server.url), payment_request())

    pieces = ["Invoices", " are", " paid", " within", " 30", " days", "."]
    assert chunks == [
        BlockStart(0, "text"),
        *(TextDelta(piece, 0) for piece in pieces),
        BlockEnd(0, {"type": "text", "text": "Invoices are paid within 30 days."}),
        Usage(
            {
                "inputTokens": 19,
                "outputTokens": 8,
                "totalTokens": 27,
                "cacheReadTokens": 0,
                "reasoningTokens": 0,
            }
        ),
        Finish("stop"),
    ]


async def test_a_tool_call_streams_its_name_first_then_its_argument_deltas(
    server: ModelServer, api_key: str
) -> None:
    server.reply(Replay("payment_call.sse"))
    chunks = await stream(OpenAICompatibleModel(server.url), payment_request())

    call: JSONObject = {"type": "tool-call", "id": CALL, "name": TOOL_NAME, "arguments": ARGUMENTS}
    assert chunks == [
        BlockStart(0, "tool-call"),
        ToolCallDelta(0, CALL, "", TOOL_NAME),
        *(ToolCallDelta(0, CALL, piece) for piece in PIECES),
        BlockEnd(0, call),
        Usage(
            {
                "inputTokens": 112,
                "outputTokens": 38,
                "totalTokens": 150,
                "cacheReadTokens": 0,
                "reasoningTokens": 0,
            }
        ),
        Finish("tool-calls"),
    ]
    assert json.loads(ARGUMENTS) == PAYMENT


async def test_usage_comes_before_the_finish_whose_reason_is_mapped(
    server: ModelServer, api_key: str
) -> None:
    server.reply(Replay("payment_answer.sse"))
    chunks = await stream(OpenAICompatibleModel(server.url), payment_request())

    assert chunks[-3:] == [
        BlockEnd(0, {"type": "text", "text": "Invoice 1042 is paid: 120.00 EUR to ACME Corp."}),
        Usage(
            {
                "inputTokens": 171,
                "outputTokens": 14,
                "totalTokens": 185,
                "cacheReadTokens": 128,
                "reasoningTokens": 0,
            }
        ),
        Finish("stop"),
    ]


async def test_reasoning_content_is_a_reasoning_block_before_the_text(
    server: ModelServer, api_key: str
) -> None:
    server.reply(Replay("deepseek_reasoning.sse"))
    chunks = await stream(OpenAICompatibleModel(server.url), payment_request())

    thoughts = ["The", " user", " asks", " when", " invoices", " are", " due", ".", " Net", " 30"]
    thoughts.append(".")
    answer = ["Within", " 30", " days", "."]
    assert chunks == [
        BlockStart(0, "reasoning"),
        *(ReasoningDelta(piece, 0) for piece in thoughts),
        BlockEnd(0, {"type": "reasoning", "text": "".join(thoughts)}),
        BlockStart(1, "text"),
        *(TextDelta(piece, 1) for piece in answer),
        BlockEnd(1, {"type": "text", "text": "Within 30 days."}),
        Usage(
            {
                "inputTokens": 21,
                "outputTokens": 19,
                "totalTokens": 40,
                "cacheReadTokens": 0,
                "reasoningTokens": 12,
            }
        ),
        Finish("stop"),
    ]


# -------------------------------------------------------------------------------------------
# A whole turn: what the endpoint is told
# -------------------------------------------------------------------------------------------


async def test_a_turn_sends_the_model_the_tool_schemas_and_the_results(
    tmp_path: Path, server: ModelServer, api_key: str
) -> None:
    server.reply(Replay("payment_call.sse"), Replay("payment_answer.sse"))
    announced: list[str] = []
    kind, error, text, _ = await pay(tmp_path, server, announced)

    assert (kind, error, text) == (
        "completed",
        None,
        "Invoice 1042 is paid: 120.00 EUR to ACME Corp.",
    )
    assert announced == [
        f"send_payment moved 120.00 EUR to ACME Corp for invoice 1042 (idempotency key {CALL})"
    ]
    first, second = server.received
    user: JSON = {"role": "user", "content": PROMPT}
    tools: JSON = [
        {
            "type": "function",
            "function": {
                "name": TOOL_NAME,
                "description": DESCRIPTION,
                "parameters": PAYMENT_PARAMETERS,
            },
        }
    ]
    assert first.path == "/v1/chat/completions"
    assert first.body == {
        "model": MODEL,
        "messages": [user],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": tools,
    }
    asked: JSON = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": CALL,
                "type": "function",
                "function": {"name": TOOL_NAME, "arguments": ARGUMENTS},
            }
        ],
    }
    answered: JSON = {"role": "tool", "tool_call_id": CALL, "content": RECEIPT}
    assert second.body["messages"] == [user, asked, answered]
    assert second.body["tools"] == tools
    for received in server.received:
        assert received.headers["authorization"] == f"Bearer {KEY}"
        assert received.headers["accept"] == "text/event-stream"
    assert squeezed(await stored_types(tmp_path)) == [
        "turn/start",
        "step/start",
        "user/message",
        "request/header",
        "request/context",
        "assistant/chunk*27",
        "assistant/message",
        "tool/call",
        "tool/result",
        "step/end",
        "step/start",
        "assistant/chunk*21",
        "assistant/message",
        "step/end",
        "turn/end",
    ]


async def test_a_named_tool_without_a_spec_takes_any_object_and_options_are_sent(
    server: ModelServer, api_key: str
) -> None:
    server.reply(Replay("text_answer.sse"))
    request = LlmRequest(
        "openai",
        MODEL,
        messages=(USER_MESSAGE,),
        tools=("lookup", TOOL_NAME),
        tool_specs=(make_payment_tool(announce=print).spec,),
    )
    async with httpx.AsyncClient() as client:  # the caller's own client, which it closes
        model = OpenAICompatibleModel(
            server.url,
            instructions="You pay invoices.",
            options={"temperature": 0, "max_tokens": 200},
            client=client,
        )
        chunks = await stream(model, request)

    assert chunks[-1] == Finish("stop")
    (received,) = server.received
    assert received.body["messages"] == [
        {"role": "system", "content": "You pay invoices."},
        {"role": "user", "content": PROMPT},
    ]
    assert received.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": TOOL_NAME,
                "description": DESCRIPTION,
                "parameters": PAYMENT_PARAMETERS,
            },
        },
        {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}},
    ]
    assert (received.body["temperature"], received.body["max_tokens"]) == (0, 200)


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"options": {"stream": False}}, "options may not set stream: the adapter writes them"),
        (
            {"read_timeout": 0.0},
            "read_timeout must be a positive number of seconds, not 0.0",
        ),
    ],
)
def test_the_adapter_refuses_options_it_cannot_honour(
    arguments: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(problem)}$"):
        OpenAICompatibleModel("http://127.0.0.1:9/v1", **arguments)


# -------------------------------------------------------------------------------------------
# Responses that do not end properly
# -------------------------------------------------------------------------------------------


async def test_a_connection_dropped_mid_arguments_runs_no_tool_and_logs_no_call(
    tmp_path: Path, server: ModelServer, api_key: str
) -> None:
    """The request's events were durable before the endpoint saw it; the chunks that came are
    logged; the stream raised, so the agent recorded no ``tool/call`` and ran no tool."""
    durable_at_request: list[list[str]] = []

    def on_request(_: Received) -> None:
        # In the server's thread, while the host waits for the response: what is on disk now.
        durable_at_request.append(anyio.run(stored_types, tmp_path))

    server.on_request = on_request
    server.reply(Replay("payment_call.sse", cut_after=8, then="drop"))
    announced: list[str] = []
    kind, error, _, reason = await pay(tmp_path, server, announced)

    assert durable_at_request == [
        ["turn/start", "step/start", "user/message", "request/header", "request/context"]
    ]
    assert kind == "error"
    assert error is not None
    assert re.fullmatch(
        rf"model endpoint {re.escape(server.url)}/chat/completions: the connection broke \(.+\), "
        rf"after 8 events, with the arguments of tool call {CALL} \(send_payment\) incomplete "
        r"\(21 characters so far\)",
        error,
    ), error
    assert reason == {"kind": "error", "error": {"message": error, "code": "UNKNOWN"}}
    assert announced == []  # the tool never ran
    types = await stored_types(tmp_path)
    assert squeezed(types) == [
        "turn/start",
        "step/start",
        "user/message",
        "request/header",
        "request/context",
        "assistant/chunk*9",  # its start, its name, 7 pieces of its arguments
        "step/end",
        "turn/end",
    ]
    assert "tool/call" not in types
    recovered = await JsonlSessionPersistence(tmp_path).load("pay-1")
    assert recovered.repair == ()  # the turn was closed: nothing is left to guess


async def test_a_stream_that_ends_before_its_finish_reason_is_an_error(
    server: ModelServer, api_key: str
) -> None:
    server.reply(Replay("payment_call.sse", cut_after=8, then="end"))
    error = await stream_error(OpenAICompatibleModel(server.url), payment_request())

    assert str(error) == (
        f"model endpoint {server.url}/chat/completions: the connection closed before the "
        f"response finished, after 8 events, with the arguments of tool call {CALL} "
        "(send_payment) incomplete (21 characters so far)"
    )


async def test_a_stall_past_the_read_timeout_is_a_timeout(
    server: ModelServer, api_key: str
) -> None:
    server.reply(Replay("payment_call.sse", cut_after=5, then="stall"))
    model = OpenAICompatibleModel(server.url, read_timeout=0.25)
    error = await stream_error(model, payment_request())

    assert isinstance(error, ModelTimeoutError)
    assert isinstance(error, TimeoutError)
    assert str(error) == (
        f"model endpoint {server.url}/chat/completions: no data for 0.25 s (the read "
        f"timeout), after 5 events, with the arguments of tool call {CALL} (send_payment) "
        "incomplete (15 characters so far)"
    )


RATE_LIMITED = (
    "Rate limit reached for gpt-4o-mini in organization org-3Jk9 on requests per min (RPM): "
    "Limit 3, Used 3, Requested 1. Please try again in 20s."
)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        pytest.param(
            Refuse(
                429,
                {
                    "error": {
                        "message": RATE_LIMITED,
                        "type": "requests",
                        "param": None,
                        "code": "rate_limit_exceeded",
                    }
                },
                (("Retry-After", "20"),),
            ),
            f"answered HTTP 429 Too Many Requests: {RATE_LIMITED} (retry after 20 s)",
            id="429",
        ),
        pytest.param(
            Refuse(
                500,
                {
                    "error": {
                        "message": "The server had an error while processing your request.",
                        "type": "server_error",
                        "param": None,
                        "code": None,
                    }
                },
            ),
            "answered HTTP 500 Internal Server Error: The server had an error while processing "
            "your request.",
            id="500",
        ),
    ],
)
async def test_a_refusal_is_an_error_that_names_its_status(
    server: ModelServer, api_key: str, reply: Refuse, expected: str
) -> None:
    server.reply(reply)
    error = await stream_error(OpenAICompatibleModel(server.url), payment_request())

    assert isinstance(error, ModelStatusError)
    assert error.status_code == reply.status
    assert str(error) == f"model endpoint {server.url}/chat/completions {expected}"


async def test_a_malformed_event_is_an_error_that_names_it(
    server: ModelServer, api_key: str
) -> None:
    server.reply(Replay("malformed.sse"))
    error = await stream_error(OpenAICompatibleModel(server.url), payment_request())

    assert str(error).startswith(
        f"model endpoint {server.url}/chat/completions: event 4 of the stream is not JSON: "
        '\'{"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG"'
    )


async def test_a_tool_call_cut_at_the_token_limit_never_ends_its_block(
    server: ModelServer, api_key: str
) -> None:
    server.reply(Replay("payment_call_length.sse"))
    chunks: list[StreamChunk] = []

    async def read() -> None:
        async for chunk in OpenAICompatibleModel(server.url)(payment_request()):
            chunks.append(chunk)

    with pytest.raises(ModelStreamError) as caught:
        await read()

    assert str(caught.value) == (
        f"model endpoint {server.url}/chat/completions: the response reached its token limit "
        f"inside tool call {CALL} (send_payment): its arguments are incomplete"
    )
    assert not any(isinstance(chunk, (BlockEnd, Finish)) for chunk in chunks)


# -------------------------------------------------------------------------------------------
# The API key
# -------------------------------------------------------------------------------------------


async def test_the_api_key_is_sent_as_a_bearer_token_and_never_shown(
    server: ModelServer, api_key: str
) -> None:
    echoed = f"Incorrect API key provided: {KEY}. You can find your API key in your account."
    server.reply(
        Refuse(
            401,
            {
                "error": {
                    "message": echoed,
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            },
        ),
        Replay("payment_call.sse", cut_after=3, then="drop"),
        Replay("payment_call.sse", cut_after=3, then="stall"),
    )
    model = OpenAICompatibleModel(server.url, read_timeout=0.25)
    refused = await stream_error(model, payment_request())
    dropped = await stream_error(model, payment_request())
    stalled = await stream_error(model, payment_request())

    assert str(refused) == (
        f"model endpoint {server.url}/chat/completions answered HTTP 401 Unauthorized: "
        "Incorrect API key provided: <api key>. You can find your API key in your account."
    )
    for shown in (refused, dropped, stalled, model):
        assert KEY not in str(shown)
        assert KEY not in repr(shown)
    assert [r.headers["authorization"] for r in server.received] == [f"Bearer {KEY}"] * 3


async def test_without_a_key_no_authorization_is_sent_and_a_401_says_why(
    server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PAYMENTS_KEY", raising=False)
    server.reply(Refuse(401, {"error": {"message": "Missing bearer authentication."}}))
    model = OpenAICompatibleModel(server.url, api_key_env="PAYMENTS_KEY")
    error = await stream_error(model, payment_request())

    assert "authorization" not in server.received[0].headers
    assert str(error) == (
        f"model endpoint {server.url}/chat/completions answered HTTP 401 Unauthorized: "
        "Missing bearer authentication.; no API key was sent: the environment variable "
        "PAYMENTS_KEY is unset"
    )


# -------------------------------------------------------------------------------------------
# The command line
# -------------------------------------------------------------------------------------------


def test_the_agent_command_runs_a_turn_against_the_endpoint(
    tmp_path: Path, server: ModelServer
) -> None:
    server.reply(Replay("payment_call.sse"), Replay("payment_answer.sse"))
    root, ledger = tmp_path / "sessions", tmp_path / "ledger.jsonl"
    command = [sys.executable, "-m", "kai_session_checkpoint_policy", "agent"]
    command += ["--root", str(root), "--session", "pay-1", "--ledger", str(ledger)]
    command += ["--model-url", server.url, "--model", MODEL, "--api-key-env", "PAYMENTS_KEY"]
    env = {**os.environ, "PAYMENTS_KEY": KEY}
    env.pop("OPENAI_API_KEY", None)
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, check=False)

    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        'session pay-1, turn 1: {"kind":"completed"}\n'
        "assistant: Invoice 1042 is paid: 120.00 EUR to ACME Corp.\n"
    )
    assert [json.loads(line) for line in ledger.read_text().splitlines()] == [
        {"idempotencyKey": CALL, "payment": PAYMENT}
    ]
    assert [r.body["model"] for r in server.received] == [MODEL, MODEL]
    assert [r.headers["authorization"] for r in server.received] == [f"Bearer {KEY}"] * 2
    log = anyio.run(JsonlSessionPersistence(root).inspect, "pay-1")
    events = {event.type: event.data for event in log.events}
    assert squeezed([event.type for event in log.events]) == [
        "turn/start",
        "step/start",
        "user/message",
        "request/header",
        "request/context",
        "assistant/chunk*27",
        "assistant/message",
        "tool/call",
        "tool/result",
        "step/end",
        "step/start",
        "assistant/chunk*21",
        "assistant/message",
        "step/end",
        "turn/end",
    ]
    assert events["request/header"]["header"] == {
        "config": {"provider": "openai", "model": MODEL},
        "tools": [TOOL_NAME],
    }
    assert events["tool/call"] == {
        "turn": 1,
        "step": 1,
        "callId": CALL,
        "name": TOOL_NAME,
        "arguments": ARGUMENTS,
        "effect": "side-effecting",  # as the payment tool declares
        "idempotencyKey": idempotency_key("pay-1", CALL),
    }
    assert events["turn/end"]["reason"] == {"kind": "completed"}


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (["--model", MODEL], "--model-url and --model go together"),
        (["--model-url", "http://127.0.0.1:9/v1"], "--model-url and --model go together"),
        (["--api-key-env", "KEY"], "--api-key-env goes with --model-url"),
        (
            ["--model-url", "ftp://example/v1", "--model", MODEL],
            "--model-url: base_url must be an http:// or https:// URL, not 'ftp://example/v1'",
        ),
    ],
)
def test_the_agent_command_refuses_an_incomplete_model_route(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], problem: str
) -> None:
    status = cli_main(["agent", "--root", str(tmp_path), "--session", "s", *options])

    assert (status, capsys.readouterr().err) == (2, f"kai-checkpoint: {problem}\n")


# -------------------------------------------------------------------------------------------
# The documentation's example
# -------------------------------------------------------------------------------------------

PAGE = REPO / "docs" / "integrations" / "openai-compatible.md"


def test_the_page_shows_its_example_exactly() -> None:
    assert doc_snippets.sources(PAGE) == {PAGE.parent / "openai_compatible.py"}
    assert doc_snippets.rendered(PAGE) == PAGE.read_text()


def test_the_example_runs_against_the_endpoint(tmp_path: Path, server: ModelServer) -> None:
    server.reply(Replay("invoice_status_call.sse"), Replay("invoice_status_answer.sse"))
    example = PAGE.parent / "openai_compatible.py"
    env = {**os.environ, "OPENAI_API_KEY": KEY}
    command = [sys.executable, str(example), server.url, MODEL, str(tmp_path / "sessions")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, check=False)

    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "Invoice 1042 is open: 120.00 EUR, due on 2025-04-30.\n"
    tools = server.received[0].body["tools"]
    assert isinstance(tools, list)
    assert isinstance(tools[0], dict)
    assert tools[0]["function"] == {
        "name": "invoice_status",
        "description": "Look up an invoice: its amount, and whether it is paid.",
        "parameters": {
            "type": "object",
            "properties": {"invoice": {"type": "string", "description": "The invoice number."}},
            "required": ["invoice"],
        },
    }
    messages = server.received[1].body["messages"]
    assert isinstance(messages, list)
    assert messages[-1] == {
        "role": "tool",
        "tool_call_id": "call_hV2nK8sW4cQ1mZ7xR0tB5yLp",
        "content": json.dumps(
            {"invoice": "1042", "amount": "120.00 EUR", "due": "2025-04-30", "paid": False}
        ),
    }


def test_with_ask_the_endpoints_call_waits_for_a_yes_on_the_terminal(
    tmp_path: Path, server: ModelServer
) -> None:
    server.reply(Replay("payment_call.sse"), Replay("payment_answer.sse"))
    root, ledger = tmp_path / "sessions", tmp_path / "ledger.jsonl"
    command = [sys.executable, "-m", "kai_session_checkpoint_policy", "agent", "--ask"]
    command += ["--root", str(root), "--session", "pay-1", "--ledger", str(ledger)]
    command += ["--model-url", server.url, "--model", MODEL, "--api-key-env", "PAYMENTS_KEY"]
    env = {**os.environ, "PAYMENTS_KEY": KEY}
    done = subprocess.run(
        command, input="y\n", capture_output=True, text=True, timeout=60, env=env, check=False
    )

    assert (done.returncode, done.stderr) == (
        0,
        f"approval needed: {TOOL_NAME} {ARGUMENTS}\napprove? [y/N] ",
    )
    assert [json.loads(line) for line in ledger.read_text().splitlines()] == [
        {"idempotencyKey": CALL, "payment": PAYMENT}
    ]
    log = anyio.run(JsonlSessionPersistence(root).inspect, "pay-1")
    approvals = [event for event in log.events if event.type.startswith("approval/")]
    (call,) = [event.data for event in log.events if event.type == "tool/call"]
    assert [(event.type, event.data.get("outcome")) for event in approvals] == [
        ("approval/asked", None),
        ("approval/decided", "allowed-once"),
    ]
    assert approvals[0].data["arguments"] == ARGUMENTS
    assert call["approvalId"] == approvals[0].data["id"]
