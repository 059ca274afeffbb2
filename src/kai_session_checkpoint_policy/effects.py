"""Effect classes: what a tool call does to the world, and so what a retry after a crash risks.

Four classes, from the safest to retry to the least:

``read-only``
    The call changes nothing; after a crash it may simply be made again.
``idempotent``
    The call changes something, but making it again with the same idempotency key has no
    further effect; after a crash it may be retried with the key of the first call.
``side-effecting``
    The call changes something the agent can check, and a repeat repeats the change; after a
    crash the model must verify whether it happened before it calls again.
``open-world``
    The call reaches outside what the agent can see (a message sent, a payment made with a
    third party, another system); after a crash its effect may be nowhere the agent can look.
    This is the worst case, and the class of every tool that declares nothing.

A tool's author declares its class. Tools that come from elsewhere may carry MCP-style
annotations (``readOnlyHint``, ``idempotentHint``, ``destructiveHint``, ``openWorldHint``):
:func:`effect_from_annotations` reads them only when the host trusts their source, since a
server that lies about being read-only would otherwise make a payment look safe to repeat.

Every call of a class other than ``read-only`` gets an idempotency key,
:func:`idempotency_key`, derived from the session and the call the model first made: a retry
that names the key (the argument :data:`IDEMPOTENCY_KEY_ARGUMENT`) runs with the same key, so
a provider that deduplicates on it (an ``Idempotency-Key`` header) applies the effect once.

This module imports nothing from the rest of the package, so any host can use it.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Final, Literal, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "EFFECT_CLASSES",
    "IDEMPOTENCY_KEY_ARGUMENT",
    "IDEMPOTENT",
    "OPEN_WORLD",
    "READ_ONLY",
    "SIDE_EFFECTING",
    "WORST_EFFECT",
    "EffectClass",
    "effect_class",
    "effect_from_annotations",
    "idempotency_key",
    "parse_effect_class",
]

EffectClass: TypeAlias = Literal["read-only", "idempotent", "side-effecting", "open-world"]
"""The class of what a tool call does, as the ``effect`` field of ``tool/call`` records it."""

READ_ONLY: Final = "read-only"
IDEMPOTENT: Final = "idempotent"
SIDE_EFFECTING: Final = "side-effecting"
OPEN_WORLD: Final = "open-world"
WORST_EFFECT: Final = OPEN_WORLD
"""The class of a tool that declares nothing (or whose annotations are not trusted)."""

EFFECT_CLASSES: Final[tuple[EffectClass, ...]] = (READ_ONLY, IDEMPOTENT, SIDE_EFFECTING, OPEN_WORLD)
"""Every class, from the safest to retry to the least."""

IDEMPOTENCY_KEY_ARGUMENT: Final = "idempotency_key"
"""The argument by which a model's retry names the key of the call it repeats."""

_KEY_PREFIX: Final = "kai-idem-"


def parse_effect_class(value: object) -> EffectClass | None:
    """The class *value* names, or ``None`` if it names none (as read from a stored log)."""
    for known in EFFECT_CLASSES:
        if value == known:
            return known
    return None


def effect_class(value: str) -> EffectClass:
    """The class *value* names.

    :raises ValueError: naming the four classes, if *value* is none of them.
    """
    parsed = parse_effect_class(value)
    if parsed is None:
        names = ", ".join(repr(name) for name in EFFECT_CLASSES)
        raise ValueError(f"unknown effect class {value!r}: expected one of {names}")
    return parsed


def effect_from_annotations(annotations: Mapping[str, object], *, trusted: bool) -> EffectClass:
    """The class MCP-style tool *annotations* claim, if their source is *trusted*.

    Untrusted annotations claim nothing: the answer is :data:`WORST_EFFECT`, whatever they say.
    Trusted ones are read with the MCP defaults for what they leave out (not read-only, not
    idempotent, destructive, open-world): ``readOnlyHint`` makes a tool ``read-only``; else
    ``idempotentHint`` makes it ``idempotent``; else ``openWorldHint`` (true unless it is given
    as false) makes it ``open-world``; else it is ``side-effecting``, destructive or not.

    :raises ValueError: if a hint is given with a value that is not a boolean.
    """
    hints = ("readOnlyHint", "idempotentHint", "destructiveHint", "openWorldHint")
    for hint in hints:
        value = annotations.get(hint)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"tool annotation {hint} must be a boolean, not {value!r}")
    if not trusted:
        return WORST_EFFECT
    if annotations.get("readOnlyHint") is True:
        return READ_ONLY
    if annotations.get("idempotentHint") is True:
        return IDEMPOTENT
    if annotations.get("openWorldHint", True) is not False:
        return OPEN_WORLD
    return SIDE_EFFECTING


def idempotency_key(session_id: str, call_id: str) -> str:
    """The idempotency key of the call *call_id* the model made in session *session_id*.

    The same two ids always give the same key, and different ones different keys; the key is
    short, ASCII and fit for an HTTP header.
    """
    digest = hashlib.sha256(json.dumps([session_id, call_id]).encode()).hexdigest()
    return _KEY_PREFIX + digest[:32]
