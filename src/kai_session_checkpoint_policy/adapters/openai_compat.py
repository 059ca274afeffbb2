"""A model adapter that streams OpenAI-compatible chat completions over HTTP.

:class:`OpenAICompatibleModel` sends each model request (an
:class:`~kai_session_checkpoint_policy.contract.LlmRequest`) as
``POST {base_url}/chat/completions`` with ``"stream": true`` and reads the server-sent events
of the answer: OpenAI itself, DeepSeek, vLLM, Ollama's ``/v1`` and others that speak the same
protocol. The response becomes the chunks of the host contract, block by block::

    reasoning_content / reasoning  ->  BlockStart "reasoning", ReasoningDelta..., BlockEnd
    content                        ->  BlockStart "text", TextDelta..., BlockEnd
    tool_calls[i]                  ->  BlockStart "tool-call", ToolCallDelta... (the first
                                       one with the call's name), BlockEnd with the whole call
    finish_reason, then usage      ->  Usage (if the endpoint sent one), Finish

A response that does not end properly is not passed on as if it had: a refused request (an
HTTP status of 400 or more, 429 and 500 among them), a connection that closes before the
finish reason came, no data for longer than the read timeout, or a stream that is not what the
protocol says, ends the stream with a :class:`ModelStreamError` that names the endpoint and what
went wrong. The chunks already streamed stay streamed; a tool call whose arguments were still
arriving never gets its ``BlockEnd``, and the error reaches the agent before the response is
complete, so such a call never reaches a tool.

The API key is read from an environment variable (``OPENAI_API_KEY`` unless told otherwise)
at each request and sent as a bearer token; it is kept nowhere else, and never appears in an
error message, even when an endpoint quotes it back.
"""

from __future__ import annotations

import json
import os
from contextlib import AsyncExitStack, aclosing
from typing import TYPE_CHECKING, Final, Literal, NoReturn

import httpx

