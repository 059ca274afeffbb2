"""``kai-checkpoint``: run the demo agent, and look into session logs on disk or in a database.

Subcommands::

    kai-checkpoint demo [--root STORE | --keep]
    kai-checkpoint agent --root STORE --session ID [--no-policy] [--ledger FILE] [--ask]
                         [--hang-at request|tool|approved --marker FILE [--hang-for SECONDS]]
                         [--lease-ttl SECONDS]
                         [--model-url URL --model NAME [--api-key-env NAME]]
    kai-checkpoint list ROOT [--json] [--needs-attention]
    kai-checkpoint stats ROOT [--json]
    kai-checkpoint inspect ROOT SESSION [--json | --summary] [--tail N] [--turn N]
    kai-checkpoint recover ROOT SESSION [--json | --summary] [--tail N] [--turn N]
    kai-checkpoint copy SOURCE TARGET [--session ID]

Every ROOT, STORE, SOURCE and TARGET is a store URL: a directory (the JSONL backend) or a
``postgresql://`` URI (the PostgreSQL backend).

Exit status 0 on success; 2 on bad input (a missing root or session, a corrupt log, event data
that is not valid when printed, a format this release does not read, a log in two places or in
the wrong one); 1 when the machine or the store failed (a lease lost, a session another process
holds, a database that cannot be reached, an I/O error). Either way, one line on standard error
names the problem.
``list`` prints every intact session on standard output (its id, when it was created, and its
log relative to the root) and one line per session it cannot read on standard error; it then
exits with status 2. ``list`` and ``inspect`` never write
anything. When the reader of standard output goes away (``kai-checkpoint inspect ... | head``),
the command stops quietly with status 141, as a program killed by ``SIGPIPE`` does.

Event data, session ids and paths are untrusted text: human-readable output shows every
control character in them escaped (:func:`printable`); ``--json`` output is ASCII-only JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import threading
from contextlib import asynccontextmanager, contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final, NoReturn, TextIO, cast

import anyio

from .output import (
    Console,
    JsonStream,
    LogView,
    attention,
    compact,
    each_of,
    format_time,
    print_json,
    print_log,
    printable,
    turn_spans,
)
from .persistence.core import DEFAULT_BATCH_WINDOW

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence

    from .host import ModelAdapter
    from .host.approvals import ApprovalQuestion, Approver
    from .persistence import SessionHeader, Store, StoredLog

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILURE",
    "EXIT_OK",
    "UsageError",
    "main",
]

PROG: Final = "kai-checkpoint"
EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
"""The machine or the store failed: a lease lost, a session locked, a database unreachable, an
I/O error. Trying again later may succeed."""
EXIT_BAD_INPUT: Final = 2
"""What the user asked for is wrong: no such root or session, a damaged or unsupported log."""
EXIT_BROKEN_PIPE: Final = 128 + signal.SIGPIPE


class UsageError(Exception):
    """Bad input on the command line: reported on one line, exit status 2."""


class _DemoFailed(Exception):
    """The demo's :class:`~kai_session_checkpoint_policy.demo.DemoError`, as the command
    reports it (so that other commands need not import the demo)."""

    def __str__(self) -> str:
        return str(self.__cause__)


# -------------------------------------------------------------------------------------------
# Reading logs
# -------------------------------------------------------------------------------------------


def _existing_root(root: str) -> Path:
    path = Path(root)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise UsageError(f"session root {root} {what}")
    return path


@asynccontextmanager
async def _opened(
    url: str, *, existing: bool = True, lease_ttl: float | None = None
) -> AsyncIterator[Store]:
    """The backend of the store *url* (a directory that must exist, if *existing*), closed
    afterwards."""
    from .persistence import is_postgres_url, open_store

    if existing and not is_postgres_url(url):
        _existing_root(url)
    if lease_ttl is not None and not is_postgres_url(url):
        raise UsageError(f"--lease-ttl applies to a postgresql:// store, not to {url}")
    if is_postgres_url(url):
        _quiet_driver()
    backend = open_store(url, lease_ttl=lease_ttl)
    try:
        yield backend
    finally:
        await backend.aclose()


def _quiet_driver() -> None:
    """Keep the PostgreSQL driver's log lines (its pool's connection attempts and discarded
    connections) off standard error: the command reports a failure in one line of its own."""
    driver = logging.getLogger("psycopg")
    if not any(isinstance(handler, logging.NullHandler) for handler in driver.handlers):
        driver.addHandler(logging.NullHandler())


async def _list(args: argparse.Namespace) -> int:
    """The intact sessions on standard output; one line per unreadable one on standard error."""
    from .persistence import JsonlSessionPersistence, display_url

    if args.needs_attention:
        return await _needs_attention(args)
    async with _opened(args.root) as backend:
        listing = await backend.scan_sessions()
    console = Console.for_stream(sys.stdout, live=False)
    if args.json:  # one object per session, ASCII, the header's fields under their own names
        for header in listing.headers:
            record = {"id": header.id, "createdAt": header.created_at, "version": header.version}
            if header.cwd is not None:
                record["cwd"] = header.cwd
            console.line(json.dumps(record, separators=(",", ":")))
    elif not listing.headers and not listing.problems:
        console.line(console.dim(f"no sessions under {printable(display_url(args.root))}"))
    # A directory's sessions are listed with their log file (the layout, and compression).
    logs = listing.logs or (None,) * len(listing.headers)
    for header, log in () if args.json else zip(listing.headers, logs, strict=True):
        line = f"{printable(header.id)}\t{format_time(header.created_at)}"
        if log is not None and isinstance(backend, JsonlSessionPersistence):
            line += f"\t{printable(str(log.relative_to(backend.root)))}"
        if header.cwd is not None:  # the session's working directory
            line += f"\tcwd {printable(header.cwd)}"
        console.line(line)
    sys.stdout.flush()
    for problem in listing.problems:
        directory = printable(str(problem.directory))
        print(f"{PROG}: cannot list {directory}: {_problem(problem.error)}", file=sys.stderr)
    return EXIT_BAD_INPUT if listing.problems else EXIT_OK


async def _surveyed(
    backend: Store, what: str, failed: list[Exception]
) -> AsyncIterator[tuple[SessionHeader, StoredLog]]:
    """Each intact session of *backend*, oldest first, read without changing anything.

    Each session that cannot be read gets a line on standard error naming it, and its error
    is added to *failed* (the command then exits with status 2).
    """
    from .events import StoredDataError
    from .persistence import PersistenceError

    listing = await backend.scan_sessions()
    for problem in listing.problems:
        directory = printable(str(problem.directory))
        print(f"{PROG}: cannot {what} {directory}: {_problem(problem.error)}", file=sys.stderr)
        failed.append(problem.error)
    for header in listing.headers:
        try:
            log = await backend.inspect(header.id)
        except (PersistenceError, OSError, StoredDataError) as exc:
            session = printable(header.id)
            print(f"{PROG}: cannot {what} session {session}: {_problem(exc)}", file=sys.stderr)
            failed.append(exc)
        else:
            yield header, log


async def _needs_attention(args: argparse.Namespace) -> int:
    """``list --needs-attention``: the sessions whose last turn is open, or whose last
    unknown outcome no model has answered yet."""
    failed: list[Exception] = []
    console = Console.for_stream(sys.stdout, live=False)
    async with _opened(args.root) as backend:
        async for header, log in _surveyed(backend, "read", failed):
            found = attention(log.events)
            if not found.needed:
                continue
            if args.json:
                record = {
                    "id": header.id,
                    "createdAt": header.created_at,
                    "version": header.version,
                    "openTurn": None if found.open_turn is None else found.turn,
                    "turnOpen": found.open_turn is not None,
                    "unanswered": list(found.unanswered),
                }
                console.line(json.dumps(record, separators=(",", ":")))
            else:
                created = format_time(header.created_at)
                console.line(f"{printable(header.id)}\t{created}\t{found.reasons()}")
    sys.stdout.flush()
    return EXIT_BAD_INPUT if failed else EXIT_OK


async def _stats(args: argparse.Namespace) -> int:
    """``stats``: the store's sessions, events and bytes, and its oldest open turn."""
    from .persistence import JsonlSessionPersistence

    sessions = events = size = open_turns = 0
    failed: list[Exception] = []
    oldest: tuple[int, str, int | None] | None = None  # when it started, the session, the turn
    async with _opened(args.root) as backend:
        async for header, log in _surveyed(backend, "count", failed):
            sessions += 1
            count = len(log.events)
            events += count
            if isinstance(backend, JsonlSessionPersistence):
                size += os.stat(log.location).st_size
            else:  # the records' JSON text, as the database holds it
                each = each_of(log.events, range(count))
                size += sum(len(event.encode().encode()) for event in each)
            found = attention(log.events)
            if found.open_turn is not None:
                open_turns += 1
                started = (found.open_turn.time, header.id, found.turn)
                oldest = started if oldest is None else min(oldest, started)
    unreadable = len(failed)
    console = Console.for_stream(sys.stdout, live=False)
    if args.json:
        turn = None
        if oldest is not None:
            turn = {"session": oldest[1], "turn": oldest[2], "startedAt": oldest[0]}
        record = {
            "sessions": sessions,
            "unreadable": unreadable,
            "events": events,
            "bytes": size,
            "openTurns": open_turns,
            "oldestOpenTurn": turn,
        }
        console.line(json.dumps(record, separators=(",", ":")))
    else:
        console.line(f"sessions          {sessions}")
        if unreadable:
            console.line(f"unreadable        {unreadable}")
        console.line(f"events            {events}")
        console.line(f"bytes             {size}")
        console.line(f"open turns        {open_turns}")
        if oldest is not None:
            since, session, number = oldest
            what = "a turn" if number is None else f"turn {number}"
            console.line(
                f"oldest open turn  {what} of session {printable(session)}, "
                f"started {format_time(since)}"
            )
    sys.stdout.flush()
    return EXIT_BAD_INPUT if unreadable else EXIT_OK


