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

This module imports nothing from the rest of the package, so any host can use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "ABORTED",
    "ABORTED_BEFORE_DISPATCH",
    "NOT_STARTED_TEXT",
    "OUTCOME_UNKNOWN_TEXT",
    "TOOL_NOT_STARTED",
    "TOOL_OUTCOME_UNKNOWN",
    "UNKNOWN_TOOL",
    "ErrorInfo",
    "TextBlock",
    "ToolError",
    "ToolResult",
    "aborted_before_dispatch",
    "error_result",
    "not_started",
    "outcome_unknown",
]

ABORTED_BEFORE_DISPATCH: Final = "ABORTED_BEFORE_DISPATCH"
ABORTED: Final = "ABORTED"
TOOL_OUTCOME_UNKNOWN: Final = "TOOL_OUTCOME_UNKNOWN"
TOOL_NOT_STARTED: Final = "TOOL_NOT_STARTED"
UNKNOWN_TOOL: Final = "UNKNOWN_TOOL"

OUTCOME_UNKNOWN_TEXT: Final = (
    "the session stopped after this tool call started and before its result was saved, so it "
    "is not known whether the call took effect. Retry only if the operation is read-only or "
    "idempotent. If it may have had side effects, first verify the external state or ask the "
    "user. Do not retry blindly."
)
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
    """What a tool call produced: model-visible content, and the error if it failed."""

    content: tuple[TextBlock, ...]
    is_error: bool = False
    error: ToolError | None = None


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


def outcome_unknown() -> ToolResult:
    """Build the result of a call that started and whose outcome was never recorded."""
    return error_result(
        OUTCOME_UNKNOWN_TEXT, ErrorInfo(name="ToolOutcomeUnknownError", code=TOOL_OUTCOME_UNKNOWN)
    )


def not_started() -> ToolResult:
    """Build the result of a call the model asked for that was never recorded as started."""
    return error_result(
        NOT_STARTED_TEXT, ErrorInfo(name="ToolNotStartedError", code=TOOL_NOT_STARTED)
    )