from ..contract import (
    BlockEnd,
    BlockStart,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from ..eventdata import texts_of

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Iterable, Mapping

    from ..contract import LlmRequest, StreamChunk
    from ..events import JSON, JSONObject

__all__ = [
    "DEFAULT_API_KEY_ENV",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_READ_TIMEOUT",
    "ModelStatusError",
    "ModelStreamError",
    "ModelTimeoutError",
    "OpenAICompatibleModel",
]

DEFAULT_API_KEY_ENV: Final = "OPENAI_API_KEY"
DEFAULT_READ_TIMEOUT: Final = 60.0
"""Seconds the adapter waits for the next bytes of a response before giving up on it."""
DEFAULT_CONNECT_TIMEOUT: Final = 10.0

_RESERVED: Final = frozenset({"model", "messages", "stream", "tools"})
_EXCERPT: Final = 500  # characters of a refusal's body shown in its error
_FINISH_KINDS: Final[dict[str, Literal["stop", "tool-calls", "max-tokens"]]] = {
    "stop": "stop",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "length": "max-tokens",
}


class ModelStreamError(Exception):
    """A model response that did not end properly; the message says where and how.

    ``url`` is the endpoint the request went to.
    """

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class ModelStatusError(ModelStreamError):
    """The endpoint refused the request with an HTTP status of 400 or more.

    ``status_code`` is that status; ``retry_after`` the ``Retry-After`` header, if it sent one.
    """

    def __init__(
        self, message: str, *, url: str, status_code: int, retry_after: str | None = None
    ) -> None:
        super().__init__(message, url=url)
        self.status_code = status_code
        self.retry_after = retry_after


class ModelTimeoutError(ModelStreamError, TimeoutError):
    """The endpoint could not be reached, or sent nothing, within the adapter's timeouts."""


class OpenAICompatibleModel:
    """A model adapter for an OpenAI-compatible chat completions endpoint.

    Register it with the host's LLM runtime for a provider name of your choice, and give the
    agent the endpoint's model name::

        host.llm.register_adapter("openai", OpenAICompatibleModel("https://api.openai.com/v1"))
        agent = Agent(host, session, provider="openai", model="gpt-4o-mini")

    ``base_url``
        The endpoint's base, to which ``/chat/completions`` is appended.
    ``api_key_env``
        The environment variable that holds the API key, read at each request; ``None``, or
        a variable that is unset or empty, sends no ``Authorization`` header (as a local
        server may want).
    ``read_timeout``
        Seconds without a byte of the response after which the request fails; the time
        between two events of a long answer counts, not the whole answer.
    ``connect_timeout``
        Seconds to connect and to send the request.
    ``instructions``
        A system message put before the transcript.
    ``options``
        Further fields of the request body (``temperature``, ``max_tokens``...); those the
        adapter writes itself (``model``, ``messages``, ``stream``, ``tools``) are refused.
    ``include_usage``
        Ask for the token usage at the end of the stream (``stream_options``); turn it off
        for an endpoint that rejects that field.
    ``client``
        An ``httpx.AsyncClient`` to send requests with, which the caller closes; without one,
        each request opens a client of its own and closes it when its stream ends.

    Reasoning the endpoint streams is recorded, but not sent back in later requests.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key_env: str | None = DEFAULT_API_KEY_ENV,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        instructions: str | None = None,
        options: Mapping[str, JSON] | None = None,
        include_usage: bool = True,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"base_url must be an http:// or https:// URL, not {base_url!r}")
        for name, seconds in (("read_timeout", read_timeout), ("connect_timeout", connect_timeout)):
            if not 0 < seconds < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds, not {seconds!r}")
        reserved = sorted(_RESERVED.intersection(options or {}))
        if reserved:
            raise ValueError(f"options may not set {', '.join(reserved)}: the adapter writes them")
        self.base_url = str(url).rstrip("/")
        self.api_key_env = api_key_env
        self.read_timeout = read_timeout
        self.connect_timeout = connect_timeout
        self.instructions = instructions
        self.options: dict[str, JSON] = dict(options or {})
        self.include_usage = include_usage
        self._client = client

    @property
    def url(self) -> str:
        """Where requests go: ``{base_url}/chat/completions``."""
        return f"{self.base_url}/chat/completions"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_shown(self.base_url)!r}, api_key_env={self.api_key_env!r})"

    def request_body(self, request: LlmRequest) -> JSONObject:
        """The JSON body sent for *request*.

        :raises ValueError: if a message of the transcript has a role the protocol lacks.
        """
        messages: list[JSON] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        messages += _chat_messages(request.messages)
        body: JSONObject = {"model": request.model, "messages": messages, "stream": True}
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        tools = _chat_tools(request.tools, request.tool_specs)
        if tools:
            body["tools"] = tools
        body.update(self.options)
        return body

    async def __call__(self, request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        body = self.request_body(request)
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        headers = {"Accept": "text/event-stream"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        where = _shown(self.url)
        stream = _Stream(where, key)
        timeout = httpx.Timeout(
            connect=self.connect_timeout,
            read=self.read_timeout,
            write=self.connect_timeout,
            pool=self.connect_timeout,
        )
        try:
            async with AsyncExitStack() as stack:
                client = self._client
                if client is None:
                    client = await stack.enter_async_context(httpx.AsyncClient())
                chunks = self._send(client, body, headers, timeout, stream)
                async for chunk in await stack.enter_async_context(aclosing(chunks)):
                    yield chunk
        except httpx.TimeoutException as exc:
            raise ModelTimeoutError(stream.timed_out(exc, self), url=where) from exc
        except httpx.TransportError as exc:
            raise ModelStreamError(stream.broken(exc), url=where) from exc

    async def _send(
        self,
        client: httpx.AsyncClient,
        body: JSONObject,
        headers: dict[str, str],
        timeout: httpx.Timeout,
        stream: _Stream,
    ) -> AsyncGenerator[StreamChunk, None]:
        async with client.stream(
            "POST", self.url, json=body, headers=headers, timeout=timeout
        ) as response:
            if response.status_code >= 400:
                await response.aread()
                stream.refused(response, self.api_key_env)
            stream.check_content_type(response)
            # The body is always read to its end, even past [DONE] or a malformed event: httpx's
            # line iterator stands on a stack of generators that only an exhausted (or failed)
            # read closes, and one left open would be finalized behind the event loop's back.
            end: list[StreamChunk] = []
            failure: ModelStreamError | None = None
            try:
                async for line in response.aiter_lines():
                    if failure is not None or stream.finished():
                        continue
                    try:
                        chunks = stream.feed_line(line)
                    except ModelStreamError as exc:
                        failure = exc
                        continue
                    if stream.finished():
                        end = chunks  # yielded once the body has ended
                        continue
                    for chunk in chunks:
                        yield chunk
            except httpx.TransportError:
                if failure is not None:
                    raise failure from None
                if not stream.finished():
                    raise
                # The response was complete: what broke after it is no concern of the caller.
            if failure is not None:
                raise failure
            if not stream.finished():
                end = stream.ended()
            for chunk in end:
                yield chunk


# -------------------------------------------------------------------------------------------
# The request
# -------------------------------------------------------------------------------------------


def _chat_tools(names: Iterable[str], specs: Iterable[ToolSpec]) -> list[JSON]:
    """The ``tools`` of the request: each spec, then each named tool without one."""
    described = {spec.name: spec for spec in specs}
    ordered = list(described.values())
    ordered += [ToolSpec(name) for name in dict.fromkeys(names) if name not in described]
    tools: list[JSON] = []
    for spec in ordered:
        function: JSONObject = {"name": spec.name}
        if spec.description:
            function["description"] = spec.description
        function["parameters"] = spec.parameters
        tools.append({"type": "function", "function": function})
    return tools


def _chat_messages(messages: Iterable[JSONObject]) -> list[JSON]:
    """The transcript in the protocol's roles: ``system``, ``user``, ``assistant``, ``tool``."""
    chat: list[JSON] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        blocks = (
            [block for block in content if isinstance(block, dict)]
            if isinstance(content, list)
            else []
        )
        if role == "assistant":
            chat.append(_assistant_message(blocks))
        elif role in ("user", "system"):
            chat += _user_messages(str(role), blocks)
        else:
            raise ValueError(
                f"message {message.get('id')!r} has role {role!r}; "
                "a chat completions request takes system, user and assistant messages"
            )
    return chat


def _assistant_message(blocks: list[dict[str, JSON]]) -> JSONObject:
    text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
    calls: list[JSON] = [
        {
            "id": block.get("id"),
            "type": "function",
            "function": {"name": block.get("name"), "arguments": block.get("arguments") or "{}"},
        }
        for block in blocks
        if block.get("type") == "tool-call"
    ]
    message: JSONObject = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    elif not text:
        message["content"] = ""
    return message


def _user_messages(role: str, blocks: list[dict[str, JSON]]) -> list[JSON]:
    """A user message's text, and each tool result in it as a ``tool`` message, in order."""
    chat: list[JSON] = []
    texts: list[str] = []

    def flush_text() -> None:
        if texts:
            chat.append({"role": role, "content": "".join(texts)})
            texts.clear()

    for block in blocks:
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif block.get("type") == "tool-result":
            flush_text()
            result = "\n".join(texts_of(block.get("content")))
            chat.append(
                {"role": "tool", "tool_call_id": block.get("toolCallId"), "content": result}
            )
    flush_text()
    return chat


# -------------------------------------------------------------------------------------------
# The response
# -------------------------------------------------------------------------------------------


class _Call:
    """A tool call of the response, as far as it has arrived."""

    __slots__ = ("arguments", "block", "id", "name")

    def __init__(self, block: int, call_id: str, name: str) -> None:
        self.block = block
        self.id = call_id
        self.name = name
        self.arguments: list[str] = []


class _Stream:
    """The server-sent events of one response, turned into stream chunks as they arrive."""

    def __init__(self, url: str, key: str | None) -> None:
        self.url = url
        self._key = key
        self.events = 0  # data events read
        self._done = False
        self._data: list[str] = []  # the data lines of the event being read
        self._blocks = 0  # block indexes given out
        self._open: tuple[str, int, list[str]] | None = None  # the text or reasoning block
        self._calls: dict[int, _Call] = {}  # by the protocol's tool call index
        self._finish: str | None = None
        self._has_calls = False
        self._usage: JSONObject | None = None

    def finished(self) -> bool:
        """Whether the response has ended: its finish reason, then ``[DONE]``."""
        return self._done

    # -- errors --------------------------------------------------------------------------------

    def _hide(self, text: str) -> str:
        """*text* without the API key, should an endpoint quote it back."""
        return text.replace(self._key, "<api key>") if self._key else text

    def _error(self, what: str) -> ModelStreamError:
        return ModelStreamError(self._hide(f"model endpoint {self.url}: {what}"), url=self.url)

    def _progress(self) -> str:
        """How far the response got, for an error that stops it."""
        if self.events == 0:
            return "before any event of the response"
        said = f"after {self.events} event{'s' if self.events != 1 else ''}"
        if self._finish is None and self._calls:
            call = list(self._calls.values())[-1]
            got = sum(map(len, call.arguments))
            said += (
                f", with the arguments of tool call {call.id} ({call.name}) incomplete "
                f"({got} characters so far)"
            )
        return said

    def timed_out(self, exc: httpx.TimeoutException, model: OpenAICompatibleModel) -> str:
        if isinstance(exc, httpx.ReadTimeout):
            what = f"no data for {model.read_timeout:g} s (the read timeout)"
        elif isinstance(exc, httpx.ConnectTimeout):
            what = f"could not connect within {model.connect_timeout:g} s"
        else:
            what = f"could not send the request within {model.connect_timeout:g} s"
        return self._hide(f"model endpoint {self.url}: {what}, {self._progress()}")

    def broken(self, exc: httpx.TransportError) -> str:
        if isinstance(exc, (httpx.ConnectError, httpx.UnsupportedProtocol, httpx.ProxyError)):
            what = f"could not connect ({str(exc) or type(exc).__name__})"
        else:
            what = f"the connection broke ({str(exc) or type(exc).__name__})"
        return self._hide(f"model endpoint {self.url}: {what}, {self._progress()}")

    def refused(self, response: httpx.Response, api_key_env: str | None) -> NoReturn:
        """Raise the :class:`ModelStatusError` of a response with an error status, read."""
        raw = response.content[: 4 * _EXCERPT]
        status = response.status_code
        message = f"model endpoint {self.url} answered HTTP {status} {response.reason_phrase}"
        detail = _error_detail(raw.decode(errors="replace"))
        if detail:
            message += f": {detail}"
        retry_after = response.headers.get("retry-after")
        if retry_after is not None:
            message += f" (retry after {retry_after} s)"
        if status == 401 and not self._key and api_key_env:
            message += f"; no API key was sent: the environment variable {api_key_env} is unset"
        raise ModelStatusError(
            self._hide(message), url=self.url, status_code=status, retry_after=retry_after
        )

    def check_content_type(self, response: httpx.Response) -> None:
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "text/event-stream":
            raise self._error(
                f"answered with {kind or 'no content type'}, not an event stream "
                "(text/event-stream): is it an OpenAI-compatible endpoint?"
            )

    # -- reading -------------------------------------------------------------------------------

    def feed_line(self, line: str) -> list[StreamChunk]:
        """Take one line of the event stream; return the chunks it completes."""
        if line.startswith(":"):
            return []  # a comment: a keep-alive
        if line:
            field, _, value = line.partition(":")
            if field == "data":
                self._data.append(value[1:] if value.startswith(" ") else value)
            return []  # event, id, retry: nothing the protocol uses
        if not self._data:
            return []
        data = "\n".join(self._data)
        self._data.clear()
        return self._event(data)

    def ended(self) -> list[StreamChunk]:
        """The connection closed without ``[DONE]``: finish if the response did, else raise."""
        chunks = self.feed_line("")  # an event the stream did not end with a blank line
        if self._done:
            return chunks
        if self._finish is None:
            raise self._error(
                f"the connection closed before the response finished, {self._progress()}"
            )
        return chunks + self._complete()

    def _event(self, data: str) -> list[StreamChunk]:
        if data.strip() == "[DONE]":
            if self._finish is None:
                raise self._error(
                    f"the stream ended ([DONE]) without a finish reason, {self._progress()}"
                )
            return self._complete()
        self.events += 1
        try:
            payload = json.loads(data)
        except ValueError:
            raise self._error(
                f"event {self.events} of the stream is not JSON: {_excerpt(data)!r}"
            ) from None
        if not isinstance(payload, dict):
            raise self._error(f"event {self.events} of the stream is not a JSON object")
        if "error" in payload:
            detail = _error_detail(json.dumps(payload)) or "no message"
            raise self._error(f"sent an error in the stream, {self._progress()}: {detail}")
        chunks: list[StreamChunk] = []
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self._usage = _usage(usage)
        choices = payload.get("choices")
        if not isinstance(choices, list):
            raise self._error(f"event {self.events} of the stream has no list of choices")
        for choice in choices:
            if not isinstance(choice, dict) or not isinstance(choice.get("delta") or {}, dict):
                raise self._error(f"event {self.events} of the stream has a malformed choice")
            if choice.get("index", 0) != 0:
                raise self._error(
                    f"event {self.events} of the stream has choice {choice.get('index')!r}: "
                    "the adapter reads one choice (do not ask for n > 1)"
                )
            chunks += self._choice(choice)
        return chunks

    def _choice(self, choice: dict[str, JSON]) -> list[StreamChunk]:
        delta = choice.get("delta") or {}
        assert isinstance(delta, dict)
        reasoning = delta.get("reasoning_content")
        if not isinstance(reasoning, str):
            reasoning = delta.get("reasoning")
        content = delta.get("content")
        calls = delta.get("tool_calls")
        chunks: list[StreamChunk] = []
        if self._finish is not None and (reasoning or content or calls):
            raise self._error(f"event {self.events} of the stream goes on after the finish reason")
        if isinstance(reasoning, str) and reasoning:
            index = self._text_block("reasoning", chunks)
            chunks.append(ReasoningDelta(reasoning, index))
            self._text(reasoning)
        if isinstance(content, str) and content:
            index = self._text_block("text", chunks)
            chunks.append(TextDelta(content, index))
            self._text(content)
        if calls is not None:
            if not isinstance(calls, list):
                raise self._error(
                    f"event {self.events} of the stream has tool_calls that are not a list"
                )
            for call in calls:
                chunks += self._call_delta(call)
        finish = choice.get("finish_reason")
        if finish is not None:
            chunks += self._finished(str(finish))
        return chunks

    def _text(self, text: str) -> None:
        assert self._open is not None
        self._open[2].append(text)

    def _text_block(self, kind: str, chunks: list[StreamChunk]) -> int:
        """The index of the open block of *kind*; the block before it ends, a new one starts."""
        if self._open is not None and self._open[0] == kind:
            return self._open[1]
        chunks += self._close_text()
        index = self._new_block()
        self._open = (kind, index, [])
        chunks.append(BlockStart(index, kind))
        return index

    def _close_text(self) -> list[StreamChunk]:
        if self._open is None:
            return []
        kind, index, texts = self._open
        self._open = None
        return [BlockEnd(index, {"type": kind, "text": "".join(texts)})]

    def _new_block(self) -> int:
        self._blocks += 1
        return self._blocks - 1

    def _call_delta(self, delta: JSON) -> list[StreamChunk]:
        if not isinstance(delta, dict):
            raise self._error(f"event {self.events} of the stream has a malformed tool call")
        position = delta.get("index")
        function = delta.get("function") or {}
        if not isinstance(function, dict):
            raise self._error(f"event {self.events} of the stream has a malformed tool call")
        if not isinstance(position, int) or isinstance(position, bool):
            # Some endpoints send whole calls without an index: a new id is a new call.
            known = [n for n, c in self._calls.items() if c.id == delta.get("id")]
            position = known[0] if known else len(self._calls)
        arguments = function.get("arguments")
        piece = arguments if isinstance(arguments, str) else ""
        call = self._calls.get(position)
        chunks: list[StreamChunk] = []
        if call is None:
            call_id, name = delta.get("id"), function.get("name")
            if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name):
                raise self._error(
                    f"event {self.events} of the stream starts tool call {position} without "
                    "its id and name"
                )
            chunks += self._close_text()
            call = self._calls[position] = _Call(self._new_block(), call_id, name)
            self._has_calls = True
            chunks.append(BlockStart(call.block, "tool-call"))
            chunks.append(ToolCallDelta(call.block, call_id, piece, name))
        elif piece:
            chunks.append(ToolCallDelta(call.block, call.id, piece))
        call.arguments.append(piece)
        return chunks

    def _finished(self, reason: str) -> list[StreamChunk]:
        self._finish = reason
        chunks = self._close_text()
        for call in self._calls.values():
            arguments = "".join(call.arguments)
            if reason == "length" and not _is_json(arguments):
                raise self._error(
                    f"the response reached its token limit inside tool call {call.id} "
                    f"({call.name}): its arguments are incomplete"
                )
            block: JSONObject = {
                "type": "tool-call",
                "id": call.id,
                "name": call.name,
                "arguments": arguments,
            }
            chunks.append(BlockEnd(call.block, block))
        self._calls.clear()
        return chunks

    def _complete(self) -> list[StreamChunk]:
        self._done = True
        chunks: list[StreamChunk] = []
        if self._usage is not None:
            chunks.append(Usage(self._usage))
        reason = self._finish or "stop"
        if reason == "content_filter":
            failure: JSONObject = {
                "code": "content_filter",
                "message": "the endpoint's content filter stopped the response",
            }
            chunks.append(Finish("error", failure))
        elif reason == "length":
            chunks.append(Finish("max-tokens"))
        else:
            chunks.append(
                Finish("tool-calls" if self._has_calls else _FINISH_KINDS.get(reason, "stop"))
            )
        return chunks