async def _show_log(args: argparse.Namespace) -> int:
    """``inspect`` (read-only), or ``recover`` (writing the repair), then print the log.

    The events are printed from the log's stored form one at a time, never all made at once;
    ``inspect --json`` of a whole JSONL log writes each event as soon as it is read.
    """
    view = LogView(as_json=args.json, summary=args.summary, tail=args.tail, turn=args.turn)
    out = _Stoppable(sys.stdout)
    stdout = cast("TextIO", out)
    status = EXIT_OK
    failed: Exception | None = None
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            if threading.current_thread() is threading.main_thread():
                group.start_soon(_stop_on_interrupt, out, scope)
            try:
                status = await _show(args, view, out, stdout)
            except _Stopped:  # JSON written as it was read
                out.stopped = True
            except Exception as exc:  # raised below as it is, not in an exception group
                failed = exc
            group.cancel_scope.cancel()
    if out.stopped:
        raise KeyboardInterrupt
    if failed is not None:
        raise failed
    return status


async def _show(args: argparse.Namespace, view: LogView, out: _Stoppable, stdout: TextIO) -> int:
    from .persistence import JsonlSessionPersistence

    to_terminal = sys.stdout.isatty()
    whole_json = args.json and not args.recover and args.turn is None and args.tail is None
    doing = "recovering" if args.recover else "reading"
    async with _opened(args.root) as backend:
        streamed = whole_json and isinstance(backend, JsonlSessionPersistence)
        # Progress on a terminal for the whole command, but not over output on the same one.
        async with _progress(f"{doing} {args.session}", show=not (streamed and to_terminal)) as (
            progress
        ):
            if isinstance(backend, JsonlSessionPersistence) and streamed:
                stream = JsonStream(stdout)
                log = await backend.inspect(args.session, watch=stream)
                write: Callable[[], None] = partial(
                    print_json,
                    log,
                    stream=stdout,
                    added_on_disk=False,
                    view=view,
                    written=stream.written,
                )
            else:
                log = await (backend.load if args.recover else backend.inspect)(args.session)
                if args.turn is not None:
                    _check_turn(log, args)
                write = partial(
                    print_log, log, added_on_disk=args.recover, stream=stdout, view=view
                )
            if out.stopped:  # interrupted while reading, which cannot be cancelled
                return EXIT_OK  # (the caller tells the interrupt)
            if to_terminal:
                progress.stop()
            else:
                progress.what = f"writing {args.session}"
            # In a thread, so that the progress goes on; stopped when interrupted.
            await anyio.to_thread.run_sync(partial(_write_out, write), abandon_on_cancel=True)
    return EXIT_OK


