"""The invariant companion: reserves this package's name in the host's invariants registry.

The policy owns no mutable state of its own (its ordering is enforced where it wraps the hooks
and in the persistence backend), so the companion installs no runtime check. Holding the name
still matters: a second copy of the package registering it on the same host is an error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final
from weakref import WeakKeyDictionary

from .hookspecs import hookimpl

if TYPE_CHECKING:
    from .hookspecs import HostServices
    from .host.invariants import InvariantRegistry, Registration

name: Final = "session-checkpoint-policy-invariant"
inject: Final = ("invariants",)
PACKAGE_NAME: Final = "kai-session-checkpoint-policy"

_registrations: WeakKeyDictionary[InvariantRegistry, Registration] = WeakKeyDictionary()


@hookimpl
def host_configure(host: HostServices) -> None:
    invariants = host.invariants
    if invariants is not None:
        _registrations[invariants] = invariants.register(PACKAGE_NAME)


@hookimpl
def host_unconfigure(host: HostServices) -> None:
    invariants = host.invariants
    registration = None if invariants is None else _registrations.pop(invariants, None)
    if registration is not None:
        registration.release()
