"""A small reference host: sessions, model and tool runtimes, an agent loop, invariants.

It is one implementation of the host contract (:mod:`kai_session_checkpoint_policy.contract`)
among others; the policy and the backends use nothing of it but what the contract declares.
"""

from ..meta import SessionMeta, SessionMetaError
from ._hooks import HostHooks, MissingImplementationError
from ._host import AUTOLOAD_ENV, Host, HostOptionError, PersistenceConflictError
from .agent import Agent, PreStep, ToolCall, TurnOutcome
from .invariants import InvariantRegistrationError, InvariantRegistry, Registration
from .llm import LlmRuntime, ModelAdapter, UnknownProviderError
from .sessions import (
    HostStateError,
    Session,
    SessionError,
    SessionEvents,
    SessionNotLiveError,
    SessionStore,
    epoch_ms,
)
from .signals import AbortController, AbortError, AbortSignal
from .tools import Tool, ToolBody, ToolExecution, ToolRuntime, error_message

__all__ = [
    "AUTOLOAD_ENV",
    "AbortController",
    "AbortError",
    "AbortSignal",
    "Agent",
    "Host",
    "HostHooks",
    "HostOptionError",
    "HostStateError",
    "InvariantRegistrationError",
    "InvariantRegistry",
    "LlmRuntime",
    "MissingImplementationError",
    "ModelAdapter",
    "PersistenceConflictError",
    "PreStep",
    "Registration",
    "Session",
    "SessionError",
    "SessionEvents",
    "SessionMeta",
    "SessionMetaError",
    "SessionNotLiveError",
    "SessionStore",
    "Tool",
    "ToolBody",
    "ToolCall",
    "ToolExecution",
    "ToolRuntime",
    "TurnOutcome",
    "UnknownProviderError",
    "epoch_ms",
    "error_message",
]
