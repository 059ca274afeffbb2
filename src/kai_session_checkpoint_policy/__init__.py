"""Semantic durability checkpoints for persisted LLM agents.

The :mod:`~kai_session_checkpoint_policy.policy` plugin flushes the session log before a model
request, before a top-level tool body, and at every agent step; a persistence backend
(:class:`JsonlSessionPersistence` for a directory, :class:`PostgresSessionPersistence` for a
database many hosts share) makes each flush durable; recovery turns a recorded call without a
result into ``TOOL_OUTCOME_UNKNOWN``.

The names below are imported when first used, so that loading the policy's entry point (which
imports this package) does not import the reference host or the persistence backends.
"""

import importlib as _importlib
import logging as _logging
import typing as _typing

if _typing.TYPE_CHECKING:
    from . import invariant, policy
    from .contract import (
        AbortSignalLike,
        AgentLike,
        BlockEnd,
        BlockStart,
        Finish,
        HostServices,
        InvariantsLike,
        LlmRequest,
        ModelRequestLike,
        PersistenceLike,
        PluginHost,
        PreStepDecision,
        PreStepLike,
        ReasoningDelta,
        SessionExistsError,
        SessionLike,
        SessionLogLike,
        SessionPersistenceLike,
        SessionStoreLike,
        StoredSessionLike,
        StreamChunk,
        TextDelta,
        ToolCallDelta,
        ToolCallLike,
        ToolSpec,
        Usage,
        text_block,
        tool_call_block,
    )
    from .effects import EffectClass
    from .events import (
        EVENT_TYPES,
        JSON,
        MAX_JSON_DEPTH,
        EventDataError,
        JSONObject,
        SessionEvent,
        StoredDataError,
        StoredEvents,
    )
    from .hookspecs import PROJECT, hookimpl
    from .host import (
        AbortController,
        AbortSignal,
        Agent,
        Host,
        HostOptionError,
        HostStateError,
        ModelAdapter,
        PersistenceConflictError,
        PreStep,
        Session,
        SessionError,
        SessionEvents,
        SessionNotLiveError,
        SessionStore,
        Tool,
        ToolCall,
        ToolExecution,
        TurnOutcome,
    )
    from .host.approvals import ApprovalOutcome, ApprovalQuestion, Approver
    from .meta import SessionMeta, SessionMetaError
    from .persistence import (
        CorruptLogError,
        EncodingMismatchError,
        JsonlSessionPersistence,
        NotARegularFileError,
        PersistenceError,
        PostgresSessionPersistence,
        SeedMismatchError,
        SeqMismatchError,
        SessionHeader,
        SessionListing,
        SessionLockedError,
        SessionNotFoundError,
        SessionPersistence,
        SessionProblem,
        StoredLog,
        UnsupportedFormatError,
        interrupted_turn_closers,
    )
    from .policy import NoPersistenceError, NoPersistenceWarning
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
        not_started,
        outcome_unknown,
    )

    __version__: str

_logging.getLogger(__name__).addHandler(_logging.NullHandler())

