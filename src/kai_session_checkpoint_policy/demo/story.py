"""The story ``kai-checkpoint demo`` tells: a normal turn, a crash with the policy, and one
without it."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from ..eventdata import message_of
from ..host import Agent
from ..output import Console, print_events, print_repair
from ..persistence import (
    SessionLockedError,
    SessionNotFoundError,
    display_url,
    is_postgres_url,
    open_store,
)

if TYPE_CHECKING:
    from collections.abc import (
        Iterable,
        Sequence,
    )
    from contextlib import AbstractContextManager

    from ..events import SessionEvent
    from ..persistence import Store, StoredLog

__all__ = ["run_demo"]


from .agent import (
    CALL_ID,
    DEMO_LEASE_TTL,
    MARKERS,
    MODEL,
    PAYMENT,
    PROMPT,
    PROVIDER,
    TOOL_NAME,
    DemoError,
    agent_command,
    demo_host,
    wait_for_marker,
)
from .reporter import CheckpointReporter

# -------------------------------------------------------------------------------------------
# The story
# -------------------------------------------------------------------------------------------


async def run_demo(
    root: str | os.PathLike[str] | None, console: Console, *, keep: bool = False
) -> None:
    """Tell the whole story; keep the sessions in the store *root*, or in a temporary directory
    that is removed at the end unless *keep* is set (the sessions, markers and ledgers stay)."""
    started = time.monotonic()
    prefix = "kai-checkpoint-demo-"
    scratch_place: AbstractContextManager[str] = (
        nullcontext(tempfile.mkdtemp(prefix=prefix))
        if keep
        else tempfile.TemporaryDirectory(prefix=prefix)
    )
    with scratch_place as scratch_name:
        scratch = Path(scratch_name)
        sessions = scratch / "sessions" if root is None else root
        suffix = "" if root is None else f"-{secrets.token_hex(3)}"
        shown = display_url(sessions)
        console.line(console.bold("kai-checkpoint demo") + console.dim(f"  sessions in {shown}"))
        console.line(
            f"The agent: a scripted model asks for {TOOL_NAME} to pay invoice "
            f"{PAYMENT['invoice']}, the tool moves the money, the model answers."
        )
        await _normal_turn(console, sessions, f"pay-invoice{suffix}")
        await _crash(console, sessions, scratch, f"crash{suffix}", use_policy=True)
        await _crash(console, sessions, scratch, f"crash-no-policy{suffix}", use_policy=False)
    console.line()
    console.line(console.dim(f"demo finished in {time.monotonic() - started:.1f} s"))
    if root is not None or keep:
        shown = display_url(sessions)
        console.line(f"The sessions stay in {shown}: try 'kai-checkpoint list {shown}'.")
    else:
        console.line(
            f"The sessions were in {shown}, now removed: 'kai-checkpoint demo --keep' keeps "
            "them, '--root STORE' puts them in a store of your own."
        )


async def _normal_turn(console: Console, root: str | os.PathLike[str], session_id: str) -> None:
    console.line()
    console.line(console.bold("1. A normal turn, with every checkpoint as it happens"))
    console.line(
        console.dim(
            "   + an event appended in memory; * a checkpoint: the policy waits until the events "
            "so far are on disk; $ the tool's effect on the world"
        )
    )
    reporter = CheckpointReporter(console)

    def announce(text: str) -> None:
        console.line(console.note(f"   $ {text}"))

    async with demo_host(root, extra_plugins=[reporter], announce=announce) as (host, _backend):
        session = host.sessions.create(session_id)
        outcome = await Agent(host, session, provider=PROVIDER, model=MODEL).run_turn(PROMPT)
        await host.sessions.flush(session)
        reporter.report(host, session, "the host's own flush after the turn")
    console.line(f"   The model answered: {outcome.text}")


async def _crash(
    console: Console,
    root: str | os.PathLike[str],
    scratch: Path,
    session_id: str,
    *,
    use_policy: bool,
) -> None:
    console.line()
    if use_policy:
        console.line(console.bold(f"2. The same turn, killed with SIGKILL inside {TOOL_NAME}"))
    else:
        console.line(console.bold("3. The same crash without the checkpoint policy"))
    marker = anyio.Path(scratch / f"{session_id}.marker")
    ledger = scratch / f"{session_id}.ledger"
    await marker.write_bytes(b"")
    leased = is_postgres_url(root)
    command = agent_command(
        root,
        session_id,
        hang_at="tool",
        marker=Path(marker),
        ledger=ledger,
        use_policy=use_policy,
        lease_ttl=DEMO_LEASE_TTL if leased else None,
    )
    shown = "kai-checkpoint agent --hang-at tool" + ("" if use_policy else " --no-policy")
    console.line(console.dim(f"   .. starting '{shown}' as a child process"))
    process = await anyio.open_process(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        waited = await wait_for_marker(Path(marker), MARKERS["tool"], process)
        console.line(
            console.dim(
                f"   .. after {waited:.1f} s the marker reads '{MARKERS['tool']}': the payment is "
                f"made and {TOOL_NAME} has not returned"
            )
        )
        os.kill(process.pid, signal.SIGKILL)
        status = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.aclose()
    how = "died by SIGKILL" if status == -signal.SIGKILL else f"exited with status {status}"
    console.line(console.bad(f"   !! SIGKILL sent to child {process.pid}: it {how}"))

    payments = (await anyio.Path(ledger).read_text()).splitlines()
    console.line(
        f"   In the world: the ledger holds {len(payments)} payment(s), idempotency key {CALL_ID}"
    )
    backend = open_store(root)
    try:
        try:
            stored = await backend.inspect(session_id)
        except SessionNotFoundError:
            stored = None
        if use_policy:
            if stored is None:
                raise DemoError(f"with the policy loaded, session {session_id} should be on disk")
            await _show_recovery(console, backend, session_id, stored.events)
        else:
            stored_events = None if stored is None else stored.events
            await _show_loss(console, backend, session_id, stored_events)
    finally:
        await backend.aclose()


async def _load_when_free(console: Console, backend: Store, session_id: str) -> StoredLog:
    """Load the session with recovery, once the killed agent's lease on it has expired.

    On a PostgreSQL store the dead agent's lease holds for its ttl; a directory's lock died
    with the process.
    """
    told = False
    with anyio.fail_after(DEMO_LEASE_TTL + 20):
        while True:
            try:
                return await backend.load(session_id)
            except SessionLockedError:
                if not told:
                    console.line(
                        console.dim(
                            f"   .. the killed agent's lease lasts {DEMO_LEASE_TTL:g} s: "
                            "another host may recover the session once it has expired"
                        )
                    )
                    told = True
            await anyio.sleep(DEMO_LEASE_TTL / 10)


async def _show_recovery(
    console: Console,
    backend: Store,
    session_id: str,
    stored: Iterable[SessionEvent],
) -> None:
    console.line("   On disk after the crash ('kai-checkpoint inspect'):")
    print_events(console, stored, mark="    ")
    recovered = await _load_when_free(console, backend, session_id)
    console.line("   Recovery closes the turn ('kai-checkpoint recover'):")
    print_repair(console, recovered.repair, mark="   +")
    result = next(event for event in recovered.repair if event.type == "tool/result")
    console.line(
        f"   The result the model will see for {TOOL_NAME} [{CALL_ID}], "
        "in place of the one that never came:"
    )
    message = message_of(result.type, result.data)
    text = json.dumps(message, indent=2, ensure_ascii=False)
    for line in text.splitlines():
        console.line(console.note(f"     {line}"))
    console.line(
        "   The payment happened and the log says so: the model is told the outcome is "
        "unknown and must check before paying again."
    )


async def _show_loss(
    console: Console,
    backend: Store,
    session_id: str,
    stored: Sequence[SessionEvent] | None,
) -> None:
    if not stored:
        console.line(
            "   On disk after the crash: nothing. Every event of the turn was still waiting for "
            "the backend's next background batch when the process died."
        )
    else:
        console.line("   On disk after the crash:")
        print_events(console, stored, mark="    ")
        recovered = await _load_when_free(console, backend, session_id)
        if recovered.repair:
            console.line("   Recovery closes the turn:")
            print_repair(console, recovered.repair, mark="   +")
    if stored and any(event.type == "tool/call" for event in stored):
        console.line(
            "   This time a background batch happened to write the tool call before the kill: "
            "without the policy that is timing, not a guarantee."
        )
        return
    console.line(
        console.bad(
            "   The tool call was lost while its side effect happened: the money moved, and no "
            "log shows the model ever asked. A resumed agent would ask again and pay twice."
        )
    )
