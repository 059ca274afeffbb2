"""The invariant companion, and the invariants registry it reserves the package name in."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from kai_session_checkpoint_policy import Host, invariant
from kai_session_checkpoint_policy.host import InvariantRegistrationError, InvariantRegistry

pytestmark = pytest.mark.anyio

PACKAGE = "kai-session-checkpoint-policy"
DUPLICATE = f'invariants: package "{PACKAGE}" is already registered'


def test_the_companion_has_its_entry_point_shape() -> None:
    assert invariant.name == "session-checkpoint-policy-invariant"
    assert invariant.inject == ("invariants",)
    assert invariant.PACKAGE_NAME == PACKAGE
    (entry_point,) = entry_points(group="kai", name="session-checkpoint-policy-invariant")
    assert entry_point.load() is invariant


async def test_configuring_registers_the_package_name() -> None:
    host = Host([invariant])
    assert host.invariants is not None
    assert host.invariants.registered() == ()

    async with host:
        assert host.invariants.registered() == (PACKAGE,)

    assert host.invariants.registered() == ()


async def test_a_duplicate_registration_while_active_is_an_error() -> None:
    async with Host([invariant]) as host:
        assert host.invariants is not None

        with pytest.raises(InvariantRegistrationError) as raised:
            host.invariants.register(PACKAGE)

        assert str(raised.value) == DUPLICATE
        assert host.invariants.registered() == (PACKAGE,)


async def test_unregistering_the_companion_releases_the_name() -> None:
    async with Host([invariant]) as host:
        assert host.invariants is not None

        host.unregister(invariant)
        assert host.invariants.registered() == ()

        registration = host.invariants.register(PACKAGE)
        assert registration.active is True
        registration.release()

        host.register(invariant)
        assert host.invariants.registered() == (PACKAGE,)


async def test_each_host_has_its_own_registration() -> None:
    async with (
        Host([invariant]) as first,
        Host([invariant]) as second,
    ):
        assert first.invariants is not None
        assert second.invariants is not None
        assert first.invariants.registered() == (PACKAGE,)
        assert second.invariants.registered() == (PACKAGE,)

        first.unregister(invariant)
        assert first.invariants.registered() == ()
        assert second.invariants.registered() == (PACKAGE,)


async def test_the_companion_does_nothing_without_an_invariants_service() -> None:
    host = Host([invariant])
    host.invariants = None

    async with host:  # configuring it neither fails nor installs a registry
        assert host.pm.is_registered(invariant)
        host.unregister(invariant)
        assert not host.pm.is_registered(invariant)
        assert host.invariants is None


def test_the_registry_refuses_unusable_names() -> None:
    registry = InvariantRegistry()

    for name in ("", "has space", "tab\there"):
        with pytest.raises(InvariantRegistrationError) as raised:
            registry.register(name)
        assert str(raised.value) == (
            f"invariants: package name {name!r} must be non-empty without white space"
        )
    assert registry.registered() == ()


def test_a_failing_installer_releases_the_name() -> None:
    registry = InvariantRegistry()

    def install() -> None:
        raise RuntimeError("installer broke")

    with pytest.raises(RuntimeError, match=r"^installer broke$"):
        registry.register(PACKAGE, install=install)

    assert registry.registered() == ()
    assert registry.register(PACKAGE).active is True


def test_release_is_idempotent() -> None:
    registry = InvariantRegistry()
    registration = registry.register(PACKAGE)
    other = registry.register("other-package")

    registration.release()
    registration.release()

    assert registration.active is False
    assert other.active is True
    assert registry.registered() == ("other-package",)
