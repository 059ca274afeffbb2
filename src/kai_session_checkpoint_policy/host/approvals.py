"""Durable approvals: a question to a person before a tool body runs, and its answer, in the log.

A tool registered with ``needs_approval=True`` runs only once a person has said yes. The agent
asks, for each call of it, in this order::

    approval/asked     {"id", "toolName", "callId", "arguments", "reason"?}  -- then a flush
    (the agent's approver is awaited: the person decides)
    approval/decided   {"id", "outcome"}                                     -- then a flush
    tool/call          {..., "approvalId": <id>}
    (the body, if the outcome is "allowed-once")

The first flush makes the question durable before the person sees it; the second makes a yes
durable before the body can run. Either failing fails the call closed: the body does not run.
The outcomes are the original harness's: ``"allowed-once"`` (the only yes), ``"rejected"``,
``"cancelled"`` (the turn was stopped while waiting, as by Ctrl-C) and ``"unavailable"`` (no
approver, or it failed). A ``tool/call`` names the decision it ran under (``approvalId``).

After a crash or a stop, the log says where each question got to (:class:`ApprovalLedger`):

* asked and never answered by a person (no ``approval/decided``, or ``"cancelled"`` or
  ``"unavailable"``): the question is **pending**. It is never
  taken as a yes. :meth:`Agent.pending_approvals` lists it, for a host to show at once, and
  when the model asks for the same call again (the same tool with the same arguments), the
  person is asked again.
* answered (``"allowed-once"`` or ``"rejected"``) but no ``tool/call`` names the decision (the
  crash came before the call started): the answer stands. The model's next call of the same
  tool with the same arguments runs under it without asking again, once.
* named by a ``tool/call``: the decision was used; a later call asks anew.

This module imports only the event helpers; it is the reference host's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, TypeAlias

from ..eventdata import result_call_id

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..events import JSON, JSONObject
    from .sessions import SessionEvents

__all__ = [
    "APPROVAL_OUTCOMES",
    "ApprovalLedger",
    "ApprovalOutcome",
    "ApprovalQuestion",
    "Approver",
    "CallApproval",
    "approvals_by_call",
]

ApprovalOutcome: TypeAlias = Literal["allowed-once", "rejected", "cancelled", "unavailable"]
APPROVAL_OUTCOMES: Final[tuple[ApprovalOutcome, ...]] = (
    "allowed-once",
    "rejected",
    "cancelled",
    "unavailable",
)
_FINAL: Final = frozenset({"allowed-once", "rejected"})


@dataclass(frozen=True, slots=True)
class ApprovalQuestion:
    """What a person is asked: may the call *call_id* of *tool_name* run with *arguments*?

    ``asked_before`` is the id of the question this one asks again after a restart, if any.
    """

    id: str
    call_id: str
    tool_name: str
    arguments: str
    """The raw JSON text the model produced."""
    reason: str = ""
    asked_before: str | None = None


Approver: TypeAlias = "Callable[[ApprovalQuestion], Awaitable[bool]]"
"""Asks a person and returns whether they approved; an exception counts as no answer."""


def call_key(tool_name: str, arguments: str) -> tuple[str, str]:
    """What makes two calls the same call: the tool, and the arguments as parsed JSON."""
    try:
        parsed: JSON = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return tool_name, arguments
    if isinstance(parsed, dict):
        parsed = {name: value for name, value in parsed.items() if name != "idempotency_key"}
    return tool_name, json.dumps(parsed, sort_keys=True)


class ApprovalLedger:
    """Where each approval question of a session got to, read from its events in order."""

    __slots__ = ("_pending", "_questions", "_standing")

    def __init__(self) -> None:
        self._questions: dict[str, ApprovalQuestion] = {}
        self._pending: dict[tuple[str, str], ApprovalQuestion] = {}  # latest unanswered ask
        self._standing: dict[tuple[str, str], tuple[str, ApprovalOutcome]] = {}  # unused answer

    def take(self, event_type: str, data: JSONObject) -> None:
        """Take one ``approval/asked``, ``approval/decided`` or ``tool/call`` into account."""
        if event_type == "approval/asked":
            question = _question_of(data)
            if question is not None:
                self._questions[question.id] = question
                self._pending[call_key(question.tool_name, question.arguments)] = question
        elif event_type == "approval/decided":
            question = self._questions.get(str(data.get("id")))
            outcome = data.get("outcome")
            if question is not None and outcome in _FINAL:
                key = call_key(question.tool_name, question.arguments)
                if self._pending.get(key) == question:
                    del self._pending[key]
                final: ApprovalOutcome = "rejected" if outcome == "rejected" else "allowed-once"
                self._standing[key] = (question.id, final)
        elif event_type == "tool/call":
            used = data.get("approvalId")
            question = self._questions.get(used) if isinstance(used, str) else None
            if question is not None:
                key = call_key(question.tool_name, question.arguments)
                if self._standing.get(key, ("",))[0] == question.id:
                    del self._standing[key]

    def pending(self) -> list[ApprovalQuestion]:
        """The questions asked and never answered, the latest for each call, in asking order."""
        order = {question_id: index for index, question_id in enumerate(self._questions)}
        return sorted(self._pending.values(), key=lambda question: order[question.id])

    def pending_for(self, tool_name: str, arguments: str) -> ApprovalQuestion | None:
        return self._pending.get(call_key(tool_name, arguments))

    def standing(self, tool_name: str, arguments: str) -> tuple[str, ApprovalOutcome] | None:
        """The id and outcome of an answer given for this call and not used yet, if any."""
        return self._standing.get(call_key(tool_name, arguments))


class CallApproval:
    """The latest approval question of one call, and where it got to (a framework that keeps
    a call's id across the run that answers it follows its approvals by that id)."""

    __slots__ = ("answered", "outcome", "question", "used")

    def __init__(self, question: ApprovalQuestion) -> None:
        self.question = question
        self.outcome: str | None = None  # the latest decision
        self.used = False  # a tool/call ran under the decision
        self.answered = False  # a tool/result answers the call

    @property
    def call_id(self) -> str:
        return self.question.call_id

    @property
    def pending(self) -> bool:
        """Asked, and no person answered: to be asked again."""
        return self.outcome not in _FINAL and not self.answered

    @property
    def standing(self) -> bool:
        """Answered, and no call acted on the answer yet."""
        return self.outcome in _FINAL and not self.used and not self.answered


_APPROVAL_EVENTS: Final = frozenset(
    {"approval/asked", "approval/decided", "tool/call", "tool/result"}
)


def approvals_by_call(events: SessionEvents) -> dict[str, CallApproval]:
    """The latest approval question of each call in *events*, by call id, in asking order."""
    by_call: dict[str, CallApproval] = {}
    by_question: dict[str, CallApproval] = {}
    for event in events.select(_APPROVAL_EVENTS):
        data = event.data
        if event.type == "approval/asked":
            question = _question_of(data)
            if question is not None:
                asked = CallApproval(question)
                by_call[question.call_id] = by_question[question.id] = asked
        elif event.type == "approval/decided":
            decided = by_question.get(str(data.get("id")))
            outcome = data.get("outcome")
            if decided is not None and isinstance(outcome, str):
                decided.outcome = outcome
        elif event.type == "tool/call":
            used = by_question.get(str(data.get("approvalId")))
            if used is not None:
                used.used = True
        else:
            answered = by_call.get(result_call_id(data) or "")
            if answered is not None:
                answered.answered = True
    return by_call


def _question_of(data: JSONObject) -> ApprovalQuestion | None:
    question_id, tool, call_id = data.get("id"), data.get("toolName"), data.get("callId")
    arguments, reason = data.get("arguments", ""), data.get("reason", "")
    if not (isinstance(question_id, str) and isinstance(tool, str) and isinstance(call_id, str)):
        return None
    return ApprovalQuestion(
        question_id,
        call_id,
        tool,
        arguments if isinstance(arguments, str) else "",
        reason if isinstance(reason, str) else "",
    )


def asked_data(question: ApprovalQuestion) -> JSONObject:
    """The data of the ``approval/asked`` of *question*."""
    data: JSONObject = {
        "id": question.id,
        "toolName": question.tool_name,
        "callId": question.call_id,
        "arguments": question.arguments,
    }
    if question.reason:
        data["reason"] = question.reason
    return data


def decided_data(question_id: str, outcome: ApprovalOutcome) -> JSONObject:
    """The data of the ``approval/decided`` that answers *question_id*."""
    return {"id": question_id, "outcome": outcome}