async def _stop_on_interrupt(out: _Stoppable, scope: anyio.CancelScope) -> None:
    """At the first SIGINT (Ctrl-C), stop the writes to *out* and cancel *scope*.

    The signal wakes the event loop whichever thread it reaches; a write in progress in a
    worker thread stops at its next line, and a read that cannot be cancelled at its end.
    """
    with anyio.open_signal_receiver(signal.SIGINT) as signals:
        async for _ in signals:
            out.stopped = True
            scope.cancel()
            return


def _write_out(write: Callable[[], None]) -> None:
    try:
        write()
        sys.stdout.flush()
    except _Stopped:
        pass


class _Stopped(Exception):
    """The command was interrupted while its output was being written."""


class _Stoppable:
    """Standard output, for a writer in another thread that must stop when the command is
    interrupted (Ctrl-C): its next write raises :class:`_Stopped`."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.stopped = False

    def write(self, text: str) -> int:
        if self.stopped:
            raise _Stopped
        return self.stream.write(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()


def _check_turn(log: StoredLog, args: argparse.Namespace) -> None:
    """Refuse ``--turn N`` of a turn the log does not hold, naming those it holds."""
    count = len(log.events) - len(log.repair) if args.recover else len(log.events)
    numbered = sorted(
        {span.turn for span in turn_spans(log.events, count) if span.turn is not None}
    )
    if args.turn not in numbered:
        held = f"turns {numbered[0]} to {numbered[-1]}" if numbered else "no turn"
        raise UsageError(f"session {args.session} has no turn {args.turn}: it holds {held}")


PROGRESS_DELAY_ENV: Final = "KAI_CHECKPOINT_PROGRESS_DELAY"
"""Seconds a command may take before its progress is shown (default 1)."""


class _Progress:
    """What the progress line says, and whether it is still wanted."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.stopped = False
        self.shown = False

    def stop(self) -> None:
        """Erase the line, if shown, and show it no more (output is about to start)."""
        self.stopped = True
        self.erase()

    def erase(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.shown = False


@asynccontextmanager
async def _progress(what: str, *, show: bool = True) -> AsyncIterator[_Progress]:
    """Show on standard error, if it is a terminal, how long a slow command has taken so far.

    Nothing is shown for a command that takes less than a second; the line is erased when it
    ends (or is stopped), so that only the command's output stays.
    """
    progress = _Progress(what)
    if not show or not sys.stderr.isatty():
        yield progress
        return
    delay = float(os.environ.get(PROGRESS_DELAY_ENV) or 1.0)
    started = anyio.current_time()

    def draw() -> None:
        if progress.stopped:
            return
        elapsed = anyio.current_time() - started
        sys.stderr.write(f"\r\x1b[K{PROG}: {printable(progress.what)}... {elapsed:.0f} s")
        sys.stderr.flush()
        progress.shown = True

    async def keep_drawing() -> None:
        await anyio.sleep(delay)
        while True:
            draw()
            await anyio.sleep(1)

    if delay <= 0:
        draw()  # at once: a delay of 0 shows the line however fast the command is
    async with anyio.create_task_group() as group:
        group.start_soon(keep_drawing)
        try:
            yield progress
        finally:
            group.cancel_scope.cancel()
    progress.erase()


# -------------------------------------------------------------------------------------------
# The demo agent
# -------------------------------------------------------------------------------------------


async def _agent(args: argparse.Namespace) -> int:
    from .demo import DemoError

    try:
        with _signals_wake_the_loop():
            return await _run_agent(args)
    except DemoError as exc:
        raise _DemoFailed from exc


@contextmanager
def _signals_wake_the_loop() -> Iterator[None]:
    """Let a signal wake the running asyncio event loop, whichever thread it reaches.

    asyncio's runner meets Ctrl-C with a handler that runs when the main thread runs Python
    again. A signal that reaches a worker thread (one writing a checkpoint, say) while the loop
    waits for that very write would leave the loop asleep, and the handler with it: a byte
    written for each signal to a socket the loop reads wakes it. (Trio does this itself.)
    """
    loop = asyncio._get_running_loop()  # None off asyncio
    if loop is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)

    def drain() -> None:
        with suppress(OSError):  # empty: BlockingIOError
            while reader.recv(4096):
                pass

    loop.add_reader(reader.fileno(), drain)
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        loop.remove_reader(reader.fileno())
        reader.close()
        writer.close()


