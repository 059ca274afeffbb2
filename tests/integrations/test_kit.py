"""The conformance kit's whole turn, run through both framework integrations.

Each integration opens its own host, backend and policy for a session, so each is checked with
a :data:`~kai_session_checkpoint_policy.conformance.TurnFactory`: its ``run_turn`` opens the
session in the kit's store with the kit's backend options and its scripted turn as one more
plugin, and runs one turn through the real framework, as a user of the integration would. The
framework's model is driven by ``script.stream()``, and the tool's body is
``script.run_tool(call_id)``. A variant of each integration with its tool checkpoint left out
(the Pydantic AI capability's ``wrap_tool_execute``, the SDK hooks' ``on_tool_start``) shows
that the kit fails an integration that breaks a rule, and names it.
"""

from __future__ import annotations

import sys
from contextlib import aclosing, asynccontextmanager
from typing import TYPE_CHECKING, Any, Final

import pytest

# Pydantic AI, which half of these tests drive, needs Python 3.11 (see test_pydantic_ai.py; a
# tuple, so that mypy, checking as Python 3.10, still checks the rest of the module).
if tuple(sys.version_info) < (3, 11):
    pytest.skip(
        "Pydantic AI 2.68, the oldest release the integration works with, needs Python 3.11",
        allow_module_level=True,
    )

