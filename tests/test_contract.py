"""The host contract: its dependency direction, and durability that never switches off silently."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

import pytest

from kai_session_checkpoint_policy import (
    Host,
    HostOptionError,
    HostStateError,
    JsonlSessionPersistence,
    NoPersistenceError,
    NoPersistenceWarning,
    PersistenceConflictError,
    policy,
)
from kai_session_checkpoint_policy.pytest_plugin import FlushRecorder

PACKAGE: Final = Path(__file__).resolve().parent.parent / "src" / "kai_session_checkpoint_policy"
CONTRACT_MODULES: Final = (
    "cancellation.py",
    "contract.py",
    "events.py",
    "hookspecs.py",
    "invariant.py",
    "policy.py",
    "results.py",
)
"""What a host loads to use the policy: nothing here may import what it describes."""
FORBIDDEN: Final = ("host", "persistence", "demo", "cli", "output", "pytest_plugin")


def imported_modules(path: Path) -> set[str]:
    """Every package module *path* imports, those under ``TYPE_CHECKING`` included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from .host import X, from . import policy
                module = node.module or ""
                found.add(module.split(".")[0] if module else "")
                if not module:
                    found.update(alias.name for alias in node.names)
            elif node.module and node.module.startswith("kai_session_checkpoint_policy."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("kai_session_checkpoint_policy."):
                    found.add(alias.name.split(".")[1])
    return found - {""}


@pytest.mark.parametrize("module", CONTRACT_MODULES)
def test_the_contract_policy_and_companion_import_nothing_they_describe(module: str) -> None:
    imported = imported_modules(PACKAGE / module)
    assert imported.isdisjoint(FORBIDDEN), sorted(imported & set(FORBIDDEN))


def test_the_import_check_sees_imports_under_type_checking(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .host.sessions import Session\n"
        "    from kai_session_checkpoint_policy.persistence import StoredLog\n"
        "from . import demo\n"
    )
    assert imported_modules(sample) == {"host", "persistence", "demo"}


@pytest.mark.anyio
async def test_the_policy_on_a_host_without_persistence_warns_naming_what_is_missing() -> None:
    with pytest.warns(NoPersistenceWarning) as warned:
        async with Host([policy]):
            pass
    (warning,) = warned
    assert str(warning.message) == (
        "the session-checkpoint-policy plugin is loaded, but the host offers no "
        "session_persistence: its checkpoints will make nothing durable, and a crash can lose "
        "what a tool did; load a persistence backend (with the host option 'jsonl.root', for "
        "the JSONL one), or set the host option 'checkpoint.require_persistence' to make this "
        "an error"
    )


@pytest.mark.anyio
async def test_the_host_can_require_durability() -> None:
    host = Host([policy], options={"checkpoint.require_persistence": True})
    with pytest.raises(NoPersistenceError, match=r"offers no session_persistence: .*is set\)$"):
        async with host:
            pytest.fail("the host must not open")
    assert not host.is_open


@pytest.mark.anyio
async def test_a_backend_is_all_the_policy_needs_to_stay_quiet(tmp_path: Path) -> None:
    options = {"checkpoint.require_persistence": True}
    async with Host([JsonlSessionPersistence(tmp_path), policy], options=options):
        pass


@pytest.mark.anyio
async def test_an_unknown_host_option_is_an_error_naming_it_and_the_known_ones() -> None:
    host = Host(options={"jsonl.roots": "/tmp/x"})
    from kai_session_checkpoint_policy.persistence.jsonl import plugin as jsonl_entry_point

    host.register(jsonl_entry_point)
    with pytest.raises(HostOptionError) as refused:
        async with host:
            pytest.fail("the host must not open")
    assert str(refused.value) == (
        "unknown host option 'jsonl.roots': the plugins of this host declare "
        "jsonl.batch_window, jsonl.compression, jsonl.inline_write_limit, jsonl.pack_chunks, "
        "jsonl.root, jsonl.shared_sync"
    )


@pytest.mark.anyio
async def test_sessions_are_used_while_the_host_is_open() -> None:
    host = Host()
    with pytest.raises(HostStateError, match=r"^the host is not open: use its sessions inside"):
        host.sessions.create("early")
    async with host:
        session = host.sessions.create("s")
    with pytest.raises(HostStateError, match="the host is not open"):
        await host.sessions.flush(session)
    with pytest.raises(HostStateError, match="the host is not open"):
        await host.sessions.resume("s")


@pytest.mark.anyio
async def test_a_second_persistence_provider_is_an_error_naming_both(tmp_path: Path) -> None:
    first, second = JsonlSessionPersistence(tmp_path / "a"), JsonlSessionPersistence(tmp_path / "b")
    host = Host([first])
    host.register(second, name="second-backend")
    with pytest.raises(PersistenceConflictError) as refused:
        async with host:
            pytest.fail("the host must not open")
    assert str(refused.value) == (  # pluggy configures the last registered plugin first
        f"{first!r} cannot be the host's session persistence: {second!r} already is "
        "(load one persistence backend per host)"
    )


@pytest.mark.anyio
async def test_the_flush_recorder_stands_in_only_where_no_backend_is(tmp_path: Path) -> None:
    backend, recorder = JsonlSessionPersistence(tmp_path), FlushRecorder()
    async with Host([backend, recorder.plugin, policy]) as host:
        assert host.session_persistence is backend


def test_the_demo_does_not_import_the_command_line_that_runs_it() -> None:
    for module in sorted((PACKAGE / "demo").glob("*.py")):
        assert "cli" not in imported_modules(module), module.name
    # Output prints events and the logs persistence reads (finding the unknown outcomes among
    # their results), and knows nothing of who calls it.
    assert imported_modules(PACKAGE / "output.py") == {
        "eventdata",
        "events",
        "persistence",
        "results",
    }


def test_the_package_logger_stays_quiet_without_a_handler_of_the_application() -> None:
    import logging

    handlers = logging.getLogger("kai_session_checkpoint_policy").handlers
    assert any(isinstance(handler, logging.NullHandler) for handler in handlers)


def test_a_plugin_without_a_name_is_registered_under_its_class_or_module_name() -> None:
    class Unnamed:
        pass

    host = Host()
    first, second = host.register(Unnamed()), host.register(Unnamed())
    qualified = f"{__name__}.{Unnamed.__qualname__}"
    assert first == qualified
    assert second.startswith(f"{qualified}#")
    from kai_session_checkpoint_policy.persistence.jsonl import plugin as jsonl_entry_point

    assert host.register(jsonl_entry_point) == "session-persistence-jsonl"


@pytest.mark.anyio
async def test_the_jsonl_root_option_takes_a_path(tmp_path: Path) -> None:
    from kai_session_checkpoint_policy.persistence.jsonl import plugin as jsonl_entry_point

    async with Host([jsonl_entry_point], options={"jsonl.root": tmp_path}) as host:
        assert isinstance(host.session_persistence, JsonlSessionPersistence)
        assert host.session_persistence.root == tmp_path


def test_the_reference_host_implements_the_contract_structurally() -> None:
    """Checked by mypy: each assignment fails to type-check if a member is missing or wrong."""
    from kai_session_checkpoint_policy import (
        AbortSignal,
        AbortSignalLike,
        Agent,
        AgentLike,
        InvariantsLike,
        LlmRequest,
        ModelRequestLike,
        PluginHost,
        PreStep,
        PreStepLike,
        Session,
        SessionLogLike,
        SessionPersistenceLike,
        SessionStore,
        SessionStoreLike,
        ToolCallLike,
        ToolExecution,
    )
    from kai_session_checkpoint_policy.host import InvariantRegistry

    implementations: list[tuple[type, type]] = [
        (Host, PluginHost),
        (SessionStore, SessionStoreLike),
        (Session, SessionLogLike),
        (Agent, AgentLike),
        (ToolExecution, ToolCallLike),
        (PreStep, PreStepLike),
        (LlmRequest, ModelRequestLike),
        (AbortSignal, AbortSignalLike),
        (InvariantRegistry, InvariantsLike),
        (JsonlSessionPersistence, SessionPersistenceLike),
    ]
    host: type[PluginHost[Session]] = Host
    store: type[SessionStoreLike[Session]] = SessionStore
    session: type[SessionLogLike] = Session
    agent: type[AgentLike[Session]] = Agent
    call: type[ToolCallLike[Session]] = ToolExecution
    step: type[PreStepLike[Session]] = PreStep
    request: type[ModelRequestLike] = LlmRequest
    signal: type[AbortSignalLike] = AbortSignal
    invariants: type[InvariantsLike] = InvariantRegistry
    backend: type[SessionPersistenceLike] = JsonlSessionPersistence
    checked = [host, store, session, agent, call, step, request, signal, invariants, backend]
    assert checked == [implementation for implementation, _protocol in implementations]
