"""The reference host: entry-point plugins, registration, lifecycle hooks and cleanups."""

from __future__ import annotations

import importlib.util
import os
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest

from kai_session_checkpoint_policy import (
    Host,
    JsonlSessionPersistence,
    LlmRequest,
    NoPersistenceWarning,
    hookimpl,
    invariant,
    policy,
)
from kai_session_checkpoint_policy.host import (
    AUTOLOAD_ENV,
    HostStateError,
    MissingImplementationError,
)

from ..support.persistence_helpers import find_log

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from kai_session_checkpoint_policy import HostServices

pytestmark = pytest.mark.anyio

POLICY = "session-checkpoint-policy"
COMPANION = "session-checkpoint-policy-invariant"
JSONL = "session-persistence-jsonl"
JSONL_MODULE = "kai_session_checkpoint_policy.persistence.jsonl.plugin"


def jsonl_importable() -> bool:
    return importlib.util.find_spec(JSONL_MODULE) is not None


class Lifecycle:
    """Records its configure and unconfigure calls, and which host it saw."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log
        self.hosts: list[HostServices[Any]] = []

    @hookimpl
    def host_configure(self, host: HostServices[Any]) -> None:
        self.hosts.append(host)
        self.log.append(f"{self.name}:configure")

    @hookimpl
    def host_unconfigure(self, host: HostServices[Any]) -> None:
        self.log.append(f"{self.name}:unconfigure")


class ArgumentlessLifecycle:
    """Lifecycle hooks that take none of the hook's arguments, as pluggy allows."""

    name = "argumentless"

    def __init__(self, log: list[str]) -> None:
        self.log = log

    @hookimpl
    def host_configure(self) -> None:
        self.log.append("argumentless:configure")

    @hookimpl
    def host_unconfigure(self) -> None:
        self.log.append("argumentless:unconfigure")


class BrokenUnconfigure:
    name = "broken-unconfigure"

    @hookimpl
    def host_unconfigure(self) -> None:
        raise RuntimeError("unconfigure broke")


# Entry points


def test_the_package_declares_its_entry_points() -> None:
    declared = {ep.name: ep.value for ep in entry_points(group="kai")}

    assert declared[POLICY] == "kai_session_checkpoint_policy.policy"
    assert declared[COMPANION] == "kai_session_checkpoint_policy.invariant"
    assert declared[JSONL] == JSONL_MODULE


@pytest.mark.usefixtures("entry_point_autoload")
async def test_autoload_registers_the_policy_and_its_companion() -> None:
    block = () if jsonl_importable() else (JSONL,)

    with pytest.warns(NoPersistenceWarning, match="offers no session_persistence"):  # noqa: PT031
        async with Host(block=block) as host:
            assert host.pm.get_plugin(POLICY) is policy
            assert host.pm.get_plugin(COMPANION) is invariant
            assert host.invariants is not None
            assert host.invariants.registered() == ("kai-session-checkpoint-policy",)


@pytest.mark.usefixtures("entry_point_autoload")
async def test_autoload_registers_the_jsonl_backend() -> None:
    if not jsonl_importable():
        pytest.skip(f"the {JSONL} entry point's module {JSONL_MODULE} does not exist yet")
    plugin = importlib.import_module(JSONL_MODULE)

    with pytest.warns(NoPersistenceWarning):
        async with Host() as host:
            assert host.pm.get_plugin(JSONL) is plugin


def test_the_environment_variable_turns_autoload_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AUTOLOAD_ENV, "1")

    host = Host()

    assert host.pm.get_plugin(POLICY) is None
    assert host.pm.get_plugin(COMPANION) is None
    assert host.pm.get_plugin(JSONL) is None


@pytest.mark.usefixtures("entry_point_autoload")
def test_autoload_false_loads_no_entry_point() -> None:

    host = Host(autoload=False)

    assert sorted(name for name, _ in host.pm.list_name_plugin()) == [
        "kai-host-llm",
        "kai-host-pre-step",
        "kai-host-tools",
    ]


def test_the_suite_turns_autoload_off_for_every_host_it_builds() -> None:
    # tests/conftest.py sets the variable once for the run, so a host built here without the
    # ``autoload`` argument has only its built-in plugins, whatever is installed
    assert os.environ.get(AUTOLOAD_ENV) == "1"

    host = Host()

    assert sorted(name for name, _ in host.pm.list_name_plugin()) == [
        "kai-host-llm",
        "kai-host-pre-step",
        "kai-host-tools",
    ]


@pytest.mark.usefixtures("entry_point_autoload")
def test_a_blocked_entry_point_is_not_loaded_nor_registrable() -> None:
    block = (POLICY,) if jsonl_importable() else (POLICY, JSONL)

    host = Host(block=block)

    assert host.pm.is_blocked(POLICY)
    assert host.pm.get_plugin(POLICY) is None
    assert host.pm.get_plugin(COMPANION) is invariant
    with pytest.raises(ValueError, match=r"is blocked on this host$"):
        host.register(policy)


# Registration and lifecycle


async def test_plugins_are_configured_when_the_host_opens() -> None:
    log: list[str] = []
    early = Lifecycle("early", log)
    host = Host([early])
    assert log == []

    async with host:
        assert log == ["early:configure"]
        assert early.hosts == [host]

    assert log == ["early:configure", "early:unconfigure"]


async def test_a_plugin_registered_on_an_open_host_is_configured_at_once() -> None:
    log: list[str] = []
    async with Host() as host:
        late = Lifecycle("late", log)
        assert host.register(late) == "late"
        assert log == ["late:configure"]
        assert late.hosts == [host]


