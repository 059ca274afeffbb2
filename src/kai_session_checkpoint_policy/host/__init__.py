"""A small reference host: sessions, model and tool runtimes, an agent loop, invariants."""

from ._hooks import HostHooks, MissingImplementationError
from ._host import AUTOLOAD_ENV, Host, HostStateError
from .agent import Agent, PreStep, PreStepDecision, TurnOutcome
from .invariants import InvariantRegistrationError, InvariantRegistry, Registration
from .llm import (
    Finish,
    LlmRequest,
    LlmRuntime,
    ModelAdapter,
    StreamChunk,
    TextDelta,
    ToolCallRequest,
    UnknownProviderError,
)
from .sessions import Session, SessionError, SessionNotLiveError, SessionStore, epoch_ms
from .signals import AbortController, AbortError, AbortSignal
from .tools import Tool, ToolBody, ToolExecution, ToolRuntime, error_message

__all__ = [
    "AUTOLOAD_ENV",
    "AbortController",
    "AbortError",
    "AbortSignal",
    "Agent",
    "Finish",
    "Host",
    "HostHooks",
    "HostStateError",
    "InvariantRegistrationError",
    "InvariantRegistry",
    "LlmRequest",
    "LlmRuntime",
    "MissingImplementationError",
    "ModelAdapter",
    "PreStep",
    "PreStepDecision",
    "Registration",
    "Session",
    "SessionError",
    "SessionNotLiveError",
    "SessionStore",
    "StreamChunk",
    "TextDelta",
    "Tool",
    "ToolBody",
    "ToolCallRequest",
    "ToolExecution",
    "ToolRuntime",
    "TurnOutcome",
    "UnknownProviderError",
    "epoch_ms",
    "error_message",
]
