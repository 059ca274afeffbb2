"""A host of another author loads the entry points and gets its checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from kai_session_checkpoint_policy import JsonlSessionPersistence
from kai_session_checkpoint_policy.host import AUTOLOAD_ENV

from .third_party_host import Builtins, MiniHost

pytestmark = pytest.mark.anyio


async def test_a_host_of_its_own_is_durable_before_the_model_and_before_the_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
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

    imported = imported_modules(Path(__file__).with_name("third_party_host.py"))
    assert imported.isdisjoint({"host", "demo", "cli", "output"}), imported
