"""The ``kai`` pytest plugin, as a host author's test suite uses it."""

from __future__ import annotations

import ast
import inspect
import re

import anyio
import pytest

from kai_session_checkpoint_policy import pytest_plugin

pytest_plugins = ["pytester"]

USER_TESTS = """
import anyio
import pytest
from contextlib import aclosing

from kai_session_checkpoint_policy import Agent, Finish, LlmRequest, TextDelta, policy

pytestmark = pytest.mark.anyio


async def drain(host, session):
    request = LlmRequest("mock", "mock", session_id=session.id)
    async with aclosing(host.llm.stream(request)) as stream:
        return [chunk async for chunk in stream]


async def test_the_host_is_open_with_the_policy_and_no_autoloaded_plugin(
    kai_host, kai_flush_recorder
):
    assert kai_host.pm.get_plugin("session-checkpoint-policy") is policy
    assert kai_host.pm.get_plugin("session-checkpoint-policy-invariant") is None
    assert kai_host.session_persistence is kai_flush_recorder
    kai_host.task_group.start_soon(anyio.lowlevel.checkpoint)


async def test_a_turn_is_checkpointed(
    kai_host, kai_session, kai_flush_recorder, kai_recording_adapter, kai_order
):
    kai_recording_adapter.script(TextDelta("Hi."), Finish("stop"))
    agent = Agent(kai_host, kai_session, provider="mock", model="mock")

    outcome = await agent.run_turn("Hello.")

    assert outcome.text == "Hi."
    assert kai_flush_recorder.flushes == ["kai-session", "kai-session"]
    assert kai_order == ["flush:start", "flush:end", "flush:start", "flush:end", "adapter"]
    assert [request.session_id for request in kai_recording_adapter.requests] == ["kai-session"]


async def test_a_held_flush_keeps_the_adapter_waiting(
    kai_host, kai_session, kai_flush_recorder, kai_order
):
    gate = kai_flush_recorder.hold()
    chunks = []

    async def consume():
        chunks.extend(await drain(kai_host, kai_session))

    async with anyio.create_task_group() as group:
        group.start_soon(consume)
        await anyio.wait_all_tasks_blocked()
        assert kai_order == ["flush:start"]
        gate.release()

    assert kai_order == ["flush:start", "flush:end", "adapter"]
    assert chunks == [Finish("stop")]


async def test_a_failing_flush_keeps_the_adapter_from_running(
    kai_host, kai_session, kai_flush_recorder, kai_recording_adapter, kai_order
):
    failure = OSError("disk unavailable")
    kai_flush_recorder.fail_with(failure)

    with pytest.raises(OSError) as raised:
        await drain(kai_host, kai_session)

    assert raised.value is failure
    assert kai_order == ["flush:start", "flush:failed"]
    assert kai_recording_adapter.requests == []


def test_no_kai_fixture_is_autouse(request):
    assert [name for name in request.fixturenames if name.startswith("kai_")] == []
"""


def test_a_user_suite_passes_on_asyncio_and_trio(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TESTS)

    result = pytester.runpytest_subprocess("-v", "-W", "error", "-p", "no:cacheprovider")

    result.assert_outcomes(passed=9)
    result.stdout.fnmatch_lines(
        [
            "*test_a_turn_is_checkpointed?asyncio? PASSED*",
            "*test_a_turn_is_checkpointed?trio? PASSED*",
        ],
        consecutive=False,
    )


def test_every_fixture_is_prefixed_and_listed(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--fixtures", "-p", "no:cacheprovider")

    output = result.stdout.str()
    section = output.split("fixtures defined from kai_session_checkpoint_policy.pytest_plugin")[1]
    section = re.split(r"\n-+ ", section)[0]
    names = re.findall(r"^(\w+)(?: \[.*\])? -- ", section, flags=re.MULTILINE)
    assert sorted(names) == [
        "kai_flush_recorder",
        "kai_host",
        "kai_order",
        "kai_recording_adapter",
        "kai_session",
    ]


def test_the_module_imports_the_package_only_inside_functions() -> None:
    tree = ast.parse(inspect.getsource(pytest_plugin))
    top_level: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            top_level += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            top_level.append("." * node.level + (node.module or ""))

    assert top_level == ["__future__", "collections", "functools", "typing", "anyio", "pytest"]


@pytest.mark.anyio
async def test_a_gate_holds_waiters_until_released() -> None:
    gate = pytest_plugin.Gate()
    passed: list[str] = []

    async def wait(name: str) -> None:
        await gate.wait()
        passed.append(name)

    async with anyio.create_task_group() as group:
        group.start_soon(wait, "early")
        await anyio.wait_all_tasks_blocked()
        assert passed == []
        assert gate.released is False
        gate.release()

    await wait("late")
    assert passed == ["early", "late"]
    assert gate.released is True
