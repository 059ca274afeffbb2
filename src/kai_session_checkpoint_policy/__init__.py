"""Semantic durability checkpoints for persisted LLM agents.

The :mod:`~kai_session_checkpoint_policy.policy` plugin flushes the session log before a model
request, before a top-level tool body, and at every agent step; the JSONL backend makes each
flush durable; recovery turns a recorded call without a result into ``TOOL_OUTCOME_UNKNOWN``.
"""

from . import invariant, policy
from .events import EVENT_TYPES, JSON, MAX_JSON_DEPTH, EventDataError, JSONObject, SessionEvent
from .hookspecs import PROJECT, HostServices, hookimpl
from .host import (
    AbortController,
    AbortSignal,
    Agent,
    Finish,
    Host,
    LlmRequest,
    PreStep,
    PreStepDecision,
    Session,
    SessionNotLiveError,
    SessionStore,
    TextDelta,
    Tool,
    ToolCallRequest,
    ToolExecution,
    TurnOutcome,
)
from .persistence import (
    CorruptLogError,
    JsonlSessionPersistence,
    PersistenceError,
    SessionHeader,
    SessionLockedError,
    SessionNotFoundError,
    StoredLog,
    UnsupportedFormatError,
    interrupted_turn_closers,
)
from .results import (
    ABORTED_BEFORE_DISPATCH,
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    ErrorInfo,
    TextBlock,
    ToolError,
    ToolResult,
    aborted_before_dispatch,
    error_result,
)

__all__ = [
    "ABORTED_BEFORE_DISPATCH",
    "EVENT_TYPES",
    "JSON",
    "MAX_JSON_DEPTH",
    "PROJECT",
    "TOOL_NOT_STARTED",
    "TOOL_OUTCOME_UNKNOWN",
    "AbortController",
    "AbortSignal",
    "Agent",
    "CorruptLogError",
    "ErrorInfo",
    "EventDataError",
    "Finish",
    "Host",
    "HostServices",
    "JSONObject",
    "JsonlSessionPersistence",
    "LlmRequest",
    "PersistenceError",
    "PreStep",
    "PreStepDecision",
    "Session",
    "SessionEvent",
    "SessionHeader",
    "SessionLockedError",
    "SessionNotFoundError",
    "SessionNotLiveError",
    "SessionStore",
    "StoredLog",
    "TextBlock",
    "TextDelta",
    "Tool",
    "ToolCallRequest",
    "ToolError",
    "ToolExecution",
    "ToolResult",
    "TurnOutcome",
    "UnsupportedFormatError",
    "aborted_before_dispatch",
    "error_result",
    "hookimpl",
    "interrupted_turn_closers",
    "invariant",
    "policy",
]
