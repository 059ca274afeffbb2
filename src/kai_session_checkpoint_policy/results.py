"""Tool results and the canonical codes every host agrees on.

A tool call ends in exactly one :class:`ToolResult`. Three codes carry meaning across a crash:

``ABORTED_BEFORE_DISPATCH``
    The call was cancelled before its body started; nothing happened.
``TOOL_OUTCOME_UNKNOWN``
    The call was durably recorded as started, but no result was recorded: its side effect may
    or may not have happened.
``TOOL_NOT_STARTED``
    The model asked for the call, but the process died before the call was recorded as started.

The texts the model reads with them are this package's own; the codes and error names are the
ones every implementation of the protocol uses.

An unknown outcome says what a retry risks when the ``tool/call`` recorded the call's effect
class (:mod:`~kai_session_checkpoint_policy.effects`): the result carries it, and the call's
idempotency key, in :attr:`ToolResult.effect`, and its text is the one of that class
(:data:`OUTCOME_UNKNOWN_TEXTS`). A call recorded without a class (by a host that does not know
classes, or the original harness) gets the general text, :data:`OUTCOME_UNKNOWN_TEXT`.

This module imports nothing from the rest of the package, so any host can use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .effects import EffectClass

# The names of the effect classes and of the key argument, as ``effects`` defines them; spelled
# here so that loading the policy (which builds results) loads no more of the package.
_READ_ONLY: Final = "read-only"
_IDEMPOTENT: Final = "idempotent"
_SIDE_EFFECTING: Final = "side-effecting"
_OPEN_WORLD: Final = "open-world"
_IDEMPOTENCY_KEY_ARGUMENT: Final = "idempotency_key"

__all__ = [
    "ABORTED",
    "ABORTED_BEFORE_DISPATCH",
    "APPROVAL_REJECTED",
    "APPROVAL_UNAVAILABLE",
    "NOT_STARTED_TEXT",
    "OUTCOME_UNKNOWN_TEXT",
    "OUTCOME_UNKNOWN_TEXTS",
    "TOOL_NOT_STARTED",
    "TOOL_OUTCOME_UNKNOWN",
    "UNKNOWN_IDEMPOTENCY_KEY",
    "UNKNOWN_TOOL",
    "EffectInfo",
    "ErrorInfo",
    "TextBlock",
    "ToolError",
    "ToolResult",
    "aborted_before_dispatch",
    "error_result",
    "not_started",
    "outcome_unknown",
    "outcome_unknown_text",
]

ABORTED_BEFORE_DISPATCH: Final = "ABORTED_BEFORE_DISPATCH"
ABORTED: Final = "ABORTED"
TOOL_OUTCOME_UNKNOWN: Final = "TOOL_OUTCOME_UNKNOWN"
TOOL_NOT_STARTED: Final = "TOOL_NOT_STARTED"
UNKNOWN_TOOL: Final = "UNKNOWN_TOOL"
APPROVAL_REJECTED: Final = "APPROVAL_REJECTED"
"""The person asked to approve the call said no; the body did not run."""
APPROVAL_UNAVAILABLE: Final = "APPROVAL_UNAVAILABLE"
"""Nobody could be asked to approve the call (or asking failed); the body did not run."""
UNKNOWN_IDEMPOTENCY_KEY: Final = "UNKNOWN_IDEMPOTENCY_KEY"
"""A retry named an idempotency key this session never gave that tool; the body did not run."""

OUTCOME_UNKNOWN_TEXT: Final = (
    "the session stopped after this tool call started and before its result was saved, so it "
    "is not known whether the call took effect. Retry only if the operation is read-only or "
    "idempotent. If it may have had side effects, first verify the external state or ask the "
    "user. Do not retry blindly."
)
_STOPPED: Final = (
    "the session stopped after this tool call started and before its result was saved, so it "
    "is not known whether the call took effect."
)
OUTCOME_UNKNOWN_TEXTS: Final[Mapping[EffectClass, str]] = {
    _READ_ONLY: (
        "the session stopped after this tool call started and before its result was saved. "
        "The tool only reads: the call changed nothing, so it may simply be made again."
    ),
    _IDEMPOTENT: (
        f"{_STOPPED} The tool is idempotent: a repeat with the same idempotency key has no "
        "further effect. To retry, call it again with the same arguments and the argument "
        f'"{_IDEMPOTENCY_KEY_ARGUMENT}": "{{key}}".'
    ),
    _SIDE_EFFECTING: (
        f"{_STOPPED} The tool changes things, and calling it again may do so twice. First "
        "verify whether the change happened (look at the state it changes, or ask the user); "
        "retry only if it did not. This call's idempotency key is {key}: a retry that must "
        f'be recognized as the same call passes the argument "{_IDEMPOTENCY_KEY_ARGUMENT}": '
        '"{key}".'
    ),
    _OPEN_WORLD: (
        f"{_STOPPED} The tool acts outside this agent (other systems, other people), so its "
        "effect may be somewhere the agent cannot see or check. Do not retry it on your own: "
        "ask the user, or check with the system it reached. This call's idempotency key is "
        f'{{key}}; a retry of the same call passes the argument "{_IDEMPOTENCY_KEY_ARGUMENT}": '
        '"{key}".'
    ),
}
"""The text of an unknown outcome for each class; ``{key}`` stands for the call's key."""
_WITHOUT_KEY: Final[Mapping[EffectClass, str]] = {
    _IDEMPOTENT: (
        f"{_STOPPED} The tool is idempotent: calling it again with the same arguments has no "
        "further effect, so it may be retried."
    ),
    _SIDE_EFFECTING: (
        f"{_STOPPED} The tool changes things, and calling it again may do so twice. First "
        "verify whether the change happened (look at the state it changes, or ask the user); "
        "retry only if it did not."
    ),
    _OPEN_WORLD: (
        f"{_STOPPED} The tool acts outside this agent (other systems, other people), so its "
        "effect may be somewhere the agent cannot see or check. Do not retry it on your own: "
        "ask the user, or check with the system it reached."
    ),
}
NOT_STARTED_TEXT: Final = (
    "the session stopped before this tool call started, so it had no effect. It may be "
    "retried if it is still needed."
)


