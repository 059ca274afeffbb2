"""What the ``data`` of each event type holds: typed shapes, and functions to build and read them.

The shapes are those of the original harness's session format (its agent loop writes them,
and its reader checks the messages), so a log written here is read there and the other way
round. Everything that writes event data (the agent loop, crash repair) builds it with the
functions below, and everything that reads it (repair, the command line, the demo) reads it
with the ``*_of`` functions, which never trust a stored shape: a field that is missing or of
another type reads as ``None`` (or empty).

======================  ===================================================================
type                    ``data``
======================  ===================================================================
``turn/start``          :class:`TurnStartData`
``step/start``          :class:`StepData` (``step/end`` too)
``user/message``        the message itself, a :class:`UserMessage`
``request/header``      :class:`RequestHeaderData`
``request/context``     :class:`RequestContextData`
``assistant/chunk``     :class:`AssistantChunkData`: one chunk of the response stream, in the
                        shapes of :data:`~kai_session_checkpoint_policy.contract.StreamChunk`
``assistant/message``   :class:`AssistantMessageData`
``tool/call``           :class:`ToolCallData`: the call started (written before its body runs)
``tool/result``         :class:`ToolResultData`
``turn/end``            :class:`TurnEndData`
======================  ===================================================================

The message ids (``user-<turn>``, ``assistant-<turn>-<step>``, ``tool-result-<call id>``) and
the texts a model reads are this package's own; a result made by crash repair is marked as
such in its id (``interrupted-tool-result-<call id>-<seq>``, as the original names it).

Two fields are this package's own, and optional: ``tool/call`` may record the effect class the
call ran under (``effect``) and its idempotency key (``idempotencyKey``), and an unknown-outcome
``tool/result`` the same pair as ``effect: {"class", "idempotencyKey"}``. The original's reader
passes event data through as it is, so it reads a log that has them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypedDict, cast

from .effects import parse_effect_class

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .effects import EffectClass
    from .events import JSON, JSONObject
    from .results import ToolResult

__all__ = [
    "AssistantChunkData",
    "AssistantMessage",
    "AssistantMessageData",
    "ErrorData",
    "MessageSource",
    "RequestContextData",
    "RequestHeaderData",
    "StepData",
    "ToolCallData",
    "ToolResultBlock",
    "ToolResultData",
    "ToolResultMessage",
    "TurnEndData",
    "TurnStartData",
    "UserMessage",
    "assistant_chunk",
    "assistant_message",
    "chunk_of",
    "error_of",
    "interrupted_result_id",
    "message_of",
    "request_context",
    "request_header",
    "result_call_id",
    "step_data",
    "texts_of",
    "tool_call",
    "tool_call_ids",
    "tool_result",
    "turn_end",
    "turn_start",
    "user_message",
]


class TurnStartData(TypedDict):
    turn: int


class StepData(TypedDict):
    """The data of ``step/start`` and ``step/end``."""

    turn: int
    step: int


class MessageSource(TypedDict, total=False):
    """Where a message comes from: ``kind`` always, the route of a model, the call of a tool."""

    kind: str
    provider: str
    model: str
    callId: str


class UserMessage(TypedDict):
    id: str
    role: Literal["user"]
    content: list[JSON]
    source: MessageSource


class RequestHeaderData(TypedDict):
    header: JSONObject
    """``{"config": {"provider", "model"}, "tools": [...]}``."""
    reason: str
    """``"initial"``, or ``"resume"`` for a session that had a header before."""


class RequestContextData(TypedDict):
    provider: str
    model: str


class AssistantChunkData(TypedDict):
    turn: int
    step: int
    chunk: JSONObject


class AssistantMessage(TypedDict):
    id: str
    role: Literal["assistant"]
    content: list[JSON]
    """Text blocks and ``{"type": "tool-call", "id", "name", "arguments"}`` blocks."""
    source: MessageSource


class _AssistantMessageData(TypedDict):
    turn: int
    step: int
    message: AssistantMessage


class AssistantMessageData(_AssistantMessageData, total=False):
    usage: JSONObject
    """The ``usage`` chunk of the response, when it had one."""


class _ToolCallData(TypedDict):
    turn: int
    step: int
    callId: str
    name: str
    arguments: str
    """The raw JSON text the model produced."""


class ToolCallData(_ToolCallData, total=False):
    effect: str
    """The effect class the call ran under (``"read-only"``...), when the host knows it."""
    idempotencyKey: str
    """The key the tool body was handed, when it had one."""
    approvalId: str
    """The ``approval/asked`` whose answer the call ran under, when it needed one."""


# "class" is a Python keyword: only the functional form can name the key.
EffectData = TypedDict("EffectData", {"class": str, "idempotencyKey": str}, total=False)
"""The effect of an unknown outcome: the call's class, and its idempotency key if it had one."""


class ErrorData(TypedDict):
    name: str
    code: str


class ToolResultBlock(TypedDict):
    type: Literal["tool-result"]
    toolCallId: str
    isError: bool
    content: list[JSON]


class ToolResultMessage(TypedDict):
    id: str
    role: Literal["user"]
    source: MessageSource
    content: list[ToolResultBlock]


class _ToolResultData(TypedDict):
    turn: int
    step: int
    message: ToolResultMessage


class ToolResultData(_ToolResultData, total=False):
    error: ErrorData
    """The name and code of the failure, when the result is a known kind of failure."""
    effect: EffectData
    """The effect class and key of the call, on an unknown outcome whose class is known."""


class TurnEndData(TypedDict):
    turn: int
    reason: JSONObject
    """``{"kind": "completed"}``, ``{"kind": "interrupted"}`` (written by crash repair)..."""


# -- building -------------------------------------------------------------------------------------


