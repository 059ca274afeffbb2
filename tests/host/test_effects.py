"""Effect classes and idempotency keys: a crash inside a tool body of each class, then resume.

The crash tests run ``tests/support/effects_child.py`` as a real child process, kill it with
SIGKILL inside the tool body right after its effect, recover the session in this process, and
resume it: the model reads the result of its class, and an idempotent tool retried with the key
its result names runs with the same key, so a provider that deduplicates on the key (a real
HTTP server on 127.0.0.1) applies the effect once.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import pytest

from kai_session_checkpoint_policy import (
    Agent,
    Finish,
    Host,
    TextDelta,
    Tool,
    ToolSpec,
    invariant,
    policy,
    tool_call_block,
)
from kai_session_checkpoint_policy.effects import (
    EFFECT_CLASSES,
    effect_class,
    effect_from_annotations,
    idempotency_key,
)
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence
from kai_session_checkpoint_policy.results import (
    OUTCOME_UNKNOWN_TEXT,
    OUTCOME_UNKNOWN_TEXTS,
    UNKNOWN_IDEMPOTENCY_KEY,
    ErrorInfo,
    outcome_unknown,
)

from ..support.dedup_provider import DedupProvider, dedup_provider
from ..support.effects_child import (
    AFTER_EFFECT,
    ARGUMENTS,
    FIRST_CALL,
    PROVIDER,
    TOOL,
    make_act_tool,
)
from ..support.markers import kill_at_marker

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from kai_session_checkpoint_policy import JSON, JSONObject, LlmRequest, StreamChunk
    from kai_session_checkpoint_policy.effects import EffectClass

CHILD: Final = Path(__file__).parents[1] / "support" / "effects_child.py"
SESSION: Final = "orders"
KEY: Final = idempotency_key(SESSION, FIRST_CALL)
STOPPED: Final = (
    "Error: the session stopped after this tool call started and before its result was saved, "
    "so it is not known whether the call took effect."
)
SEEN: Final[dict[str, str]] = {
    "read-only": (
        "Error: the session stopped after this tool call started and before its result was "
        "saved. The tool only reads: the call changed nothing, so it may simply be made again."
    ),
    "idempotent": (
        f"{STOPPED} The tool is idempotent: a repeat with the same idempotency key has no "
        "further effect. To retry, call it again with the same arguments and the argument "
        f'"idempotency_key": "{KEY}".'
    ),
    "side-effecting": (
        f"{STOPPED} The tool changes things, and calling it again may do so twice. First verify "
        "whether the change happened (look at the state it changes, or ask the user); retry "
        f"only if it did not. This call's idempotency key is {KEY}: a retry that must be "
        f'recognized as the same call passes the argument "idempotency_key": "{KEY}".'
    ),
    "open-world": (
        f"{STOPPED} The tool acts outside this agent (other systems, other people), so its "
        "effect may be somewhere the agent cannot see or check. Do not retry it on your own: "
        "ask the user, or check with the system it reached. This call's idempotency key is "
        f'{KEY}; a retry of the same call passes the argument "idempotency_key": "{KEY}".'
    ),
}
"""What the model reads after the crash, for each class the tool declares."""


def crash_in_body(tmp_path: Path, effect: str, provider: DedupProvider) -> Path:
    """Run the child until its tool body has done its effect, SIGKILL it; return the root."""
    root, marker = tmp_path / "sessions", tmp_path / "marker"
    marker.write_text("")
    command = [sys.executable, str(CHILD), str(root), SESSION, effect]
    command += [str(tmp_path / "effects.jsonl"), str(marker), "--provider", provider.url]
    child = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    kill_at_marker(child, marker, AFTER_EFFECT)
    return root


def effects_file(tmp_path: Path) -> list[JSON]:
    lines = (tmp_path / "effects.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


class Resuming:
    """The model after the crash: it records what it reads, and retries with a named key."""

    def __init__(self, *, retry: bool) -> None:
        self.retry = retry
        self.seen: list[tuple[JSONObject, ...]] = []

    async def __call__(self, request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        self.seen.append(request.messages)
        if self.retry and len(self.seen) == 1:
            text = json.dumps(request.messages[-2])  # the tool result, before the new prompt
            (key,) = re.findall(r'idempotency_key\\": \\"(kai-idem-[0-9a-f]+)', text)
            arguments = json.dumps({"order": "A-7", "idempotency_key": key})
            for chunk in tool_call_block(0, "call-2", TOOL, arguments):
                yield chunk
            yield Finish("tool-calls")
        else:
            yield TextDelta("checked")
            yield Finish("stop")


async def resume(
    root: Path, tmp_path: Path, effect: EffectClass | None, model: Resuming, provider: str
) -> list[Any]:
    """Load the session with recovery, run one turn with *model*; return the whole log."""
    backend = JsonlSessionPersistence(root)
    async with Host([backend, policy, invariant], autoload=False) as host:
        host.llm.register_adapter(PROVIDER, model)
        host.tools.register(make_act_tool(effect, tmp_path / "effects.jsonl", provider=provider))
        stored = await backend.load(SESSION)
        session = host.sessions.create(SESSION, seed=stored.events)
        await Agent(host, session, provider=PROVIDER, model="m").run_turn("did it happen?")
        await host.sessions.flush(session)
        return list(session.events)


def repaired_result(effect: str) -> JSONObject:
    """The data of the ``tool/result`` recovery writes at seq 11 for the killed call."""
    text = SEEN.get(effect, f"Error: {OUTCOME_UNKNOWN_TEXT}")
    data: JSONObject = {
        "turn": 1,
        "step": 1,
        "message": {
            "id": f"interrupted-tool-result-{FIRST_CALL}-11",
            "role": "user",
            "source": {"kind": "tool", "callId": FIRST_CALL},
            "content": [
                {
                    "type": "tool-result",
                    "toolCallId": FIRST_CALL,
                    "isError": True,
                    "content": [{"type": "text", "text": text}],
                }
            ],
        },
        "error": {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"},
    }
    if effect == "read-only":
        data["effect"] = {"class": effect}
    elif effect != "undeclared":
        data["effect"] = {"class": effect, "idempotencyKey": KEY}
    return data


@pytest.mark.parametrize(
    "effect", ["read-only", "idempotent", "side-effecting", "open-world", "undeclared"]
)
@pytest.mark.crash
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_crash_after_the_effect_recovers_with_the_text_and_key_of_the_class(
    tmp_path: Path, effect: str
) -> None:
    declared = None if effect == "undeclared" else effect_class(effect)
    ran_under = declared or "open-world"
    key = None if ran_under == "read-only" else KEY
    with dedup_provider() as provider:
        root = crash_in_body(tmp_path, effect, provider)
        model = Resuming(retry=False)
        events = anyio.run(resume, root, tmp_path, declared, model, provider.url)

    # The effect happened once, with the key the tool/call recorded.
    assert effects_file(tmp_path) == [{"call": FIRST_CALL, "key": key}]
    assert provider.effects == [(key, {"order": "A-7"})]
    call = events[10]
    assert (call.type, call.data) == (
        "tool/call",
        {
            "turn": 1,
            "step": 1,
            "callId": FIRST_CALL,
            "name": TOOL,
            "arguments": ARGUMENTS,
            "effect": ran_under,
            **({} if key is None else {"idempotencyKey": key}),
        },
    )
    # Recovery closed the turn; the result is the one of the class the call ran under.
    closers = [(event.type, event.seq) for event in events[11:14]]
    assert closers == [("tool/result", 11), ("step/end", 12), ("turn/end", 13)]
    assert events[11].source_event_seqs == (10,)
    # An undeclared tool ran as open-world; its recovered result says so.
    assert events[11].data == repaired_result(ran_under)
    # What the model reads on resume: the repaired result, exactly, then the new prompt.
    (request,) = model.seen
    assert request[-2] == repaired_result(ran_under)["message"]
    assert request[-1]["content"] == [{"type": "text", "text": "did it happen?"}]


@pytest.mark.crash
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_idempotent_retry_runs_with_the_first_key_and_the_provider_applies_it_once(
    tmp_path: Path, backend: str
) -> None:
    with dedup_provider() as provider:
        root = crash_in_body(tmp_path, "idempotent", provider)
        model = Resuming(retry=True)
        events = anyio.run(
            resume, root, tmp_path, "idempotent", model, provider.url, backend=backend
        )

    retry = [event for event in events[14:] if event.type == "tool/call"]
    assert [(event.data["callId"], event.data["idempotencyKey"]) for event in retry] == [
        ("call-2", KEY)
    ]
    # The tool saw the same key both times, and its body ran without the argument.
    assert effects_file(tmp_path) == [
        {"call": FIRST_CALL, "key": KEY},
        {"call": "call-2", "key": KEY},
    ]
    assert provider.requests == [(KEY, {"order": "A-7"})] * 2
    assert provider.effects == [(KEY, {"order": "A-7"})]  # one effect, not two
    (answer,) = [event for event in events[14:] if event.type == "tool/result"]
    assert answer.data["message"]["content"][0]["content"] == [
        {"type": "text", "text": '{"done": "call-2"}'}
    ]


# -- without a crash ---------------------------------------------------------------------------


def test_untrusted_annotations_do_not_lower_the_class_and_trusted_ones_do() -> None:
    read_only = {"readOnlyHint": True}
    assert effect_from_annotations(read_only, trusted=False) == "open-world"
    assert effect_from_annotations(read_only, trusted=True) == "read-only"
    idempotent = {"idempotentHint": True, "destructiveHint": True}
    assert effect_from_annotations(idempotent, trusted=False) == "open-world"
    assert effect_from_annotations(idempotent, trusted=True) == "idempotent"
    closed = {"openWorldHint": False, "destructiveHint": False}
    assert effect_from_annotations(closed, trusted=True) == "side-effecting"
    assert effect_from_annotations({}, trusted=True) == "open-world"  # the MCP defaults
    with pytest.raises(ValueError, match="tool annotation readOnlyHint must be a boolean"):
        effect_from_annotations({"readOnlyHint": "yes"}, trusted=True)


def test_a_bad_class_is_refused_with_the_classes_named() -> None:
    async def body(execution: object) -> JSON:
        return None

    expected = "unknown effect class 'safe': expected one of 'read-only', 'idempotent', "
    with pytest.raises(ValueError, match=re.escape(expected)):
        Tool("t", body, effect="safe")  # type: ignore[arg-type]  # the wrong value under test


def test_a_result_without_a_class_is_the_general_one() -> None:
    result = outcome_unknown()
    assert result.effect is None
    assert result.content[0].text == f"Error: {OUTCOME_UNKNOWN_TEXT}"


class OneCall:
    """Asks for one call of ``lookup`` with *arguments*, then answers."""

    def __init__(self, arguments: str) -> None:
        self.arguments = arguments

    async def __call__(self, request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        if len(request.messages) == 1:
            for chunk in tool_call_block(0, "c-1", "lookup", self.arguments):
                yield chunk
            yield Finish("tool-calls")
        else:
            yield TextDelta("ok")
            yield Finish("stop")


async def one_call(
    tool_annotations: JSONObject, *, trusted: bool, arguments: str = "{}"
) -> tuple[list[Any], list[tuple[str | None, JSON]], tuple[ToolSpec, ...]]:
    """Run one turn that calls ``lookup``; return the log, what its body saw, and the specs."""
    seen: list[tuple[str | None, JSON]] = []

    async def lookup(execution: Any) -> JSON:
        seen.append((execution.idempotency_key, execution.arguments))
        return "found"

    async with Host([], autoload=False) as host:
        host.llm.register_adapter(PROVIDER, OneCall(arguments))
        tool = Tool("lookup", lookup, annotations=tool_annotations)
        host.tools.register(tool, trust_annotations=trusted)
        session = host.sessions.create("s")
        await Agent(host, session, provider=PROVIDER, model="m").run_turn("look")
        return list(session.events), seen, host.tools.specs()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("trusted", "ran_under", "key"),
    [(False, "open-world", idempotency_key("s", "c-1")), (True, "read-only", None)],
)
async def test_the_host_runs_a_call_under_the_class_its_annotations_may_claim(
    trusted: bool, ran_under: EffectClass, key: str | None
) -> None:
    events, seen, specs = await one_call({"readOnlyHint": True}, trusted=trusted)
    (call,) = [event for event in events if event.type == "tool/call"]
    assert call.data.get("effect") == ran_under
    assert call.data.get("idempotencyKey") == key
    assert seen == [(key, {})]
    assert specs == (ToolSpec("lookup", "", {"type": "object"}, ran_under),)


@pytest.mark.anyio
async def test_a_retry_naming_a_key_this_session_never_gave_is_refused_before_the_body() -> None:
    arguments = '{"idempotency_key": "kai-idem-0000"}'
    events, seen, _ = await one_call({}, trusted=False, arguments=arguments)
    assert seen == []  # the body never ran
    (result,) = [event for event in events if event.type == "tool/result"]
    assert result.data["error"] == {"name": "IdempotencyKeyError", "code": UNKNOWN_IDEMPOTENCY_KEY}
    assert result.data["message"]["content"][0]["content"] == [
        {
            "type": "text",
            "text": "Error: idempotency_key 'kai-idem-0000' is not the key of an earlier call of "
            "'lookup' in this session; leave it out for a new call",
        }
    ]


@pytest.mark.anyio
async def test_a_read_only_call_ignores_a_named_key_and_its_body_never_sees_it() -> None:
    arguments = '{"q": 1, "idempotency_key": "anything"}'
    events, seen, _ = await one_call({"readOnlyHint": True}, trusted=True, arguments=arguments)
    assert seen == [(None, {"q": 1})]
    (call,) = [event for event in events if event.type == "tool/call"]
    assert call.data["arguments"] == arguments  # the log keeps what the model asked, as it was


def test_there_is_a_text_for_every_class() -> None:
    assert tuple(OUTCOME_UNKNOWN_TEXTS) == EFFECT_CLASSES
    for effect in EFFECT_CLASSES:
        result = outcome_unknown(effect, "k")
        assert result.effect is not None
        assert result.effect.effect == effect
        assert result.error is not None
        assert result.error.info == ErrorInfo("ToolOutcomeUnknownError", "TOOL_OUTCOME_UNKNOWN")
