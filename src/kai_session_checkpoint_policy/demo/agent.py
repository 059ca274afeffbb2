"""The demo agent, and the story ``kai-checkpoint demo`` tells with it.

The agent is the smallest one in which a crash matters: a scripted model asks for one
``send_payment`` call, the tool body moves money (it appends a line to a ledger file, or
announces the payment), and the model then answers with text. Kill the process while the tool
body runs and the world holds an effect that only a durable ``tool/call`` can account for.

:func:`run_agent` runs one such turn on the reference host with the backend of a store URL (a
directory for JSONL, a ``postgresql://`` URI) and, unless told otherwise, the checkpoint
policy. It can stop dead at one of two places and wait (forever, or for a given time), after
writing a marker file, so that another process can kill, stop or observe it exactly there:

``"request"``
    inside the model adapter, once the request reached it (marker text ``request-dispatched``);
``"tool"``
    inside the tool body, once the payment was made (marker text ``tool-side-effect``);
``"approved"``
    with a tool that needs approval: once the person's yes is durable, before the call starts
    (marker text ``approval-decided``).

With an *approver*, ``send_payment`` needs a person's yes before each call (see
:mod:`~kai_session_checkpoint_policy.host.approvals`); a resumed session shows the questions a
crash or a stop left unanswered, and the model, asked again, asks for the payment again.

:func:`run_demo` tells the whole story: a normal turn with every checkpoint shown, the same
turn killed with SIGKILL inside the tool and recovered, and the same crash without the policy.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final, Literal, TypeAlias

import anyio

from .. import invariant, policy
from ..contract import Finish, text_block, tool_call_block
from ..effects import SIDE_EFFECTING
from ..eventdata import texts_of
from ..hookspecs import hookimpl
from ..host import Agent, Host, Tool
from ..persistence import (
    DEFAULT_BATCH_WINDOW,
    open_store,
)

if TYPE_CHECKING:
    from collections.abc import (
        AsyncGenerator,
        AsyncIterator,
        Callable,
        Generator,
        Iterable,
    )
    from pathlib import Path

    from anyio.abc import ByteReceiveStream, Process

    from ..contract import LlmRequest, StreamChunk
    from ..events import JSON, JSONObject
    from ..hookspecs import ToolThunk
    from ..host import ModelAdapter, ToolExecution, TurnOutcome
    from ..host.approvals import ApprovalQuestion, Approver
    from ..persistence import Store
    from ..results import ToolResult

__all__ = [
    "CALL_ID",
    "DEMO_LEASE_TTL",
    "MARKERS",
    "MODEL",
    "PAYMENT",
    "PAYMENT_PARAMETERS",
    "PROMPT",
    "PROVIDER",
    "TOOL_NAME",
    "DemoError",
    "HangAt",
    "ScriptedModel",
    "agent_command",
    "demo_host",
    "make_payment_tool",
    "run_agent",
    "wait_for_marker",
    "write_marker",
]

HangAt: TypeAlias = Literal["request", "tool", "approved"]

PROVIDER: Final = "scripted"
MODEL: Final = "demo-payments-1"
TOOL_NAME: Final = "send_payment"
CALL_ID: Final = "call-pay-invoice-1042"
PROMPT: Final = "Please pay invoice 1042: 120.00 EUR to ACME Corp."
PAYMENT: Final[JSONObject] = {
    "invoice": "1042",
    "to": "ACME Corp",
    "amount": "120.00",
    "currency": "EUR",
}
PAYMENT_PARAMETERS: Final[JSONObject] = {
    "type": "object",
    "properties": {
        "invoice": {"type": "string", "description": "The invoice number."},
        "to": {"type": "string", "description": "Who is paid."},
        "amount": {"type": "string", "description": "The amount, as a decimal number."},
        "currency": {"type": "string", "description": "The ISO 4217 currency code."},
    },
    "required": ["invoice", "to", "amount", "currency"],
    "additionalProperties": False,
}
"""The JSON Schema of ``send_payment``'s arguments, as a model is told it."""
MARKERS: Final[dict[HangAt, str]] = {
    "request": "request-dispatched",
    "tool": "tool-side-effect",
    "approved": "approval-decided",
}
"""The exact text written into the marker file at each place the agent can hang."""
DEMO_LEASE_TTL: Final = 1.0
"""Seconds the lease of the demo's killed agent lasts on a PostgreSQL store: how long the demo
waits before it can recover the session."""


