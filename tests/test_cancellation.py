"""Cancellation in a living process: of a flush in flight, of a checkpoint, of a turn.

A write handed to a worker thread is waited out, whatever cancels its caller: anyio's cancel
scopes and native asyncio cancellation (``asyncio.timeout``, ``Task.cancel()``), which passes
through anyio's shield. A turn that ends while tool calls are open answers each of them.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio
import anyio.to_thread
import pytest

from kai_session_checkpoint_policy import (
    ABORTED_BEFORE_DISPATCH,
    TOOL_OUTCOME_UNKNOWN,
    Agent,
    Finish,
    Host,
    JsonlSessionPersistence,
    Session,
    Tool,
    ToolExecution,
    hookimpl,
    policy,
    tool_call_block,
)
from kai_session_checkpoint_policy.demo import PROVIDER, ScriptedModel, make_payment_tool

from .support import SUPPORT
from .support.markers import MARKER_TIMEOUT, reap, wait_for_marker
from .support.persistence_helpers import GatedFiles, find_log, stored_events

if TYPE_CHECKING:
    from collections.abc import Callable

    from kai_session_checkpoint_policy import JSON, SessionEvent
    from kai_session_checkpoint_policy.pytest_plugin import FlushRecorder, Gate, RecordingAdapter

pytestmark = pytest.mark.anyio

asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])


def stored_seqs(root: Path, session_id: str) -> list[object]:
    return [event.seq for event in stored_events(find_log(root, session_id))]


def results(session: Session) -> list[tuple[JSON, JSON]]:
    """The (call id, error code) of every ``tool/result``, in log order."""
    found: list[tuple[JSON, JSON]] = []
    for event in session.events:
        if event.type == "tool/result":
            message = event.data["message"]
            assert isinstance(message, dict)
            source = message["source"]
            assert isinstance(source, dict)
            error = event.data.get("error")
            found.append((source["callId"], error.get("code") if isinstance(error, dict) else None))
    return found


def types(session: Session) -> list[str]:
    return [event.type for event in session.events]


async def opened_with_gate(
    tmp_path: Path, session_id: str
) -> tuple[GatedFiles, JsonlSessionPersistence, Host]:
    files = GatedFiles()
    backend = JsonlSessionPersistence(tmp_path, batch_window=60, inline_write_limit=0, files=files)
    return files, backend, Host([backend])


@asyncio_only
@pytest.mark.parametrize(
    "how",
    [
        pytest.param(
            "asyncio.timeout",
            marks=pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is 3.11+"),
        ),
        "Task.cancel",
    ],
)
async def test_native_cancellation_waits_out_the_write_in_flight(tmp_path: Path, how: str) -> None:
    files, backend, host = await opened_with_gate(tmp_path, "s")
    async with host:
        session = host.sessions.create("s")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)  # the log exists: the next batch is an append
        session.append("step/start", {"turn": 1, "step": 1})
        files.gate_next = True
        outcome: list[str] = []
        reschedule: list[Callable[[float], None]] = []

        async def flush_cancelled() -> None:
            try:
                if how == "asyncio.timeout" and sys.version_info >= (3, 11):
                    async with asyncio.timeout(None) as timeout:
                        reschedule.append(timeout.reschedule)
                        await host.sessions.flush(session)
                else:
                    await host.sessions.flush(session)
            except TimeoutError:
                outcome.append("TimeoutError")
            except asyncio.CancelledError:
                outcome.append("CancelledError")
                raise
            else:
                outcome.append("returned")

        cancelled = asyncio.ensure_future(flush_cancelled())
        assert await anyio.to_thread.run_sync(files.entered.wait, 10)  # the write is in flight
        if how == "asyncio.timeout":
            reschedule[0](asyncio.get_running_loop().time())
        else:
            cancelled.cancel()
        await anyio.wait_all_tasks_blocked()
        assert not cancelled.done()  # still waiting for its write, which owns the lane
        session.append("user/message", {"late": True})
        second = asyncio.ensure_future(host.sessions.flush(session))
        await anyio.wait_all_tasks_blocked()
        assert not second.done()
        files.release.set()
        await asyncio.wait([cancelled, second])
        assert second.result() is True
        expected = "TimeoutError" if how == "asyncio.timeout" else "CancelledError"
        assert outcome == [expected]
        assert backend.durable_count("s") == 3
    assert stored_seqs(tmp_path, "s") == [0, 1, 2]
    recovered = await JsonlSessionPersistence(tmp_path).load("s")
    assert [event.seq for event in recovered.events] == [0, 1, 2, 3, 4]
    assert [event.type for event in recovered.repair] == ["step/end", "turn/end"]
    assert recovered.torn_bytes == 0


@asyncio_only
async def test_the_joiners_of_a_cancelled_leader_drain_the_queue(tmp_path: Path) -> None:
    files = GatedFiles()
    backend = JsonlSessionPersistence(
        tmp_path, batch_window=0.001, inline_write_limit=0, files=files
    )
    async with Host([backend]) as host:
        session = host.sessions.create("s")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
        files.gate_next = True
        session.append("step/start", {"turn": 1, "step": 1})  # a background batch takes it
        assert await anyio.to_thread.run_sync(files.entered.wait, 10)
        session.append("user/message", {"queued": True})
        leader = asyncio.ensure_future(host.sessions.flush(session))  # waits for the lane
        await anyio.wait_all_tasks_blocked()
        joiner = asyncio.ensure_future(host.sessions.flush(session))  # joins its barrier
        await anyio.wait_all_tasks_blocked()
        leader.cancel()
        await anyio.wait_all_tasks_blocked()
        assert leader.cancelled()
        assert not joiner.done()  # it took over the drain, and waits for the lane
        files.release.set()
        assert await joiner is True
        assert backend.durable_count("s") == 3  # what the joiner was promised is on disk
    assert stored_seqs(tmp_path, "s") == [0, 1, 2]


class GateToolCheckpoint:
    """Gates the first write after a ``tool/call`` is appended: the tool checkpoint's write."""

    name = "gate-tool-checkpoint"

    def __init__(self, files: GatedFiles) -> None:
        self.files = files

    @hookimpl
    def session_event(self, event: SessionEvent) -> None:
        if event.type == "tool/call":
            self.files.gate_next = True