async def _run_agent(args: argparse.Namespace) -> int:
    from .demo import MODEL, PROVIDER, run_agent
    from .persistence import SessionNotFoundError, display_url

    if (args.hang_at is None) != (args.marker is None):
        raise UsageError("--hang-at and --marker go together")
    if args.hang_for is not None and args.hang_at is None:
        raise UsageError("--hang-for goes with --hang-at")
    if args.hang_at == "approved" and not args.ask:
        raise UsageError("--hang-at approved goes with --ask")
    adapter = _model_adapter(args)
    async with _opened(args.root, existing=False, lease_ttl=args.lease_ttl) as backend:
        try:
            await backend.inspect(args.session)
        except SessionNotFoundError:
            pass
        else:
            if not args.ask:  # with --ask, the session is resumed: a question may be pending
                where = display_url(args.root)
                raise UsageError(f"session {args.session} already exists under {where}")
    outcome = await run_agent(
        args.root,
        args.session,
        use_policy=not args.no_policy,
        hang_at=args.hang_at,
        marker=None if args.marker is None else Path(args.marker),
        ledger=None if args.ledger is None else Path(args.ledger),
        batch_window=args.batch_window,
        hang_for=args.hang_for,
        lease_ttl=args.lease_ttl,
        provider=PROVIDER if adapter is None else "openai",
        model=MODEL if adapter is None else args.model,
        adapter=adapter,
        approver=_terminal_approver(args),
        show_pending=_show_pending,
    )
    reason = printable(compact(outcome.reason))
    print(f"session {printable(args.session)}, turn {outcome.turn}: {reason}")
    if outcome.text:
        print(f"assistant: {printable(outcome.text)}")
    return EXIT_OK if outcome.error is None else EXIT_FAILURE


