"""Asking a person on the terminal: the approver of ``kai-checkpoint agent --ask``.

The question goes to standard error, the answer comes from standard input, one line::

    approval needed: send_payment {"invoice": "1042", ...}
    approve? [y/N] y

``y`` or ``yes`` (in any case) approves; any other line refuses. When standard input ends
before a line comes, nobody answered: the approver raises, and the agent records the question
as ``unavailable`` (still pending, never a yes).

The line is read in a daemon thread with plain ``os.read`` calls on the descriptor: a turn
stopped while it waits (Ctrl-C) goes on at once, and the process can exit with the read still
blocked.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING, Final

import anyio
from anyio.from_thread import BlockingPortal

from ..output import printable

if TYPE_CHECKING:
    from typing import TextIO

    from ..host.approvals import ApprovalQuestion

__all__ = ["PROMPT_LINE", "STOPPED_LINE", "NoAnswerError", "TerminalApprover", "pending_lines"]

PROMPT_LINE: Final = "approve? [y/N] "
"""The text the person answers after, with no newline."""
STOPPED_LINE: Final = "stopped while waiting for an answer: the question stays pending"
"""What the person sees when the turn is stopped (Ctrl-C) at the question."""
_YES: Final = frozenset({"y", "yes"})


class NoAnswerError(EOFError):
    """Standard input ended before the person answered."""


def pending_lines(questions: list[ApprovalQuestion]) -> list[str]:
    """What a resumed session shows of the questions a crash or a stop left unanswered."""
    return [
        f"pending approval {printable(question.id)} (asked before and never answered): "
        f"{printable(question.tool_name)} {printable(question.arguments)}"
        for question in questions
    ]


class TerminalApprover:
    """Asks on *out* (standard error) and reads the answer from the descriptor *fd*."""

    def __init__(self, out: TextIO, fd: int) -> None:
        self.out = out
        self.fd = fd

    async def __call__(self, question: ApprovalQuestion) -> bool:
        out = self.out
        out.write(
            f"approval needed: {printable(question.tool_name)} {printable(question.arguments)}\n"
        )
        if question.asked_before is not None:
            out.write(f"(asked again: {printable(question.asked_before)} was never answered)\n")
        out.write(PROMPT_LINE)
        out.flush()
        try:
            line = await _read_line(self.fd)
        except anyio.get_cancelled_exc_class():
            out.write(f"\n{STOPPED_LINE}\n")
            out.flush()
            raise
        if not line:
            out.write("\n")
            out.flush()
            raise NoAnswerError("standard input ended before an answer")
        return line.decode(errors="replace").strip().lower() in _YES


async def _read_line(fd: int) -> bytes:
    """One line from *fd* (with its newline; without one at the end of input)."""
    lines: list[bytes] = []
    read = anyio.Event()
    async with BlockingPortal() as portal:

        def reader() -> None:
            lines.append(_read_line_blocking(fd))
            with contextlib.suppress(Exception):  # the wait was stopped: nobody reads it
                portal.call(read.set)

        threading.Thread(target=reader, name="kai-approval-answer", daemon=True).start()
        await read.wait()
    return lines[0]


def _read_line_blocking(fd: int) -> bytes:
    """Bytes of *fd* up to and with the first newline, one at a time so that no more is taken."""
    line = bytearray()
    while True:
        try:
            byte = os.read(fd, 1)
        except OSError:
            byte = b""
        if not byte:
            return bytes(line)
        line += byte
        if byte == b"\n":
            return bytes(line)