class DemoError(RuntimeError):
    """The demo could not go on (a child process misbehaved); the message says how."""


# -------------------------------------------------------------------------------------------
# The agent
# -------------------------------------------------------------------------------------------


def write_marker(path: Path, text: str) -> None:
    """Put *text* into the marker file *path* with one write, then flush and fsync it.

    The watching process polls the file's *content*, so it never acts on a file that was
    merely created or opened.
    """
    with open(path, "ab") as marker:
        marker.write(text.encode())
        marker.flush()
        os.fsync(marker.fileno())


async def _hang(marker: Path | None, place: HangAt, hang_for: float | None) -> None:
    """Write the marker of *place*, then wait *hang_for* seconds (``None``: forever)."""
    if marker is not None:
        write_marker(marker, MARKERS[place])
    if hang_for is None:
        await anyio.sleep_forever()
    else:
        await anyio.sleep(hang_for)


class ScriptedModel:
    """A model adapter that plays a fixed script instead of calling a provider.

    While the transcript holds no tool result it asks for one ``send_payment`` call; once it
    does, it answers with one text that reports what the tool said. With *ask_each_prompt*, it
    asks for the payment again whenever the last message is a user's prompt (the first
    prompt's call is :data:`CALL_ID`, the *n*-th prompt's ``CALL_ID-n``).
    """

    def __init__(
        self,
        *,
        hang_at_request: bool = False,
        marker: Path | None = None,
        hang_for: float | None = None,
        ask_each_prompt: bool = False,
    ) -> None:
        self.ask_each_prompt = ask_each_prompt
        self.hang_at_request = hang_at_request
        self.marker = marker
        self.hang_for = hang_for

    async def __call__(self, request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        if self.hang_at_request:
            await _hang(self.marker, "request", self.hang_for)
        prompts = _prompts(request.messages)
        result = _last_tool_result(request.messages)
        if result is None or (self.ask_each_prompt and prompts[-1]):
            call_id = CALL_ID if len(prompts) < 2 else f"{CALL_ID}-{len(prompts)}"
            for chunk in tool_call_block(0, call_id, TOOL_NAME, json.dumps(PAYMENT)):
                yield chunk
            yield Finish("tool-calls")
            return
        failed, text = result
        invoice = PAYMENT["invoice"]
        if failed:
            answer = f"I could not confirm that invoice {invoice} was paid: {text}"
        else:
            answer = f"Invoice {invoice} is paid: {text}."
        for chunk in text_block(0, answer):
            yield chunk
        yield Finish("stop")


def _prompts(messages: Iterable[JSONObject]) -> list[bool]:
    """For each user prompt of a transcript: whether it is the last message."""
    prompts: list[bool] = []
    for message in messages:
        source = message.get("source")
        if isinstance(source, dict) and source.get("kind") == "prompt":
            prompts.append(True)
        elif prompts:
            prompts[-1] = False
    return prompts or [False]


def _last_tool_result(messages: Iterable[JSONObject]) -> tuple[bool, str] | None:
    """Whether the last tool result of a transcript failed, and its text; ``None`` if none."""
    found = None
    for message in messages:
        source = message.get("source")
        content = message.get("content")
        if not (isinstance(source, dict) and source.get("kind") == "tool"):
            continue
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool-result":
                found = (bool(block.get("isError")), " ".join(texts_of(block.get("content"))))
    return found


def _payment_words(arguments: JSON) -> str:
    if not isinstance(arguments, dict):
        return json.dumps(arguments)
    return (
        f"{arguments.get('amount')} {arguments.get('currency')} to {arguments.get('to')} "
        f"for invoice {arguments.get('invoice')}"
    )


def _record_payment(ledger: Path, entry: JSONObject) -> None:
    with open(ledger, "a", encoding="utf-8") as book:
        book.write(json.dumps(entry) + "\n")
        book.flush()
        os.fsync(book.fileno())


def make_payment_tool(
    *,
    ledger: Path | None = None,
    hang_after_effect: bool = False,
    marker: Path | None = None,
    announce: Callable[[str], object] = print,
    hang_for: float | None = None,
    needs_approval: bool = False,
) -> Tool:
    """Build the side-effecting ``send_payment`` tool (with *needs_approval*, each call waits
    for a person's yes).

    The effect is one JSON line appended (and fsynced) to *ledger*, or, without a ledger, one
    line given to *announce*. The call id goes with it as the idempotency key that a real
    payment provider would be handed. With *hang_after_effect*, the body then writes its
    marker and waits *hang_for* seconds (forever if ``None``).
    """

    async def send_payment(execution: ToolExecution) -> str:
        words = _payment_words(execution.arguments)
        if ledger is None:
            announce(f"{TOOL_NAME} moved {words} (idempotency key {execution.call_id})")
        else:
            entry: JSONObject = {
                "idempotencyKey": execution.call_id,
                "payment": execution.arguments,
            }
            await anyio.to_thread.run_sync(_record_payment, ledger, entry)
        if hang_after_effect:
            await _hang(marker, "tool", hang_for)
        return f"sent {words}, receipt R-{execution.call_id}"

    return Tool(
        TOOL_NAME,
        send_payment,
        description="Pay an invoice. Each call moves money: it is not safe to repeat.",
        parameters=PAYMENT_PARAMETERS,
        effect=SIDE_EFFECTING,
        needs_approval=needs_approval,
    )


class _HangWhenApproved:
    """Stops a call that ran under an approval before it starts: the yes is durable (the
    agent flushed it), the ``tool/call`` only appended. It writes the marker, then waits."""

    name = "kai-demo-hang-when-approved"

    def __init__(self, marker: Path | None, hang_for: float | None) -> None:
        self.marker = marker
        self.hang_for = hang_for

    @hookimpl(wrapper=True, tryfirst=True)
    def tools_execute(self, execution: ToolExecution) -> Generator[None, ToolThunk, ToolThunk]:
        inner = yield

        async def hanging() -> ToolResult:
            await _hang(self.marker, "approved", self.hang_for)
            return await inner()

        return hanging


@asynccontextmanager
async def demo_host(
    root: str | os.PathLike[str],
    *,
    use_policy: bool = True,
    hang_at: HangAt | None = None,
    marker: Path | None = None,
    ledger: Path | None = None,
    extra_plugins: Iterable[object] = (),
    announce: Callable[[str], object] = print,
    batch_window: float = DEFAULT_BATCH_WINDOW,
    hang_for: float | None = None,
    lease_ttl: float | None = None,
    provider: str = PROVIDER,
    adapter: ModelAdapter | None = None,
    needs_approval: bool = False,
) -> AsyncIterator[tuple[Host, Store]]:
    """Open a host for the demo agent; yield it with the backend of the store *root*.

    The plugins are given explicitly instead of loaded from entry points: the backend that
    :func:`~kai_session_checkpoint_policy.persistence.open_store` chooses for *root*, then
    (with *use_policy*) the checkpoint policy and its invariant companion, then
    *extra_plugins*. The scripted model (or *adapter*, a real one) is registered for
    *provider*, and the ``send_payment`` tool is registered (needing a person's yes with
    *needs_approval*, and the scripted model then asks for it again at each prompt).
    *batch_window* is the backend's: how long an event may wait for a background batch;
    *lease_ttl* the PostgreSQL lease's. *hang_for* bounds the wait at *hang_at*.
    """
    backend = open_store(root, batch_window=batch_window, lease_ttl=lease_ttl)
    plugins: list[object] = [backend]
    if use_policy:
        plugins += [policy, invariant]
    if hang_at == "approved":
        plugins.append(_HangWhenApproved(marker, hang_for))
    plugins += extra_plugins
    async with Host(plugins, autoload=False) as host:
        if adapter is None:
            adapter = ScriptedModel(
                hang_at_request=hang_at == "request",
                marker=marker,
                hang_for=hang_for,
                ask_each_prompt=needs_approval,
            )
        host.llm.register_adapter(provider, adapter)
        host.tools.register(
            make_payment_tool(
                ledger=ledger,
                hang_after_effect=hang_at == "tool",
                marker=marker,
                announce=announce,
                hang_for=hang_for,
                needs_approval=needs_approval,
            )
        )
        yield host, backend


async def run_agent(
    root: str | os.PathLike[str],
    session_id: str,
    *,
    use_policy: bool = True,
    hang_at: HangAt | None = None,
    marker: Path | None = None,
    ledger: Path | None = None,
    batch_window: float = DEFAULT_BATCH_WINDOW,
    announce: Callable[[str], object] = print,
    hang_for: float | None = None,
    lease_ttl: float | None = None,
    provider: str = PROVIDER,
    model: str = MODEL,
    adapter: ModelAdapter | None = None,
    approver: Approver | None = None,
    show_pending: Callable[[list[ApprovalQuestion]], object] | None = None,
) -> TurnOutcome:
    """Run one scripted turn for a new session *session_id* in the store *root*.

    With an *approver*, ``send_payment`` needs a person's yes, which *approver* asks for, and
    a session that exists already is resumed (recovered first) instead of refused: its turn
    starts with *show_pending* given the questions a crash or a stop left unanswered (never
    taken as a yes; the person is asked again when the model asks again).

    With *adapter*, a real model answers instead of the script: it is registered for
    *provider*, and the agent asks it for *model*. After the turn the session is flushed once
    more: the agent loop does not flush at the end of a turn, so a host that wants the whole
    turn on disk asks for it.
    """
    async with demo_host(
        root,
        use_policy=use_policy,
        hang_at=hang_at,
        marker=marker,
        ledger=ledger,
        batch_window=batch_window,
        announce=announce,
        hang_for=hang_for,
        lease_ttl=lease_ttl,
        provider=provider,
        adapter=adapter,
        needs_approval=approver is not None,
    ) as (host, _backend):
        if approver is None:
            session = host.sessions.create(session_id)
        else:
            session = await host.sessions.open(session_id)
        agent = Agent(host, session, provider=provider, model=model, approver=approver)
        pending = agent.pending_approvals()
        if pending and show_pending is not None:
            show_pending(pending)
        try:
            outcome = await agent.run_turn(PROMPT)
        finally:
            with anyio.CancelScope(shield=True):  # a stopped turn is on disk as it ended
                await host.sessions.flush(session)
    return outcome


# -------------------------------------------------------------------------------------------
# Child processes
# -------------------------------------------------------------------------------------------


async def wait_for_marker(
    marker: Path, expected: str, process: Process, *, timeout: float = 20.0
) -> float:
    """Poll *marker* until its content is *expected*; return the seconds waited.

    :raises DemoError: if the process exits first, the marker holds something else, or
        *timeout* seconds pass.
    """
    started = time.monotonic()
    with anyio.move_on_after(timeout):
        while True:
            content = await anyio.Path(marker).read_text()
            if content == expected:
                return time.monotonic() - started
            if not expected.startswith(content):
                raise DemoError(f"marker {marker} holds {content!r}, not {expected!r}")
            if process.returncode is not None:
                errors = await _read_all(process.stderr)
                raise DemoError(
                    f"the agent exited with status {process.returncode} before writing its "
                    f"marker: {' '.join(errors.split()) or 'no message'}"
                )
            await anyio.sleep(0.01)
    raise DemoError(f"marker {marker} did not read {expected!r} within {timeout:g} s")


async def _read_all(stream: ByteReceiveStream | None) -> str:
    if stream is None:
        return ""
    chunks = []
    async for chunk in stream:
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def agent_command(
    root: str | os.PathLike[str],
    session_id: str,
    *,
    hang_at: HangAt,
    marker: Path,
    ledger: Path,
    use_policy: bool,
    lease_ttl: float | None = None,
) -> list[str]:
    """The command line that runs :func:`run_agent` in a child process."""
    command = [sys.executable, "-m", "kai_session_checkpoint_policy", "agent"]
    command += ["--root", str(root), "--session", session_id]
    command += ["--hang-at", hang_at, "--marker", str(marker), "--ledger", str(ledger)]
    if lease_ttl is not None:
        command += ["--lease-ttl", str(lease_ttl)]
    return command if use_policy else [*command, "--no-policy"]