def _terminal_approver(args: argparse.Namespace) -> Approver | None:
    """With ``--ask``: the approver that asks on standard error and reads standard input."""
    from .demo.terminal import TerminalApprover

    return TerminalApprover(sys.stderr, sys.stdin.fileno()) if args.ask else None


def _show_pending(questions: list[ApprovalQuestion]) -> None:
    """Show on standard error the questions a resumed session has left unanswered."""
    from .demo.terminal import pending_lines

    for line in pending_lines(questions):
        print(line, file=sys.stderr)


def _model_adapter(args: argparse.Namespace) -> ModelAdapter | None:
    """The adapter of ``--model-url``, or ``None`` for the scripted model."""
    if args.model_url is None and args.model is None:
        if args.api_key_env is not None:
            raise UsageError("--api-key-env goes with --model-url")
        return None
    if args.model_url is None or args.model is None:
        raise UsageError("--model-url and --model go together")
    if args.hang_at == "request":
        raise UsageError("--hang-at request stops inside the scripted model, not with --model-url")
    try:
        from .adapters.openai_compat import DEFAULT_API_KEY_ENV, OpenAICompatibleModel
    except ImportError as exc:
        raise UsageError(
            f"--model-url needs the openai extra ({exc}): "
            "pip install 'kai-session-checkpoint-policy[openai]'"
        ) from exc
    try:
        return OpenAICompatibleModel(
            args.model_url, api_key_env=args.api_key_env or DEFAULT_API_KEY_ENV
        )
    except ValueError as exc:
        raise UsageError(f"--model-url: {exc}") from exc