async def test_a_cancellation_during_the_tool_checkpoint_never_starts_the_body(
    tmp_path: Path, kai_recording_adapter: RecordingAdapter
) -> None:
    files, _backend, host = await opened_with_gate(tmp_path, "s")
    effects: list[str] = []

    async def pay(execution: ToolExecution) -> JSON:
        effects.append("paid")  # before the body's first await
        return "paid"

    host.register(policy)
    host.register(GateToolCheckpoint(files))
    host.tools.register(Tool("pay", pay))
    host.llm.register_adapter("mock", kai_recording_adapter)
    kai_recording_adapter.script(*tool_call_block(0, "c1", "pay"), Finish("tool-calls"))
    async with host:
        session = host.sessions.create("s")
        agent = Agent(host, session, provider="mock", model="m")

        async def cancel_at_the_tool_checkpoint(scope: anyio.CancelScope) -> None:
            assert await anyio.to_thread.run_sync(files.entered.wait, 10)
            scope.cancel()  # while the checkpoint's write is in flight
            files.release.set()

        async with anyio.create_task_group() as group:
            group.start_soon(cancel_at_the_tool_checkpoint, group.cancel_scope)
            await agent.run_turn("Pay.")
        assert group.cancel_scope.cancelled_caught
    assert effects == []
    assert results(session) == [("c1", ABORTED_BEFORE_DISPATCH)]
    assert types(session)[-4:] == ["tool/call", "tool/result", "step/end", "turn/end"]
    assert session.events[-1].data["reason"] == {"kind": "aborted", "reason": "cancelled"}