def _usage(usage: dict[str, JSON]) -> JSONObject:
    """The token counts of an OpenAI ``usage`` object, under the names the log uses."""
    mapped: JSONObject = {}
    for name, ours in (
        ("prompt_tokens", "inputTokens"),
        ("completion_tokens", "outputTokens"),
        ("total_tokens", "totalTokens"),
    ):
        if isinstance(usage.get(name), int):
            mapped[ours] = usage[name]
    prompt = usage.get("prompt_tokens_details")
    cached = prompt.get("cached_tokens") if isinstance(prompt, dict) else None
    if not isinstance(cached, int):
        cached = usage.get("prompt_cache_hit_tokens")  # DeepSeek
    if isinstance(cached, int):
        mapped["cacheReadTokens"] = cached
    completion = usage.get("completion_tokens_details")
    reasoning = completion.get("reasoning_tokens") if isinstance(completion, dict) else None
    if isinstance(reasoning, int):
        mapped["reasoningTokens"] = reasoning
    return mapped


def _is_json(text: str) -> bool:
    try:
        json.loads(text or "{}")
    except ValueError:
        return False
    return True


def _error_detail(body: str) -> str:
    """The message of an error body (``{"error": {"message": ...}}``), or an excerpt of it."""
    try:
        payload = json.loads(body)
    except ValueError:
        return _excerpt(" ".join(body.split()))
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return _excerpt(str(error["message"]))
    if isinstance(error, str):
        return _excerpt(error)
    return _excerpt(" ".join(body.split()))


def _excerpt(text: str) -> str:
    return text if len(text) <= _EXCERPT else f"{text[:_EXCERPT]}..."


def _shown(url: str) -> str:
    """*url* without a user name or password in it."""
    parsed = httpx.URL(url)
    return str(parsed.copy_with(userinfo=b"")) if parsed.userinfo else url