async def _demo(args: argparse.Namespace) -> int:
    from .demo import DemoError, run_demo

    try:
        await run_demo(args.root, Console.for_stream(sys.stdout), keep=args.keep)
    except DemoError as exc:
        raise _DemoFailed from exc
    return EXIT_OK


# -------------------------------------------------------------------------------------------
# Copying between stores
# -------------------------------------------------------------------------------------------


async def _copy(args: argparse.Namespace) -> int:
    """Copy each session of SOURCE (or the one given) that TARGET does not have yet.

    A session that cannot be copied (TARGET has it, it is locked, its log is corrupt) gets one
    line on standard error and does not stop the others; the status is then 2.
    """
    from .contract import SessionExistsError
    from .persistence import PersistenceError, copy_session, display_url

    refused = 0
    async with _opened(args.source) as source, _opened(args.target, existing=False) as target:
        if args.session is not None:
            session_ids = [args.session]
        else:
            listing = await source.scan_sessions()
            session_ids = [header.id for header in listing.headers]
            for unreadable in listing.problems:
                directory = printable(str(unreadable.directory))
                reason = _problem(unreadable.error)
                print(f"{PROG}: cannot copy {directory}: {reason}", file=sys.stderr)
                refused += 1
        for session_id in session_ids:
            try:
                log = await copy_session(source, target, session_id)
            except SessionExistsError:
                problem = f"{printable(display_url(args.target))} already has it"
            except PersistenceError as exc:
                if args.session is not None:
                    raise
                problem = _problem(exc)
            else:
                count = len(log.events)
                print(f"copied session {printable(session_id)}: {count} events")
                continue
            print(
                f"{PROG}: not copying session {printable(session_id)}: {problem}", file=sys.stderr
            )
            refused += 1
    return EXIT_BAD_INPUT if refused else EXIT_OK


# -------------------------------------------------------------------------------------------
# Command line
# -------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on standard error, exit status 2."""

    def error(self, message: str) -> NoReturn:
        problem = printable(message)  # it may quote the command line
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {problem} (see '{self.prog} --help')\n")


def _count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise argparse.ArgumentTypeError(f"not a whole number, 0 or more: {text!r}")
    return count


