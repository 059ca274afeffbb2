"""The invariant companion: reserves this package's name in the host's invariants registry.

The policy owns no mutable state of its own (its ordering is enforced where it wraps the hooks
and in the persistence backend), so the companion installs no runtime check. Holding the name
still matters: a second copy of the package registering it on the same host is an error.

The registration lives in the host's registry, with this module as its owner: the companion
keeps no state of its own, and serves any number of hosts.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Final

from .hookspecs import hookimpl

if TYPE_CHECKING:
    from .contract import HostServices

__all__ = ["PACKAGE_NAME", "inject", "name"]

name: Final = "session-checkpoint-policy-invariant"
inject: Final = ("invariants",)
PACKAGE_NAME: Final = "kai-session-checkpoint-policy"

_OWNER: Final = sys.modules[__name__]


@hookimpl
def host_configure(host: HostServices[Any]) -> None:
    invariants = host.invariants
    if invariants is not None:
        invariants.register(PACKAGE_NAME, owner=_OWNER)


@hookimpl
def host_unconfigure(host: HostServices[Any]) -> None:
    invariants = host.invariants
    if invariants is not None:
        invariants.release(PACKAGE_NAME, owner=_OWNER)
