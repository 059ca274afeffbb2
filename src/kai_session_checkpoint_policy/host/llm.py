"""The LLM runtime: model adapters by provider, reached through the ``llm_stream`` hook."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, TypeAlias

from ..hookspecs import hookimpl

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable

    from ..contract import LlmRequest, StreamChunk
    from ..hookspecs import StreamThunk
    from ._hooks import HostHooks

__all__ = ["LlmRuntime", "ModelAdapter", "UnknownProviderError"]


ModelAdapter: TypeAlias = "Callable[[LlmRequest], AsyncGenerator[StreamChunk, None]]"
"""A model adapter: called with a request, returns the stream of the response's chunks."""


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