def _positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return seconds


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description=(
            "Run the checkpoint policy's demo agent, and look into session logs written by "
            "the JSONL or PostgreSQL backends. A store is a directory or a postgresql:// URI."
        ),
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        help="the whole story: a normal turn, a crash with the policy, a crash without it",
        description=(
            "Run one turn with every checkpoint shown, then the same turn killed with SIGKILL "
            "inside a side-effecting tool and recovered, then the same crash without the "
            "policy."
        ),
    )
    demo.add_argument(
        "--root",
        metavar="STORE",
        help="keep the sessions in STORE (default: a temporary directory, removed at the end)",
    )
    demo.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory (sessions, ledgers, markers) and say where it is",
    )
    demo.set_defaults(run=_demo)

    agent = commands.add_parser(
        "agent",
        help="one scripted turn of the demo agent, optionally hanging at a marked point",
        description=(
            "Run one turn of the demo agent: the scripted model asks for one send_payment call "
            "and then answers (with --model-url, a real model is asked instead). With --hang-at "
            "the process writes a marker file at that point "
            "and waits forever, to be killed from outside."
        ),
    )
    agent.add_argument(
        "--root", required=True, metavar="STORE", help="the session store (a directory or URI)"
    )
    agent.add_argument("--session", required=True, metavar="ID", help="a new session id")
    agent.add_argument(
        "--no-policy", action="store_true", help="load the backend without the checkpoint policy"
    )
    agent.add_argument(
        "--hang-at",
        choices=("request", "tool", "approved"),
        help=(
            "request: inside the model adapter, writing 'request-dispatched'; tool: inside "
            "send_payment after the payment, writing 'tool-side-effect'; approved (with "
            "--ask): once the yes is durable, before the call starts, writing "
            "'approval-decided'"
        ),
    )
    agent.add_argument(
        "--ask",
        action="store_true",
        help="send_payment waits for a yes: the question goes to standard error, the answer "
        "(y or n) is read from standard input; an existing session is resumed, and the "
        "questions a crash or Ctrl-C left unanswered are shown and asked again",
    )
    agent.add_argument("--marker", metavar="FILE", help="the marker file written by --hang-at")
    agent.add_argument(
        "--ledger",
        metavar="FILE",
        help="append each payment to FILE as a JSON line (default: print it)",
    )
    agent.add_argument(
        "--batch-window",
        type=_positive_seconds,
        default=DEFAULT_BATCH_WINDOW,
        metavar="SECONDS",
        help=f"how long an event may wait for a background batch (default: {DEFAULT_BATCH_WINDOW})",
    )
    _add_store_options(agent)
    _add_model_options(agent)
    agent.set_defaults(run=_agent)

    listing = commands.add_parser(
        "list",
        help="the sessions under ROOT",
        description=(
            "the sessions stored under ROOT (a directory, or a postgresql:// URI), oldest "
            "first: each id, when it was created, and, in a directory, its log relative to "
            "ROOT. A session whose log cannot be read gets one line on standard error, and "
            "the command then exits with status 2. Nothing is written."
        ),
    )
    listing.add_argument("root", metavar="ROOT", help="a directory or a postgresql:// URI")
    listing.add_argument(
        "--json", action="store_true", help="one object per session: id, createdAt, version"
    )
    listing.add_argument(
        "--needs-attention",
        action="store_true",
        help="only the sessions whose last turn is open, or whose last unknown tool outcome no "
        "model has answered yet, and why (reads every log)",
    )
    listing.set_defaults(run=_list)

    stats = commands.add_parser(
        "stats",
        help="how many sessions, events and bytes ROOT holds, and its oldest open turn",
        description=(
            "Count what the store ROOT (a directory, or a postgresql:// URI) holds: its "
            "sessions, their events, their bytes (a directory: the log files as stored; a "
            "database: the records' JSON text), the turns still open and the oldest of them. "
            "Every log is read; nothing is written."
        ),
    )
    stats.add_argument("root", metavar="ROOT", help="a directory or a postgresql:// URI")
    stats.add_argument("--json", action="store_true", help="one object with the same figures")
    stats.set_defaults(run=_stats)

    for name, summary in (
        ("inspect", "read-only: the stored log, and the repair recovery would add, marked as such"),
        ("recover", "recover the session (writing the repair) and print its log"),
    ):
        command = commands.add_parser(name, help=summary, description=summary)
        command.add_argument("root", metavar="ROOT")
        command.add_argument("session", metavar="SESSION")
        shape = command.add_mutually_exclusive_group()
        shape.add_argument(
            "--json",
            action="store_true",
            help="one record per line: the header, each event exactly as stored, the torn tail, "
            "the repair",
        )
        shape.add_argument(
            "--summary",
            action="store_true",
            help="counts by event type, the turns, the open turn, the repair",
        )
        command.add_argument("--tail", type=_count, metavar="N", help="only the last N events")
        command.add_argument("--turn", type=_count, metavar="N", help="only the events of turn N")
        command.set_defaults(run=_show_log, recover=name == "recover")
    _add_copy_command(commands)
    return parser