@dataclass(frozen=True, slots=True)
class TextBlock:
    """One block of text the model reads."""

    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class EffectInfo:
    """The effect class a call ran under, and its idempotency key if it had one."""

    effect: EffectClass
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """The machine-readable name and code of a failure."""

    name: str
    code: str


@dataclass(frozen=True, slots=True)
class ToolError:
    """Why a tool call failed: a message, and a code when the failure is a known kind."""

    message: str
    info: ErrorInfo | None = None


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool call produced: model-visible content, and the error if it failed.

    ``effect`` is set on an unknown outcome whose call's effect class is known.
    """

    content: tuple[TextBlock, ...]
    is_error: bool = False
    error: ToolError | None = None
    effect: EffectInfo | None = None


def error_result(message: str, info: ErrorInfo | None = None) -> ToolResult:
    """Build the ordinary error result, whose only text is ``Error: <message>``."""
    return ToolResult(
        content=(TextBlock(f"Error: {message}"),),
        is_error=True,
        error=ToolError(message, info),
    )


def aborted_before_dispatch() -> ToolResult:
    """Build the canonical result of a call cancelled before its body started."""
    return error_result(
        "tool call aborted before dispatch",
        ErrorInfo(name="AbortError", code=ABORTED_BEFORE_DISPATCH),
    )


def outcome_unknown_text(effect: EffectClass | None = None, key: str | None = None) -> str:
    """The text an unknown outcome of a call of class *effect* with key *key* shows.

    Without a class, the general text. A read-only call's text never names a key.
    """
    if effect is None:
        return OUTCOME_UNKNOWN_TEXT
    if key is None or effect == _READ_ONLY:
        return _WITHOUT_KEY.get(effect, OUTCOME_UNKNOWN_TEXTS[effect])
    return OUTCOME_UNKNOWN_TEXTS[effect].replace("{key}", key)


def outcome_unknown(effect: EffectClass | None = None, key: str | None = None) -> ToolResult:
    """Build the result of a call that started and whose outcome was never recorded.

    :param effect: The effect class the call ran under, if known: the result then carries it
        (with *key*) in its ``effect`` field, and its text says what a retry of that class
        risks. The code is ``TOOL_OUTCOME_UNKNOWN`` whatever the class.
    :param key: The call's idempotency key, if it had one.
    """
    info = ErrorInfo(name="ToolOutcomeUnknownError", code=TOOL_OUTCOME_UNKNOWN)
    result = error_result(outcome_unknown_text(effect, key), info)
    if effect is None:
        return result
    recorded_key = None if effect == _READ_ONLY else key
    return ToolResult(
        result.content, result.is_error, result.error, EffectInfo(effect, recorded_key)
    )


def not_started() -> ToolResult:
    """Build the result of a call the model asked for that was never recorded as started."""
    return error_result(
        NOT_STARTED_TEXT, ErrorInfo(name="ToolNotStartedError", code=TOOL_NOT_STARTED)
    )