def turn_start(turn: int) -> TurnStartData:
    return {"turn": turn}


def step_data(turn: int, step: int) -> StepData:
    return {"turn": turn, "step": step}


def user_message(message_id: str, text: str, source_kind: str = "prompt") -> UserMessage:
    return {
        "id": message_id,
        "role": "user",
        "content": [{"type": "text", "text": text}],
        "source": {"kind": source_kind},
    }


def request_header(
    provider: str, model: str, tools: Iterable[str], *, resumed: bool
) -> RequestHeaderData:
    header: JSONObject = {"config": {"provider": provider, "model": model}, "tools": list(tools)}
    return {"header": header, "reason": "resume" if resumed else "initial"}


def request_context(provider: str, model: str) -> RequestContextData:
    return {"provider": provider, "model": model}


def assistant_chunk(turn: int, step: int, chunk: JSONObject) -> AssistantChunkData:
    return {"turn": turn, "step": step, "chunk": chunk}


def assistant_message(
    turn: int,
    step: int,
    content: list[JSON],
    *,
    provider: str,
    model: str,
    usage: JSONObject | None = None,
) -> AssistantMessageData:
    message: AssistantMessage = {
        "id": f"assistant-{turn}-{step}",
        "role": "assistant",
        "content": content,
        "source": {"kind": "model", "provider": provider, "model": model},
    }
    data: AssistantMessageData = {"turn": turn, "step": step, "message": message}
    if usage is not None:
        data["usage"] = usage
    return data


def tool_call(
    turn: int,
    step: int,
    call_id: str,
    name: str,
    arguments: str,
    *,
    effect: EffectClass | None = None,
    idempotency_key: str | None = None,
    approval_id: str | None = None,
) -> ToolCallData:
    """The data of the ``tool/call`` of *call_id*; *effect* and *idempotency_key* when known."""
    data: ToolCallData = {
        "turn": turn,
        "step": step,
        "callId": call_id,
        "name": name,
        "arguments": arguments,
    }
    if effect is not None:
        data["effect"] = effect
    if idempotency_key is not None:
        data["idempotencyKey"] = idempotency_key
    if approval_id is not None:
        data["approvalId"] = approval_id
    return data


def interrupted_result_id(call_id: str, seq: int) -> str:
    """The id of the result crash repair writes at *seq* for call *call_id*."""
    return f"interrupted-tool-result-{call_id}-{seq}"


def tool_result(
    turn: int, step: int, call_id: str, result: ToolResult, *, message_id: str | None = None
) -> ToolResultData:
    """The data of the ``tool/result`` that answers call *call_id* with *result*.

    The message id is ``tool-result-<call id>`` unless *message_id* is given.
    """
    block: ToolResultBlock = {
        "type": "tool-result",
        "toolCallId": call_id,
        "isError": result.is_error,
        "content": [{"type": block.type, "text": block.text} for block in result.content],
    }
    data: ToolResultData = {
        "turn": turn,
        "step": step,
        "message": {
            "id": f"tool-result-{call_id}" if message_id is None else message_id,
            "role": "user",
            "source": {"kind": "tool", "callId": call_id},
            "content": [block],
        },
    }
    if result.error is not None and result.error.info is not None:
        data["error"] = {"name": result.error.info.name, "code": result.error.info.code}
    if result.effect is not None:
        effect: EffectData = {"class": result.effect.effect}
        if result.effect.idempotency_key is not None:
            effect["idempotencyKey"] = result.effect.idempotency_key
        data["effect"] = effect
    return data


def turn_end(turn: int, reason: JSONObject) -> TurnEndData:
    return {"turn": turn, "reason": reason}


# -- reading --------------------------------------------------------------------------------------


def _object(value: object) -> JSONObject:
    return cast("JSONObject", value) if isinstance(value, dict) else {}


def message_of(event_type: str, data: JSONObject) -> JSONObject:
    """The message of a surface event: the data of ``user/message``, else ``data["message"]``."""
    return data if event_type == "user/message" else _object(data.get("message"))


def call_effect_of(data: JSONObject) -> tuple[EffectClass | None, str | None]:
    """The effect class and idempotency key a ``tool/call`` recorded; ``None`` for each it did
    not (or recorded as something that is not one)."""
    key = data.get("idempotencyKey")
    return parse_effect_class(data.get("effect")), key if isinstance(key, str) else None


def tool_call_ids(data: JSONObject) -> list[str]:
    """The ids of the calls an ``assistant/message`` asks for, in its order."""
    content = _object(data.get("message")).get("content")
    return [
        call_id
        for block in (content if isinstance(content, list) else [])
        if isinstance(block, dict)
        and block.get("type") == "tool-call"
        and isinstance(call_id := block.get("id"), str)
    ]


def result_call_id(data: JSONObject) -> str | None:
    """The id of the call a ``tool/result`` answers."""
    call_id = _object(_object(data.get("message")).get("source")).get("callId")
    return call_id if isinstance(call_id, str) else None


def error_of(data: JSONObject) -> ErrorData | None:
    """The name and code of a ``tool/result``'s failure, if it is a known kind of failure."""
    error = _object(data.get("error"))
    name, code = error.get("name"), error.get("code")
    if isinstance(name, str) and isinstance(code, str):
        return {"name": name, "code": code}
    return None


def chunk_of(data: JSONObject) -> JSONObject | None:
    """The stream chunk an ``assistant/chunk`` holds."""
    chunk = data.get("chunk")
    return chunk if isinstance(chunk, dict) else None


def texts_of(content: JSON) -> list[str]:
    """The texts of a message's content blocks, those nested in tool-result blocks included."""
    found: list[str] = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict):
            text = block.get("text")
            if isinstance(text, str):
                found.append(text)
            found += texts_of(block.get("content"))
    return found