def _add_store_options(agent: argparse.ArgumentParser) -> None:
    """``agent``'s options for stopping a while, and for a PostgreSQL store."""
    agent.add_argument(
        "--hang-for",
        type=_positive_seconds,
        metavar="SECONDS",
        help="with --hang-at, wait that long instead of forever, then go on with the turn",
    )
    agent.add_argument(
        "--lease-ttl",
        type=_positive_seconds,
        metavar="SECONDS",
        help="how long the session's lease lasts unless renewed (postgresql:// stores only)",
    )


def _add_model_options(agent: argparse.ArgumentParser) -> None:
    """``agent``'s options for a real model endpoint in place of the scripted model."""
    agent.add_argument(
        "--model-url",
        metavar="URL",
        help="stream from this OpenAI-compatible endpoint (its base, such as "
        "https://api.openai.com/v1) instead of the scripted model; needs --model",
    )
    agent.add_argument("--model", metavar="NAME", help="the endpoint's model name")
    agent.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="the environment variable holding the API key (default: OPENAI_API_KEY)",
    )


def _add_copy_command(commands: argparse._SubParsersAction[_Parser]) -> None:
    summary = "copy sessions from one store to another, refusing those the target already has"
    copy = commands.add_parser(
        "copy",
        help=summary,
        description=(
            f"{summary}. Each session is recovered in SOURCE first (as 'recover' does), then "
            "written whole to TARGET."
        ),
    )
    copy.add_argument("source", metavar="SOURCE")
    copy.add_argument("target", metavar="TARGET")
    copy.add_argument("--session", metavar="ID", help="copy only this session")
    copy.set_defaults(run=_copy)


def _problem(exc: Exception) -> str:
    text = " ".join(printable(str(exc)).split())
    return text or type(exc).__name__


def _version() -> str:
    from importlib.metadata import version

    return version("kai-session-checkpoint-policy")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kai-checkpoint`` with *argv* (default: the process arguments); return the status."""
    from .contract import SessionExistsError
    from .events import StoredDataError
    from .host import SessionError
    from .persistence import PersistenceError
    from .persistence.errors import (
        CorruptLogError,
        DuplicateLogError,
        InvalidSessionIdError,
        MisplacedLogError,
        NotARegularFileError,
        RecoveryRequiredError,
        SessionNotFoundError,
        UnsupportedFormatError,
    )

    bad_input = (  # what the user got wrong; other persistence errors are failures
        CorruptLogError,
        DuplicateLogError,
        InvalidSessionIdError,
        MisplacedLogError,
        NotARegularFileError,
        RecoveryRequiredError,
        SessionNotFoundError,
        UnsupportedFormatError,
    )

    args = _parser().parse_args(argv)
    try:
        status: int = anyio.run(args.run, args)
    except BrokenPipeError:  # the reader of standard output is gone: stop, as SIGPIPE would
        return EXIT_BROKEN_PIPE
    except (UsageError, StoredDataError, SessionExistsError, *bad_input) as exc:
        print(f"{PROG}: {_problem(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (_DemoFailed, OSError, PersistenceError, SessionError) as exc:
        print(f"{PROG}: {_problem(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    except asyncio.CancelledError:
        # Python 3.10's runner meets Ctrl-C by cancelling the main task, and the cancellation
        # is all that comes out (from 3.11 on, KeyboardInterrupt). Nothing else cancels it.
        if tuple(sys.version_info) >= (3, 11):
            raise
        return 130
    return status
