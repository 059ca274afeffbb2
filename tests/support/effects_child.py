"""A tool of a given effect class, and the child that is killed inside it after its effect.

Run as a script (it imports nothing from the tests), this module is the child::

    python tests/support/effects_child.py ROOT SESSION EFFECT EFFECTS MARKER [--provider URL]

It runs one turn of session SESSION in the reference host, with the checkpoint policy and the
JSONL backend at ROOT: the model asks for the call ``call-1`` of the tool ``act`` (class
EFFECT, or ``undeclared``) with the arguments ``{"order": "A-7"}``. The body does its effect,
then writes ``after-effect`` into MARKER and blocks until the process is killed.

The effect of ``act`` is one JSON line appended (and fsynced) to EFFECTS, holding the call id
and the idempotency key the body was handed; with a provider URL, the body first sends the
order to the provider, its key in the ``Idempotency-Key`` header, as a client of a payment
provider does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio
import anyio.to_thread

from kai_session_checkpoint_policy import (
    Agent,
    Finish,
    Host,
    TextDelta,
    Tool,
    invariant,
    policy,
    tool_call_block,
)
from kai_session_checkpoint_policy.effects import effect_class
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from kai_session_checkpoint_policy import JSON, LlmRequest, StreamChunk, ToolExecution
    from kai_session_checkpoint_policy.effects import EffectClass

PROVIDER: Final = "scripted"
TOOL: Final = "act"
FIRST_CALL: Final = "call-1"
ARGUMENTS: Final = '{"order": "A-7"}'
AFTER_EFFECT: Final = "after-effect"


def _append_line(path: Path, entry: dict[str, JSON]) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.write(json.dumps(entry) + "\n")
        file.flush()
        os.fsync(file.fileno())


def _send(provider: str, key: str | None, body: JSON) -> None:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(
        provider, data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


def make_act_tool(
    effect: EffectClass | None,
    effects: Path,
    *,
    provider: str | None = None,
    marker: Path | None = None,
) -> Tool:
    """The tool ``act`` of class *effect*; with *marker*, its body blocks after its effect."""

    async def act(execution: ToolExecution) -> JSON:
        key = execution.idempotency_key
        if provider is not None:
            await anyio.to_thread.run_sync(_send, provider, key, execution.arguments)
        entry: dict[str, JSON] = {"call": execution.call_id, "key": key}
        await anyio.to_thread.run_sync(_append_line, effects, entry)
        if marker is not None:
            await anyio.Path(marker).write_text(AFTER_EFFECT)
            await anyio.sleep_forever()
        return {"done": execution.call_id}

    return Tool(TOOL, act, effect=effect)


async def _first_call(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
    if len(request.messages) == 1:
        for chunk in tool_call_block(0, FIRST_CALL, TOOL, ARGUMENTS):
            yield chunk
        yield Finish("tool-calls")
    else:
        yield TextDelta("done")
        yield Finish("stop")


async def main(arguments: argparse.Namespace) -> None:
    effect = None if arguments.effect == "undeclared" else effect_class(arguments.effect)
    backend = JsonlSessionPersistence(Path(arguments.root))
    async with Host([backend, policy, invariant], autoload=False) as host:
        host.llm.register_adapter(PROVIDER, _first_call)
        tool = make_act_tool(
            effect, Path(arguments.effects), provider=arguments.provider, marker=arguments.marker
        )
        host.tools.register(tool)
        session = host.sessions.create(arguments.session)
        await Agent(host, session, provider=PROVIDER, model="m").run_turn("act on order A-7")
    sys.exit("the tool body returned: it should have blocked until killed")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("session")
    parser.add_argument("effect")
    parser.add_argument("effects")
    parser.add_argument("marker", type=Path)
    parser.add_argument("--provider")
    anyio.run(main, parser.parse_args())