_LAZY: _typing.Final = {
    "invariant": ".invariant",
    "policy": ".policy",
    "AbortSignalLike": ".contract",
    "AgentLike": ".contract",
    "BlockEnd": ".contract",
    "BlockStart": ".contract",
    "Finish": ".contract",
    "HostServices": ".contract",
    "InvariantsLike": ".contract",
    "LlmRequest": ".contract",
    "ModelRequestLike": ".contract",
    "PersistenceLike": ".contract",
    "PluginHost": ".contract",
    "PreStepDecision": ".contract",
    "PreStepLike": ".contract",
    "ReasoningDelta": ".contract",
    "SessionExistsError": ".contract",
    "SessionLike": ".contract",
    "SessionLogLike": ".contract",
    "SessionPersistenceLike": ".contract",
    "SessionStoreLike": ".contract",
    "StoredSessionLike": ".contract",
    "StreamChunk": ".contract",
    "TextDelta": ".contract",
    "ToolCallDelta": ".contract",
    "ToolCallLike": ".contract",
    "ToolSpec": ".contract",
    "Usage": ".contract",
    "text_block": ".contract",
    "tool_call_block": ".contract",
    "EVENT_TYPES": ".events",
    "JSON": ".events",
    "MAX_JSON_DEPTH": ".events",
    "EventDataError": ".events",
    "JSONObject": ".events",
    "SessionEvent": ".events",
    "StoredDataError": ".events",
    "StoredEvents": ".events",
    "PROJECT": ".hookspecs",
    "hookimpl": ".hookspecs",
    "AbortController": ".host",
    "AbortSignal": ".host",
    "Agent": ".host",
    "Host": ".host",
    "HostOptionError": ".host",
    "HostStateError": ".host",
    "ModelAdapter": ".host",
    "PersistenceConflictError": ".host",
    "PreStep": ".host",
    "Session": ".host",
    "SessionError": ".host",
    "SessionEvents": ".host",
    "SessionNotLiveError": ".host",
    "SessionStore": ".host",
    "Tool": ".host",
    "ToolCall": ".host",
    "ToolExecution": ".host",
    "TurnOutcome": ".host",
    "CorruptLogError": ".persistence",
    "JsonlSessionPersistence": ".persistence",
    "NotARegularFileError": ".persistence",
    "PersistenceError": ".persistence",
    "PostgresSessionPersistence": ".persistence",
    "SeqMismatchError": ".persistence",
    "SessionHeader": ".persistence",
    "SessionListing": ".persistence",
    "SessionLockedError": ".persistence",
    "SessionNotFoundError": ".persistence",
    "SessionPersistence": ".persistence",
    "SessionProblem": ".persistence",
    "StoredLog": ".persistence",
    "UnsupportedFormatError": ".persistence",
    "interrupted_turn_closers": ".persistence",
    "NoPersistenceError": ".policy",
    "NoPersistenceWarning": ".policy",
    "ABORTED_BEFORE_DISPATCH": ".results",
    "TOOL_NOT_STARTED": ".results",
    "TOOL_OUTCOME_UNKNOWN": ".results",
    "ErrorInfo": ".results",
    "TextBlock": ".results",
    "ToolError": ".results",
    "ToolResult": ".results",
    "aborted_before_dispatch": ".results",
    "error_result": ".results",
    "not_started": ".results",
    "outcome_unknown": ".results",
    "SessionMeta": ".meta",
    "SessionMetaError": ".meta",
    "SeedMismatchError": ".persistence",
    "EncodingMismatchError": ".persistence",
    "EffectClass": ".effects",
    "ApprovalQuestion": ".host.approvals",
    "Approver": ".host.approvals",
    "ApprovalOutcome": ".host.approvals",
}
"""Where each name of the package root is defined: imported from there when first used."""

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
    "AbortSignalLike",
    "Agent",
    "AgentLike",
    "ApprovalOutcome",
    "ApprovalQuestion",
    "Approver",
    "BlockEnd",
    "BlockStart",
    "CorruptLogError",
    "EffectClass",
    "EncodingMismatchError",
    "ErrorInfo",
    "EventDataError",
    "Finish",
    "Host",
    "HostOptionError",
    "HostServices",
    "HostStateError",
    "InvariantsLike",
    "JSONObject",
    "JsonlSessionPersistence",
    "LlmRequest",
    "ModelAdapter",
    "ModelRequestLike",
    "NoPersistenceError",
    "NoPersistenceWarning",
    "NotARegularFileError",
    "PersistenceConflictError",
    "PersistenceError",
    "PersistenceLike",
    "PluginHost",
    "PostgresSessionPersistence",
    "PreStep",
    "PreStepDecision",
    "PreStepLike",
    "ReasoningDelta",
    "SeedMismatchError",
    "SeqMismatchError",
    "Session",
    "SessionError",
    "SessionEvent",
    "SessionEvents",
    "SessionExistsError",
    "SessionHeader",
    "SessionLike",
    "SessionListing",
    "SessionLockedError",
    "SessionLogLike",
    "SessionMeta",
    "SessionMetaError",
    "SessionNotFoundError",
    "SessionNotLiveError",
    "SessionPersistence",
    "SessionPersistenceLike",
    "SessionProblem",
    "SessionStore",
    "SessionStoreLike",
    "StoredDataError",
    "StoredEvents",
    "StoredLog",
    "StoredSessionLike",
    "StreamChunk",
    "TextBlock",
    "TextDelta",
    "Tool",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallLike",
    "ToolError",
    "ToolExecution",
    "ToolResult",
    "ToolSpec",
    "TurnOutcome",
    "UnsupportedFormatError",
    "Usage",
    "__version__",
    "aborted_before_dispatch",
    "error_result",
    "hookimpl",
    "interrupted_turn_closers",
    "invariant",
    "not_started",
    "outcome_unknown",
    "policy",
    "text_block",
    "tool_call_block",
]


def _load(name: str) -> object:
    """Import *name* from where it is defined, and keep it here for the next time."""
    if name == "__version__":
        from importlib.metadata import version

        value: object = version("kai-session-checkpoint-policy")
    else:
        module_name = _LAZY.get(name)
        if module_name is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        module = _importlib.import_module(module_name, __name__)
        value = module if module_name == f".{name}" else getattr(module, name)
    globals()[name] = value
    return value


if not _typing.TYPE_CHECKING:  # type checkers see the imports above, and catch a misspelt name
    __getattr__ = _load


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