from agents import Agent as SdkAgent
from agents import ModelResponse as SdkResponse
from agents import (
    ModelSettings,
    RunContextWrapper,
    RunHooks,
    Runner,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.models.interface import Model, ModelTracing
from agents.tool_context import ToolContext
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from kai_session_checkpoint_policy import policy
from kai_session_checkpoint_policy.conformance import (
    ConformanceError,
    ScriptedTurn,
    TurnPlugins,
    check_turn,
)
from kai_session_checkpoint_policy.contract import BlockEnd
from kai_session_checkpoint_policy.integrations.openai_agents import (
    CheckpointHooks,
    CheckpointSession,
)
from kai_session_checkpoint_policy.integrations.pydantic_ai import (
    SessionCheckpoints,
    open_session,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

    from agents.agent_output import AgentOutputSchemaBase
    from agents.handoffs import Handoff
    from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent
    from agents.tool import Tool
    from openai.types.responses.response_prompt_param import ResponsePromptParam
    from pydantic_ai.capabilities import WrapToolExecuteHandler
    from pydantic_ai.tools import ToolDefinition

    from kai_session_checkpoint_policy.events import JSONObject

pytestmark = pytest.mark.anyio
set_tracing_disabled(True)  # no run may try to export its traces over the network

MODEL_NAME: Final = "conformance"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # both frameworks run on asyncio only


async def blocks_of(script: ScriptedTurn) -> list[JSONObject]:
    """The blocks of the scripted model's next response, its stream pulled to the end."""
    blocks: list[JSONObject] = []
    async with aclosing(script.stream()) as chunks:
        async for chunk in chunks:
            if isinstance(chunk, BlockEnd):
                blocks.append(chunk.block)
    return blocks


def the_policy(plugins: TurnPlugins) -> None:
    """Both integrations register the policy themselves: the kit's must be that one."""
    assert plugins.policy is policy


# -- Pydantic AI -----------------------------------------------------------------------------


def scripted_model(script: ScriptedTurn) -> FunctionModel:
    """Pydantic AI's own function model, answering with the kit's scripted responses."""

    async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        parts: list[TextPart | ToolCallPart] = []
        for block in await blocks_of(script):
            if block["type"] == "text":
                parts.append(TextPart(str(block["text"])))
            else:
                call_id, name = str(block["id"]), str(block["name"])
                parts.append(ToolCallPart(name, str(block["arguments"]), tool_call_id=call_id))
        return ModelResponse(parts=parts)

    return FunctionModel(respond, model_name=MODEL_NAME)


class PydanticAIUnderTest:
    """One turn of a Pydantic AI agent, in a session of the integration on the kit's store."""

    def __init__(
        self, plugins: TurnPlugins, capability: Callable[[SessionCheckpoints], Any] = lambda c: c
    ) -> None:
        the_policy(plugins)
        self.plugins = plugins
        self.capability = capability

    async def run_turn(self, session_id: str, prompt: str, script: ScriptedTurn) -> object:
        agent: Agent[None, str] = Agent(
            scripted_model(script), instructions="Pay what you are asked to pay."
        )

        @agent.tool(name=script.tool_name)
        async def pay(ctx: RunContext[None], invoice: int) -> str:
            assert ctx.tool_call_id is not None
            return await script.run_tool(ctx.tool_call_id)

        backend, extra = self.plugins.backend, [self.plugins.script]
        async with open_session(backend, session_id, plugins=extra) as session:
            result = await agent.run(
                prompt,
                message_history=session.message_history,
                capabilities=[self.capability(session.capability)],
            )
        return result.output


@asynccontextmanager
async def pydantic_ai_host(plugins: TurnPlugins) -> AsyncIterator[PydanticAIUnderTest]:
    yield PydanticAIUnderTest(plugins)


async def test_the_pydantic_ai_integration_passes_the_kit(tmp_path: Path) -> None:
    script = await check_turn(pydantic_ai_host, tmp_path / "sessions")
    assert (script.requests, script.steps, script.bodies) == (2, 2, ["c1", "c2"])
    assert script.violations == []


class UncheckpointedTools(SessionCheckpoints):
    """The capability with its tool checkpoint left out: a tool body runs as soon as it is
    called, with no ``tool/call`` recorded and no ``tools_execute`` hook."""

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        handler: WrapToolExecuteHandler,
    ) -> Any:
        return await handler(args)


@asynccontextmanager
async def uncheckpointed_host(plugins: TurnPlugins) -> AsyncIterator[PydanticAIUnderTest]:
    yield PydanticAIUnderTest(plugins, lambda good: UncheckpointedTools(recorder=good.recorder))


async def test_the_kit_fails_a_pydantic_ai_capability_without_its_tool_checkpoint(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConformanceError) as caught:
        await check_turn(uncheckpointed_host, tmp_path / "sessions")
    error = caught.value
    assert str(error).splitlines()[0] == str(error.violations[0])
    assert error.rules[0] == "hooks"
    assert set(error.rules) == {"hooks", "tool-call", "outcome-unknown", "durable-log"}
    messages = [violation.message for violation in error.violations]  # both bodies run at once
    for call_id in ScriptedTurn.calls:
        assert (
            f"the tool body of call {call_id!r} ran without the tools_execute hook: the host must "
            "call the thunk the hook returns, so that the policy's wrapper runs"
        ) in messages
        assert (
            f"the tool/call of call {call_id!r} was not durable when the tool body started: it "
            "had not been appended (or not announced with session_event) by then; the host must "
            "append it, and announce the append, before tools_execute"
        ) in messages
        assert any(
            message.startswith(
                f"a crash while the tool body of call {call_id!r} runs would be recovered as "
                "nothing (the call would vanish from the model's context), not "
                "TOOL_OUTCOME_UNKNOWN"
            )
            for message in messages
        )


# -- the OpenAI Agents SDK --------------------------------------------------------------------


class KitModel(Model):
    """A model of the SDK's own interface, answering with the kit's scripted responses."""

    def __init__(self, script: ScriptedTurn) -> None:
        self.script = script
        self.model = MODEL_NAME

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> SdkResponse:
        output: list[TResponseOutputItem] = []
        for block in await blocks_of(self.script):
            if block["type"] == "text":
                text = ResponseOutputText(
                    type="output_text", text=str(block["text"]), annotations=[]
                )
                output.append(
                    ResponseOutputMessage(
                        id=f"msg-{len(output)}",
                        type="message",
                        role="assistant",
                        status="completed",
                        content=[text],
                    )
                )
            else:
                output.append(
                    ResponseFunctionToolCall(
                        type="function_call",
                        call_id=str(block["id"]),
                        name=str(block["name"]),
                        arguments=str(block["arguments"]),
                        status="completed",
                    )
                )
        return SdkResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the kit's turn is run without streaming")


class OpenAIAgentsUnderTest:
    """One turn of the SDK's ``Runner``, in a :class:`CheckpointSession` on the kit's store."""

    def __init__(
        self,
        plugins: TurnPlugins,
        hooks: Callable[[CheckpointSession], RunHooks[Any]] = lambda session: session.hooks,
    ) -> None:
        the_policy(plugins)
        self.plugins = plugins
        self.hooks = hooks

    async def run_turn(self, session_id: str, prompt: str, script: ScriptedTurn) -> object:
        async def pay(ctx: ToolContext[Any], invoice: int) -> str:
            """Pay an invoice."""
            return await script.run_tool(ctx.tool_call_id)

        tool = function_tool(pay, name_override=script.tool_name)
        agent = SdkAgent(
            name="payments", instructions="Pay invoices.", model=KitModel(script), tools=[tool]
        )
        backend = self.plugins.backend
        async with CheckpointSession(
            backend.root,
            session_id,
            batch_window=backend.batch_window,
            plugins=[self.plugins.script],
        ) as session:
            result = await Runner.run(agent, prompt, session=session, hooks=self.hooks(session))
        return result.final_output


@asynccontextmanager
async def openai_agents_host(plugins: TurnPlugins) -> AsyncIterator[OpenAIAgentsUnderTest]:
    yield OpenAIAgentsUnderTest(plugins)


async def test_the_openai_agents_integration_passes_the_kit(tmp_path: Path) -> None:
    script = await check_turn(openai_agents_host, tmp_path / "sessions")
    assert (script.requests, script.steps, script.bodies) == (2, 2, ["c1", "c2"])
    assert script.violations == []


class UncheckpointedToolHooks(CheckpointHooks):
    """The session's run hooks with the tool checkpoint left out: ``on_tool_start`` neither
    records the call nor runs ``tools_execute``."""

    async def on_tool_start(
        self, context: RunContextWrapper[Any], agent: SdkAgent[Any], tool: Tool
    ) -> None:
        pass


@asynccontextmanager
async def uncheckpointed_agents_host(
    plugins: TurnPlugins,
) -> AsyncIterator[OpenAIAgentsUnderTest]:
    yield OpenAIAgentsUnderTest(plugins, UncheckpointedToolHooks)


async def test_the_kit_fails_agents_sdk_hooks_without_the_tool_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ConformanceError) as caught:
        await check_turn(uncheckpointed_agents_host, tmp_path / "sessions")
    error = caught.value
    assert error.rules[0] == "hooks"
    assert set(error.rules) == {
        "hooks",
        "tool-call",
        "outcome-unknown",
        "durable-log",
        "step-results",
    }
    messages = [violation.message for violation in error.violations]
    for call_id in ScriptedTurn.calls:
        assert (
            f"the tool/call of call {call_id!r} was not durable when the tool body started: it "
            "had not been appended (or not announced with session_event) by then; the host must "
            "append it, and announce the append, before tools_execute"
        ) in messages
        assert any(
            message.startswith(
                f"the tool/result of call {call_id!r} was not durable when the agent_pre_step "
                "hook let step 2 begin"
            )
            for message in messages
        )