SLOW_FSYNC_CHILD: Final = SUPPORT / "slow_fsync_child.py"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="the child waits on Task.cancelling()")
@pytest.mark.parametrize("where", ["to the process", "in the writing thread"])
def test_sigint_during_a_slow_fsync_of_the_tool_checkpoint_leaves_a_whole_log(
    tmp_path: Path, where: str
) -> None:
    """Ctrl-C while the tool checkpoint's fsync is slow: sent to the process, or reaching the
    worker thread that writes (the event loop, waiting for that write, must still wake)."""
    marker, root, ledger = tmp_path / "marker", tmp_path / "sessions", tmp_path / "ledger.jsonl"
    marker.write_bytes(b"")
    in_worker = where == "in the writing thread"
    command = [sys.executable, str(SLOW_FSYNC_CHILD), str(marker)]
    command += ["--signal-in-worker"] if in_worker else []
    command += ["agent", "--root", str(root), "--session", "s", "--ledger", str(ledger)]
    command += ["--batch-window", "3600"]
    child = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        wait_for_marker(child, marker, "fsync-started")
        if not in_worker:
            child.send_signal(signal.SIGINT)
        _out, errors = child.communicate(timeout=MARKER_TIMEOUT)
    finally:
        reap(child)
    assert child.returncode == 130, errors.decode(errors="replace")
    assert errors == b""
    assert not ledger.exists()  # the body never ran: no payment
    stored = anyio.run(JsonlSessionPersistence(root).load, "s")
    assert stored.repair == ()  # the cancelled turn closed itself, and all of it is on disk
    assert [event.seq for event in stored.events] == list(range(len(stored.events)))
    assert [event.type for event in stored.events][-4:] == [
        "tool/call",
        "tool/result",
        "step/end",
        "turn/end",
    ]
    (result,) = (event for event in stored.events if event.type == "tool/result")
    assert result.data["error"] == {"name": "AbortError", "code": ABORTED_BEFORE_DISPATCH}


async def test_a_turn_cancelled_inside_the_tool_body_answers_outcome_unknown_and_pays_once(
    tmp_path: Path,
) -> None:
    payments: list[str] = []
    paid = anyio.Event()

    def announce(text: str) -> None:
        payments.append(text)
        paid.set()

    async with Host([JsonlSessionPersistence(tmp_path), policy]) as host:
        host.llm.register_adapter(PROVIDER, ScriptedModel())
        host.tools.register(make_payment_tool(announce=announce, hang_after_effect=True))
        session = host.sessions.create("s")
        async with anyio.create_task_group() as group:
            group.start_soon(Agent(host, session, provider=PROVIDER, model="m").run_turn, "Pay.")
            await paid.wait()  # the money moved; the body has not returned
            group.cancel_scope.cancel()
    assert results(session) == [("call-pay-invoice-1042", TOOL_OUTCOME_UNKNOWN)]
    assert types(session)[-4:] == ["tool/call", "tool/result", "step/end", "turn/end"]

    stored = await JsonlSessionPersistence(tmp_path).load("s")
    assert stored.repair == ()  # the turn closed itself and reached the disk at close
    async with Host([JsonlSessionPersistence(tmp_path), policy]) as host:
        host.llm.register_adapter(PROVIDER, ScriptedModel())
        host.tools.register(make_payment_tool(announce=announce))
        resumed = host.sessions.create("s", seed=stored.events)
        outcome = await Agent(host, resumed, provider=PROVIDER, model="m").run_turn("Again?")
    assert len(payments) == 1  # the model saw the unknown outcome and did not pay again
    assert outcome.text.startswith("I could not confirm that invoice 1042 was paid")


