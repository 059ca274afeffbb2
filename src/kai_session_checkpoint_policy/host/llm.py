"""The LLM runtime: model adapters by provider, reached through the ``llm_stream`` hook."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Literal, TypeAlias

from ..hookspecs import hookimpl

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable

    from ..events import JSONObject
    from ..hookspecs import StreamThunk
    from ._hooks import HostHooks

__all__ = [
    "Finish",
    "LlmRequest",
    "LlmRuntime",
    "ModelAdapter",
    "StreamChunk",
    "TextDelta",
    "ToolCallRequest",
    "UnknownProviderError",
]


@dataclass(frozen=True, slots=True)
class LlmRequest:
    """One model request: the route, the transcript, and the session it belongs to."""

    provider: str
    model: str
    messages: tuple[JSONObject, ...] = ()
    tools: tuple[str, ...] = ()
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the assistant's text."""

    text: str

    def to_json(self) -> JSONObject:
        return {"type": "text-delta", "text": self.text}


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """The model asks for one tool call; ``arguments`` is the raw JSON text it produced."""

    id: str
    name: str
    arguments: str = "{}"

    def to_json(self) -> JSONObject:
        return {"type": "tool-call", "id": self.id, "name": self.name, "arguments": self.arguments}


@dataclass(frozen=True, slots=True)
class Finish:
    """The end of a response, and why it ended."""

    reason: Literal["stop", "tool-calls", "max-tokens"]

    def to_json(self) -> JSONObject:
        return {"type": "finish", "reason": self.reason}


StreamChunk: TypeAlias = "TextDelta | ToolCallRequest | Finish"
ModelAdapter: TypeAlias = "Callable[[LlmRequest], AsyncGenerator[StreamChunk, None]]"


class UnknownProviderError(LookupError):
    """No adapter is registered for the requested provider."""


class LlmRuntime:
    """Registered model adapters; :meth:`stream` sends a request through the hook chain."""

    name = "kai-host-llm"

    def __init__(self, hooks: HostHooks) -> None:
        self._hooks = hooks
        self._adapters: dict[str, ModelAdapter] = {}

    def register_adapter(self, provider: str, adapter: ModelAdapter) -> None:
        """:raises ValueError: if *provider* already has an adapter."""
        if provider in self._adapters:
            raise ValueError(f"provider {provider!r} already has an adapter")
        self._adapters[provider] = adapter

    def stream(self, request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        """Build the ``llm_stream`` chain for *request* and start it."""
        return self._hooks.llm_stream(request)()

    @hookimpl(trylast=True)
    def llm_stream(self, request: LlmRequest) -> StreamThunk:
        adapter = self._adapters.get(request.provider)
        if adapter is None:
            raise UnknownProviderError(f"no model adapter for provider {request.provider!r}")
        return partial(adapter, request)