async def test_unregister_unconfigures_only_that_plugin() -> None:
    log: list[str] = []
    first, second = Lifecycle("first", log), Lifecycle("second", log)
    async with Host([first, second]) as host:
        log.clear()

        host.unregister(first)

        assert log == ["first:unconfigure"]
        assert host.pm.get_plugin("first") is None
        assert host.pm.get_plugin("second") is second
    assert log == ["first:unconfigure", "second:unconfigure"]


async def test_hooks_may_take_none_of_the_arguments() -> None:
    log: list[str] = []
    plugin = ArgumentlessLifecycle(log)
    async with Host([plugin]) as host:
        host.unregister(plugin)

    assert log == ["argumentless:configure", "argumentless:unconfigure"]


async def test_unregister_removes_the_plugin_even_if_unconfiguring_fails() -> None:
    plugin = BrokenUnconfigure()
    async with Host([plugin]) as host:
        with pytest.raises(RuntimeError, match=r"^unconfigure broke$"):
            host.unregister(plugin)

        assert host.pm.get_plugin("broken-unconfigure") is None


def test_unregister_before_opening_does_not_unconfigure() -> None:
    log: list[str] = []
    plugin = Lifecycle("never-opened", log)
    host = Host([plugin])

    host.unregister(plugin)

    assert log == []
    assert host.pm.get_plugin("never-opened") is None


async def test_closing_runs_cleanups_last_added_first_before_cancelling_background_work() -> None:
    log: list[str] = []

    async def background() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            log.append("background cancelled")

    def cleanup(name: str, *, fail: bool = False) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            log.append(name)
            if fail:
                raise RuntimeError(f"{name} broke")

        return run

    host = await Host([Lifecycle("plugin", log)]).__aenter__()
    host.task_group.start_soon(background)
    host.add_cleanup(cleanup("first"))
    host.add_cleanup(cleanup("second", fail=True))
    host.add_cleanup(cleanup("third"))
    await anyio.wait_all_tasks_blocked()

    with pytest.raises(RuntimeError, match=r"^second broke$"):
        await host.__aexit__(None, None, None)

    assert log == [
        "plugin:configure",
        "plugin:unconfigure",
        "third",
        "second",
        "first",
        "background cancelled",
    ]


async def test_a_host_is_used_only_while_open() -> None:
    host = Host()
    with pytest.raises(HostStateError, match=r"^the host is not open; use 'async with host:'$"):
        _ = host.task_group
    with pytest.raises(HostStateError):
        host.add_cleanup(anyio.lowlevel.checkpoint)

    async with host:
        pass

    with pytest.raises(HostStateError, match=r"^cannot register a plugin on a closed host$"):
        host.register(Lifecycle("too-late", []))
    with pytest.raises(HostStateError, match=r"^a host can be opened only once$"):
        async with host:
            pass


async def test_a_boundary_without_an_implementation_is_a_clear_error() -> None:
    async with Host() as host:
        host.pm.unregister(name="kai-host-llm")

        with pytest.raises(
            MissingImplementationError, match=r"^no plugin returned a thunk for llm_stream$"
        ):
            host.hooks.llm_stream(LlmRequest("mock", "mock"))


class FailingConfigure:
    name = "failing-configure"

    def __init__(self, log: list[str]) -> None:
        self.log = log

    @hookimpl
    def host_configure(self) -> None:
        raise ValueError("cannot configure")

    @hookimpl
    def host_unconfigure(self) -> None:
        self.log.append("failing-configure:unconfigure")


async def test_a_configure_hook_that_raises_leaves_nothing_entered() -> None:
    log: list[str] = []
    host = Host([Lifecycle("first", log), FailingConfigure(log)])
    cleanup_ran: list[str] = []

    @hookimpl
    def host_configure(host: Host) -> None:
        host.add_cleanup(lambda: _append(cleanup_ran, "cleanup"))

    host.register(type("AddsCleanup", (), {"host_configure": staticmethod(host_configure)})())
    with pytest.raises(ValueError, match="cannot configure"):
        async with host:
            pytest.fail("the block must not run")
    # Unconfigured and cleaned up again; the caller's cancel scopes still work.
    assert "failing-configure:unconfigure" in log
    with anyio.CancelScope() as scope:
        scope.cancel()
        await anyio.lowlevel.checkpoint()
    assert scope.cancelled_caught
    with pytest.raises(HostStateError, match="opened only once"):
        async with host:
            pass


async def _append(log: list[str], entry: str) -> None:
    log.append(entry)


async def test_an_exception_inside_the_host_comes_out_as_itself(tmp_path: Path) -> None:
    with pytest.raises(KeyError) as caught:  # noqa: PT012
        async with Host([JsonlSessionPersistence(tmp_path)]) as host:
            host.sessions.create("s").append("turn/start", {"turn": 1})  # a window timer runs
            raise KeyError("from the block")
    assert type(caught.value) is KeyError
    assert find_log(tmp_path, "s").exists()  # the close still drained the queue


async def test_a_cancelled_caller_still_drains_the_queues_at_close(tmp_path: Path) -> None:
    with anyio.CancelScope() as scope:
        async with Host([JsonlSessionPersistence(tmp_path)]) as host:
            for session_id in ("s1", "s2", "s3"):
                host.sessions.create(session_id).append("turn/start", {"turn": 1})
            scope.cancel()
            await anyio.lowlevel.checkpoint()
    assert scope.cancelled_caught
    backend = JsonlSessionPersistence(tmp_path)
    for session_id in ("s1", "s2", "s3"):
        stored = await backend.inspect(session_id)
        assert [event.type for event in stored.events] == ["turn/start"]