async def test_a_cancelled_batch_keeps_finished_results_and_answers_the_rest_in_model_order(
    kai_host: Host, kai_session: Session, kai_recording_adapter: RecordingAdapter
) -> None:
    entered = anyio.Event()

    async def quick(execution: ToolExecution) -> JSON:
        return "done"

    async def slow(execution: ToolExecution) -> JSON:
        entered.set()
        await anyio.sleep_forever()
        return None  # pragma: no cover

    kai_host.tools.register(Tool("quick", quick, concurrency_safe=True))
    kai_host.tools.register(Tool("slow", slow, concurrency_safe=True))
    kai_host.tools.register(Tool("later", quick))  # exclusive: a batch of its own, after
    kai_recording_adapter.script(
        *tool_call_block(0, "a", "quick"),
        *tool_call_block(1, "b", "slow"),
        *tool_call_block(2, "c", "later"),
        Finish("tool-calls"),
    )
    agent = Agent(kai_host, kai_session, provider="mock", model="m")
    async with anyio.create_task_group() as group:
        group.start_soon(agent.run_turn, "Go.")
        await entered.wait()
        await anyio.wait_all_tasks_blocked()  # "quick" has finished, "slow" hangs
        group.cancel_scope.cancel()
    assert results(kai_session) == [
        ("a", None),
        ("b", TOOL_OUTCOME_UNKNOWN),
        ("c", ABORTED_BEFORE_DISPATCH),
    ]
    calls = [event.data["callId"] for event in kai_session.events if event.type == "tool/call"]
    assert calls == ["a", "b"]  # "c" was never dispatched, and says so
    assert types(kai_session)[-7:] == [
        "tool/call",
        "tool/call",
        "tool/result",
        "tool/result",
        "tool/result",
        "step/end",
        "turn/end",
    ]


class HoldChecksAfter:
    """Holds every flush once the *nth* event of *event_type* is appended."""

    name = "hold-checks-after"

    def __init__(self, event_type: str, nth: int, recorder: FlushRecorder) -> None:
        self.event_type = event_type
        self.left = nth
        self.recorder = recorder
        self.gate: Gate | None = None
        self.holding = anyio.Event()

    @hookimpl
    def session_event(self, event: SessionEvent) -> None:
        if event.type == self.event_type:
            self.left -= 1
            if self.left == 0:
                self.gate = self.recorder.hold()
                self.holding.set()

    async def held(self) -> Gate:
        await self.holding.wait()
        assert self.gate is not None
        return self.gate


@asyncio_only
async def test_concurrent_calls_hear_of_a_native_cancel_of_their_turn_before_dispatching(
    kai_host: Host,
    kai_session: Session,
    kai_recording_adapter: RecordingAdapter,
    kai_flush_recorder: FlushRecorder,
) -> None:
    started: list[str] = []

    async def read(execution: ToolExecution) -> JSON:
        started.append(execution.call_id)
        return "read"

    kai_host.tools.register(Tool("read", read, concurrency_safe=True))
    kai_recording_adapter.script(
        *tool_call_block(0, "a", "read"), *tool_call_block(1, "b", "read"), Finish("tool-calls")
    )
    holder = HoldChecksAfter("tool/call", 2, kai_flush_recorder)
    kai_host.register(holder)  # once both calls are recorded, their checkpoints wait
    agent = Agent(kai_host, kai_session, provider="mock", model="m")
    turn = asyncio.ensure_future(agent.run_turn("Read."))
    gate = await holder.held()
    await anyio.wait_all_tasks_blocked()
    assert kai_flush_recorder.flushes[-2:] == ["kai-session", "kai-session"]
    gate.release()  # the calls' tasks are resumed first...
    turn.cancel()  # ...and the turn's task only after them, with its cancellation
    with pytest.raises(asyncio.CancelledError):
        await turn
    assert started == []
    assert results(kai_session) == [("a", ABORTED_BEFORE_DISPATCH), ("b", ABORTED_BEFORE_DISPATCH)]
    assert types(kai_session)[-2:] == ["step/end", "turn/end"]
