"""The invariants every recovered session must satisfy, checked by one function for all suites.

:func:`check_recovery` is called after every SIGKILL of the crash matrix, every simulated power
loss, and every injected I/O fault. It returns the violations it finds, as sentences; an empty
list means the recovered log keeps every promise the library made.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kai_session_checkpoint_policy import (
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    SessionEvent,
    eventdata,
    persistence,
)
from kai_session_checkpoint_policy.persistence.jsonl.format import scan_log

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from kai_session_checkpoint_policy.persistence import CorruptLogError, StoredLog

__all__ = [
    "Expected",
    "check_recovery",
    "decode_event",
    "dispatch_problems",
    "refusal_problems",
    "transcript_problems",
]


@dataclass(frozen=True, slots=True)
class Expected:
    """What the live process did before the crash, as far as the crash could have seen it.

    ``written``: every event the live session appended, in order. ``acknowledged``: how many
    of them a completed flush had reported durable. ``started``: the model tool calls whose
    body had started (so their side effect may have happened).
    """

    written: Sequence[SessionEvent]
    acknowledged: int
    started: frozenset[str] = frozenset()


def decode_event(line: str) -> SessionEvent:
    """Decode one encoded event line (as :meth:`SessionEvent.encode` writes it)."""
    return persistence.decode_event(line, json.loads(line)["seq"])


def _calls(event: SessionEvent) -> list[str]:
    return eventdata.tool_call_ids(event.data)


def _answered(event: SessionEvent) -> str:
    return str(eventdata.result_call_id(event.data))


def _code(event: SessionEvent) -> object:
    error = eventdata.error_of(event.data)
    return None if error is None else error["code"]


def transcript_problems(events: Iterable[SessionEvent]) -> list[str]:
    """Why a model provider would reject this transcript; empty if it would accept it.

    Every tool call of an assistant message is answered by exactly one tool result before the
    next user or assistant message; no result answers an unknown or answered call; every turn
    and step that starts also ends, without nesting.
    """
    problems: list[str] = []
    asked: set[str] = set()
    unanswered: list[str] = []
    turn_open = step_open = False
    for event in events:
        where = f"seq {event.seq} ({event.type})"
        if event.type in ("user/message", "assistant/message") and unanswered:
            problems.append(f"{where}: calls {unanswered} are still unanswered")
            unanswered = []
        if event.type == "assistant/message":
            for call in _calls(event):
                if call in asked:
                    problems.append(f"{where}: call id {call!r} is asked for twice")
                asked.add(call)
                unanswered.append(call)
        elif event.type == "tool/result":
            call = _answered(event)
            if call in unanswered:
                unanswered.remove(call)
            else:
                problems.append(f"{where}: answers {call!r}, which no pending call asked for")
        elif event.type == "turn/start":
            if turn_open:
                problems.append(f"{where}: a turn starts inside a turn")
            turn_open = True
        elif event.type == "turn/end":
            if not turn_open or step_open:
                problems.append(f"{where}: ends a turn that is not open, or with a step open")
            turn_open = False
        elif event.type == "step/start":
            if not turn_open or step_open:
                problems.append(f"{where}: a step starts outside a turn or inside a step")
            step_open = True
        elif event.type == "step/end":
            if not step_open:
                problems.append(f"{where}: ends a step that is not open")
            step_open = False
    if unanswered:
        problems.append(f"the transcript ends with calls {unanswered} unanswered")
    if turn_open or step_open:
        problems.append("the transcript ends inside a turn")
    return problems


def check_recovery(
    recovered: StoredLog | None,
    reloaded: StoredLog | None,
    expected: Expected,
    *,
    effects_during_recovery: int = 0,
    tail_cut: bool | None = None,
) -> list[str]:
    """Check one recovered session against what the live process did.

    :param recovered: The result of the first ``load`` after the crash (``None``: no log).
    :param reloaded: The result of loading again, from what the first load left durable.
    :param expected: What the live process did before the crash.
    :param effects_during_recovery: Side effects performed while recovering (must be 0).
    :param tail_cut: Whether recovery of the crashed log cut a torn tail; by default, whether
        *recovered* did (a recovery that was itself interrupted may have cut it already).
    """
    if recovered is None:
        if expected.acknowledged or expected.started:
            return [
                f"the log is gone, yet {expected.acknowledged} events were acknowledged "
                f"and calls {sorted(expected.started)} started"
            ]
        return [] if reloaded is None else ["a second load found a log the first did not"]
    problems: list[str] = []
    events, repair = recovered.events, recovered.repair
    stored = events[: len(events) - len(repair)]
    seqs = [event.seq for event in events]
    if seqs != list(range(len(events))):
        problems.append(f"seqs are not contiguous from 0: {seqs}")
    if len(stored) < expected.acknowledged:
        problems.append(
            f"acknowledged events lost: {expected.acknowledged} were acknowledged, "
            f"{len(stored)} survived"
        )
    if len(stored) > len(expected.written):
        problems.append(f"{len(stored)} events stored, only {len(expected.written)} written")
    for event, written in zip(stored, expected.written, strict=False):
        if event != written:
            problems.append(f"seq {event.seq} changed: stored {event!r}, written {written!r}")
            break
    # Repair: one result per unanswered call, classified by the evidence in the stored log:
    # a call is not started only if its tool/call is not there and no bytes were cut after it.
    cut = recovered.torn_bytes > 0 if tail_cut is None else tail_cut
    recorded = {str(e.data.get("callId")) for e in stored if e.type == "tool/call"}
    tool_calls = [str(e.data.get("callId")) for e in events if e.type == "tool/call"]
    if len(tool_calls) != len(set(tool_calls)):
        problems.append(f"a call was recorded as started twice: {tool_calls}")
    for closer in repair:
        if closer.type != "tool/result":
            continue
        call, code = _answered(closer), _code(closer)
        want = TOOL_OUTCOME_UNKNOWN if call in recorded or cut else TOOL_NOT_STARTED
        if code != want:
            problems.append(f"repaired call {call!r} is {code}, its evidence says {want}")
    for call in sorted(expected.started):
        if call not in recorded:
            problems.append(f"call {call!r} ran its body, but its tool/call is not durable")
        for event in events:
            answers = event.type == "tool/result" and _answered(event) == call
            if answers and _code(event) == TOOL_NOT_STARTED:
                problems.append(f"call {call!r} ran, but recovery says it did not start")
    problems += transcript_problems(events)
    if effects_during_recovery:
        problems.append(f"recovery performed {effects_during_recovery} side effects")
    if reloaded is None:
        problems.append("a second load did not find the log")
    elif reloaded.events != events or reloaded.repair:
        problems.append("recovery is not idempotent: a second load gives another log")
    return problems


def refusal_problems(
    refused: CorruptLogError, stored: bytes, left: bytes | None, expected: Expected
) -> list[str]:
    """Why refusing a crashed log as corrupt broke a promise; empty if the refusal keeps them.

    Without checksums, damage followed by a complete record (sectors of an unacknowledged batch
    persisted out of order) cannot be told from damage inside the log, and is refused rather
    than cut. That is acceptable only if no acknowledged event is lost or misreported: the
    refusal names the first event it could not read, which comes after every acknowledged
    event, every event before it is exactly the event written there, and the log (*stored*
    before the load, *left* after) is left as it was.
    """
    problems: list[str] = []
    if refused.seq is None:
        return [f"the refusal does not name the first event it could not read: {refused}"]
    if refused.seq < expected.acknowledged:
        problems.append(
            f"refused at seq {refused.seq}, but {expected.acknowledged} events were "
            f"acknowledged: {refused}"
        )
    if refused.byte is not None:  # a damaged frame: the whole frames before it
        prefix = stored[: refused.byte]
    else:  # a damaged line: the lines before it
        assert refused.line is not None
        prefix = b"".join(line + b"\n" for line in stored.split(b"\n")[: refused.line - 1])
    intact = scan_log(prefix, refused.path).events
    if len(intact) != refused.seq or list(intact) != list(expected.written[: len(intact)]):
        problems.append(f"the events before the refused one are not the events written: {refused}")
    if left != stored:
        problems.append(f"the refusal changed the log: {refused}")
    return problems


def dispatch_problems(points: Sequence[str]) -> list[str]:
    """Boundaries that dispatched although their checkpoint failed (fail-closed is broken).

    *points* are the instrumented points of a run (``"<label>: <what>"``). After
    ``"<label>: flush-failed"``, ``<label>`` must not reach ``adapter-start`` (a model request)
    or ``body-start`` (a tool body); after a failed pre-step checkpoint, the step must not send
    its request.
    """
    suffix = ": flush-failed"
    failed = {name.removesuffix(suffix) for name in points if name.endswith(suffix)}
    blocked = failed | {label.replace(" pre-step ", " request ") for label in failed}
    return [
        f"{label} dispatched although its checkpoint failed"
        for label, _, what in (name.rpartition(": ") for name in points)
        if what in ("adapter-start", "body-start") and label in blocked
    ]
