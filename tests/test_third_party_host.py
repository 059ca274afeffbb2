"""A host of another author loads the entry points, gets its checkpoints, and resumes."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest

from kai_session_checkpoint_policy import JsonlSessionPersistence, eventdata
from kai_session_checkpoint_policy.hookspecs import hookimpl
from kai_session_checkpoint_policy.host import AUTOLOAD_ENV
from kai_session_checkpoint_policy.results import TOOL_OUTCOME_UNKNOWN

from .support import SUPPORT
from .support.third_party_host import Builtins, Invocation, MiniHost, resume

pytestmark = pytest.mark.anyio


@pytest.mark.usefixtures("entry_point_autoload")
async def test_a_host_of_its_own_is_durable_before_the_model_and_before_the_tool(
    tmp_path: Path,
) -> None:
    async with MiniHost(options={"jsonl.root": str(tmp_path)}) as host:
        names = {host.manager.get_name(plugin) for plugin in host.manager.get_plugins()}
        assert {
            "session-checkpoint-policy",
            "session-checkpoint-policy-invariant",
            "session-persistence-jsonl",
        } <= names
        assert host.invariants.release("kai-session-checkpoint-policy", owner=None) is False
        session = host.sessions.create("mini")
        answer = await host.run_turn(session, "Pay the invoice.")
        builtins = host.manager.get_plugin("mini-host-builtins")
        assert isinstance(builtins, Builtins)
    assert answer == "Paid."
    assert builtins.seen == [
        "model sees user/message durable",
        "tool sees tool/call durable",
        "model sees step/start durable",
    ]
    stored = await JsonlSessionPersistence(tmp_path).inspect("mini")
    assert [event.type for event in stored.events][-2:] == ["step/end", "turn/end"]


def test_the_host_uses_nothing_of_the_reference_host() -> None:
    from .test_contract import imported_modules

    imported = imported_modules(SUPPORT / "third_party_host.py")
    assert imported.isdisjoint({"host", "demo", "cli", "output"}), imported


class FailingListener:
    """A plugin registered after the backend, so it hears of every event first, and raises."""

    name = "failing-listener"

    @hookimpl
    def session_event(self) -> None:
        raise RuntimeError("this listener is broken")


async def test_a_failing_listener_keeps_no_event_from_the_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    async with MiniHost(options={"jsonl.root": str(tmp_path)}) as host:
        host.register(FailingListener())
        session = host.sessions.create("mini")
        with caplog.at_level(logging.ERROR):
            await host.run_turn(session, "Pay the invoice.")
        await host.sessions.close(session)
    stored = await JsonlSessionPersistence(tmp_path).inspect("mini")
    assert [event.seq for event in stored.events] == list(range(len(session.events)))
    assert stored.events[-1].type == "turn/end"
    failures = [record for record in caplog.records if record.exc_info]
    assert len(failures) == len(session.events)
    assert failures[0].getMessage() == "session_event of plugin 'failing-listener' failed"


async def test_a_session_resumed_after_a_crash_in_the_tool_goes_on_from_its_repair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    options = {"jsonl.root": str(tmp_path)}
    async with MiniHost(options=options) as host:
        session = host.sessions.create("mini")
        with anyio.CancelScope() as interrupted:

            async def pay(call: Invocation) -> str:
                interrupted.cancel()  # the turn stops inside the tool body, as at a crash
                await anyio.sleep_forever()
                raise AssertionError("not reached")

            host.builtins.tools["pay"] = pay
            await host.run_turn(session, "Pay the invoice.")
        assert interrupted.cancelled_caught
        assert session.events[-1].type == "tool/call"
    async with MiniHost(options=options) as host:
        resumed = await resume(host, "mini")
        repair = resumed.events[len(session.events) :]
        assert [event.type for event in repair] == ["tool/result", "step/end", "turn/end"]
        assert eventdata.error_of(repair[0].data) == {
            "name": "ToolOutcomeUnknownError",
            "code": TOOL_OUTCOME_UNKNOWN,
        }
        answer = await host.run_turn(resumed, "Did it go through?")
        await host.sessions.close(resumed)
    assert answer == "Paid."
    stored = await JsonlSessionPersistence(tmp_path).inspect("mini")
    assert stored.repair == ()
    assert [event.seq for event in stored.events] == list(range(len(resumed.events)))
    ends = [event.data for event in stored.events if event.type == "turn/end"]
    assert ends == [
        {"turn": 1, "reason": {"kind": "interrupted"}},
        {"turn": 2, "reason": {"kind": "completed"}},
    ]
