"""The original harness's format: its logs read, listed and recovered; ours read back exactly.

The roots under ``support/fixtures/original-logs`` were written by the original TypeScript backend;
each case's ``recovered.jsonl`` is what the original's own recovery made of it (see the
README there). Every test works on a copy of the root.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio
import pytest

from kai_session_checkpoint_policy import (
    Agent,
    BlockEnd,
    BlockStart,
    Finish,
    Host,
    JSONObject,
    LlmRequest,
    ReasoningDelta,
    SessionEvent,
    StreamChunk,
    TextDelta,
    Tool,
    ToolCallDelta,
    ToolExecution,
    Usage,
    policy,
)
from kai_session_checkpoint_policy.events import SurfaceReplace
from kai_session_checkpoint_policy.host import SessionError
from kai_session_checkpoint_policy.persistence import (
    CorruptLogError,
    JsonlSessionPersistence,
    OsFiles,
    PersistenceError,
    StoredLog,
    UnsupportedFormatError,
)
from kai_session_checkpoint_policy.persistence.jsonl.format import (
    Compression,
    compress_frame,
    encode_events,
    encode_header,
    scan_log,
)
from kai_session_checkpoint_policy.persistence.values import SessionHeader
from kai_session_checkpoint_policy.results import OUTCOME_UNKNOWN_TEXT

from ..support import SUPPORT
from ..support.persistence_helpers import (
    COMPLETE_TURN,
    assistant,
    events,
    find_log,
    lines,
    log_path,
    stored_events,
    tool_call,
    tree,
    write_log,
)

FIXTURES: Final = SUPPORT / "fixtures" / "original-logs"
CASES: Final = sorted(path.parent.name for path in FIXTURES.glob("*/case.json"))
COMMAND: Final = [sys.executable, "-m", "kai_session_checkpoint_policy"]


def test_every_case_of_the_original_is_here() -> None:
    assert CASES == [
        "crash-request",
        "crash-tool",
        "plain-odd-id",
        "plain-packed-closed",
        "plain-unpacked-open",
        "zstd-packed-open",
        "zstd-project-dir",
    ]


@dataclass(frozen=True)
class Case:
    name: str
    session_id: str
    compression: Compression
    root: Path
    recovered: list[str]

    def log(self) -> Path:
        (log,) = [path for path in self.root.rglob("session.jsonl*") if "torn" not in path.name]
        return log


@pytest.fixture(params=CASES)
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Case:
    name: str = request.param
    meta = json.loads((FIXTURES / name / "case.json").read_text())
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / name / "root", root)
    recovered = (FIXTURES / name / "recovered.jsonl").read_text().splitlines()
    return Case(name, meta["id"], meta["compression"], root, recovered)


def closer_summary(record: dict[str, object]) -> tuple[object, ...]:
    """What an added event must agree on: everything but the texts a model reads."""
    data = record["data"]
    assert isinstance(data, dict)
    message = data.get("message") if isinstance(data.get("message"), dict) else {}
    assert isinstance(message, dict)
    source = message.get("source") if isinstance(message.get("source"), dict) else {}
    assert isinstance(source, dict)
    return (
        record["type"],
        record["seq"],
        record["time"],
        data.get("turn"),
        data.get("step"),
        data.get("reason"),
        data.get("error"),
        source.get("callId"),
        message.get("id"),
        record.get("surfaceOp"),
        record.get("sourceEventSeqs"),
    )


def test_list_finds_each_session_with_its_id(case: Case) -> None:
    listing = anyio.run(JsonlSessionPersistence(case.root).scan_sessions)
    assert [header.id for header in listing.headers] == [case.session_id]
    assert listing.logs == (case.log(),)
    assert listing.problems == ()
    header = listing.headers[0]
    assert (header.version, header.delegation_depth, header.earlier_format) == (0, 0, False)
    cwd = "/home/dev/payments-app" if case.name == "zstd-project-dir" else None
    assert header.cwd == cwd


def test_inspect_changes_nothing_and_reads_every_stored_event(case: Case) -> None:
    before = tree(case.root)
    stored = anyio.run(JsonlSessionPersistence(case.root).inspect, case.session_id)
    assert tree(case.root) == before
    assert stored.torn_bytes == 0
    prefix = case.recovered[: len(stored.events)]
    assert [json.loads(event.encode()) for event in stored.events] == list(map(json.loads, prefix))
    # Re-encoded, every stored event is the original's line, byte for byte.
    assert [event.encode() for event in stored.events] == prefix
    assert [event.seq for event in stored.repair] == list(
        range(len(stored.events), len(case.recovered))
    )


def test_recover_adds_what_the_original_adds_and_a_second_recover_nothing(case: Case) -> None:
    backend = JsonlSessionPersistence(case.root)
    inspected = anyio.run(backend.inspect, case.session_id)
    recovered = anyio.run(backend.load, case.session_id)
    want = [json.loads(line) for line in case.recovered]
    got = [json.loads(event.encode()) for event in recovered.events]
    assert list(map(closer_summary, got)) == list(map(closer_summary, want))
    assert recovered.repair == inspected.repair
    for record in got[len(inspected.events) :]:  # the texts the model reads are our own
        if record["type"] == "tool/result":
            text = record["data"]["message"]["content"][0]["content"][0]["text"]
            assert text == f"Error: {OUTCOME_UNKNOWN_TEXT}"
            # The original records no effect class: the result is the general one, and only it.
            assert record["data"].keys() == {"turn", "step", "message", "error"}
    assert stored_events(case.log()) == recovered.events  # on disk, in the log's own format
    before = tree(case.root)
    again = anyio.run(JsonlSessionPersistence(case.root).load, case.session_id)
    assert (again.events, again.repair) == (recovered.events, ())
    assert tree(case.root) == before


def test_a_recovered_log_is_written_as_the_original_writes_it(case: Case) -> None:
    """The original's own files, written again from what was read: the same bytes."""
    stored = anyio.run(JsonlSessionPersistence(case.root).inspect, case.session_id)
    header = encode_header(stored.header)
    body = encode_events(stored.events, pack=True, compression=case.compression)
    written = (compress_frame(header) if case.compression == "zstd" else header) + body
    data = case.log().read_bytes()
    if case.name == "plain-odd-id":  # its id has a non-ASCII letter, which we write escaped
        assert written.replace(b"\\u00fc", "ü".encode()) == data
    elif case.name == "plain-unpacked-open":
        assert header + encode_events(stored.events) == data
    else:
        assert written == data


def test_the_command_line_lists_inspects_and_recovers_each_root(case: Case) -> None:
    def run(*args: str) -> tuple[int, str, str]:
        done = subprocess.run(
            [*COMMAND, *args], capture_output=True, text=True, timeout=60, check=False
        )
        return done.returncode, done.stdout, done.stderr

    status, out, err = run("list", str(case.root))
    assert (status, err) == (0, "")
    (line,) = out.splitlines()
    shown, _, where, *cwd = line.split("\t")
    assert where == str(case.log().relative_to(case.root))
    assert shown == case.session_id
    assert cwd == (["cwd /home/dev/payments-app"] if case.name == "zstd-project-dir" else [])
    before = tree(case.root)
    status, out, err = run("inspect", str(case.root), case.session_id, "--json")
    assert (status, err) == (0, "")
    header, *records = out.splitlines()
    assert header.startswith('{"header":{"type":"session","version":0,')
    stored = [line for line in records if line.startswith('{"type":')]
    assert stored == case.recovered[: len(stored)]  # every event exactly as stored
    assert tree(case.root) == before
    status, out, err = run("inspect", str(case.root), case.session_id)
    assert (status, err) == (0, "")
    if case.name == "plain-packed-closed":
        assert "(from chunks 5-16) " in out  # the chunks the message was made from
    if case.name == "crash-tool":
        assert "[crash-call of seq 11] error TOOL_OUTCOME_UNKNOWN" in out  # the call it answers
    status, out, err = run("recover", str(case.root), case.session_id, "--json")
    assert (status, err) == (0, "")
    assert [closer_summary(json.loads(line)) for line in out.splitlines()[1:]] == [
        closer_summary(json.loads(line)) for line in case.recovered
    ]


@pytest.mark.anyio
async def test_a_recovered_session_of_the_original_goes_on_in_its_own_log(case: Case) -> None:
    backend = JsonlSessionPersistence(case.root, compression="none")  # new logs plain...
    async with Host([backend, policy]) as host:
        host.llm.register_adapter("p", answer_model)
        session = await host.sessions.resume(case.session_id)
        outcome = await Agent(host, session, provider="p", model="m").run_turn("and now?")
        assert outcome.reason == {"kind": "completed"}
        await host.sessions.flush(session)
    log = case.log()  # ...but this one goes on in its own
    assert log.name == ("session.jsonl.zstd" if case.compression == "zstd" else "session.jsonl")
    assert stored_events(log) == tuple(session.events)
    listing = await JsonlSessionPersistence(case.root).scan_sessions()
    assert [header.id for header in listing.headers] == [case.session_id]


async def answer_model(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
    for piece in ("All ", "done ", "now."):
        yield TextDelta(piece)
    yield Finish("stop")


# -- what this project writes, read back ----------------------------------------------------------


async def streaming_model(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
    """Reasoning, text and a tool call streamed in pieces, usage; then, given a result, text."""
    if request.messages[-1].get("source") == {"kind": "tool", "callId": "c-1"}:
        yield BlockStart(0, "text")
        for piece in ("It ", "is ", "done", "."):
            yield TextDelta(piece)
        yield BlockEnd(0, {"type": "text", "text": "It is done."})
        yield Finish("stop")
        return
    yield BlockStart(0, "reasoning")
    for piece in ("Think", "ing ", "a ", "bit."):
        yield ReasoningDelta(piece)
    yield BlockEnd(0, {"type": "reasoning", "text": "Thinking a bit."})
    yield BlockStart(1, "tool-call")
    for piece in ('{"path"', ':"a.txt', '"}'):
        yield ToolCallDelta(1, "c-1", piece, "read")
    call: JSONObject = {"type": "tool-call", "id": "c-1", "name": "read"}
    yield BlockEnd(1, {**call, "arguments": '{"path":"a.txt"}'})
    yield Usage({"inputTokens": 10, "outputTokens": 5})
    yield Finish("tool-calls")


async def read(execution: ToolExecution) -> str:
    return "the file"


async def write_session(
    root: Path, compression: Compression, pack: bool
) -> tuple[SessionEvent, ...]:
    backend = JsonlSessionPersistence(root, compression=compression, pack_chunks=pack)
    async with Host([backend, policy]) as host:
        host.llm.register_adapter("p", streaming_model)
        host.tools.register(Tool("read", read))
        session = host.sessions.create("s")
        session.append("note", {"free": ["form", 1.5, None]}, ignorable=True)
        outcome = await Agent(host, session, provider="p", model="m").run_turn("read a.txt")
        assert outcome.reason == {"kind": "completed"}
        summary = {"id": "u-r", "role": "user", "content": [], "source": {"kind": "compaction"}}
        replaced = SurfaceReplace(1, 3)  # as a compaction writes it
        session.append("user/message", summary, surface_op=replaced, source_event_seqs=(1, 2, 3))
        await host.sessions.flush(session)
        return tuple(session.events)


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "unpacked"])
@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_every_event_written_reads_back_identical(
    tmp_path: Path, compression: Compression, pack: bool
) -> None:
    written = anyio.run(write_session, tmp_path, compression, pack)
    path = log_path(tmp_path, "s", compression)
    loaded = anyio.run(JsonlSessionPersistence(tmp_path).load, "s")
    assert (loaded.events, loaded.repair) == (written, ())
    assert [event.encode() for event in loaded.events] == [event.encode() for event in written]
    rows = [record["type"] for record in lines(path) if str(record["type"]).endswith("-chunks")]
    assert rows == (["reasoning-chunks", "tool-call-chunks", "text-chunks"] if pack else [])
    # What the agent cites: a message its chunks, a result its call.
    (message,) = [e for e in written if e.type == "assistant/message" and e.data["step"] == 1]
    chunks = [e.seq for e in written if e.type == "assistant/chunk" and e.data["step"] == 1]
    assert (message.surface_op, message.source_event_seqs) == ("append", tuple(chunks))
    (call,) = [e for e in written if e.type == "tool/call"]
    (result,) = [e for e in written if e.type == "tool/result"]
    assert (result.surface_op, result.source_event_seqs) == ("append", (call.seq,))
    user = next(e for e in written if e.type == "user/message")
    assert (user.surface_op, user.source_event_seqs) == ("append", None)


def test_the_surface_fields_and_types_are_checked_when_appended() -> None:
    from kai_session_checkpoint_policy import Session

    session = Session("s")
    with pytest.raises(SessionError, match="'note' is not an event type of the session format"):
        session.append("note", {})
    with pytest.raises(SessionError, match="only assistant/message, tool/result, user/message"):
        session.append("turn/start", {"turn": 1}, surface_op="append")
    session.append("turn/start", {"turn": 1})
    with pytest.raises(SessionError, match=r"sourceEventSeqs \[1\] are not all seqs of earlier"):
        session.append("tool/result", {}, source_event_seqs=(1,))
    with pytest.raises(SessionError, match="sourceEventSeqs of a 'tool/result' event is empty"):
        session.append("tool/result", {}, source_event_seqs=())
    assert session.seq == 1  # nothing refused was appended
    event = session.append("assistant/message", {}, source_event_seqs=())
    assert (event.surface_op, event.source_event_seqs) == ("append", ())


# -- torn tails and damage -----------------------------------------------------------------------

OPEN_CALL: Final[list[tuple[str, JSONObject]]] = [
    *COMPLETE_TURN,
    ("turn/start", {"turn": 2}),
    ("step/start", {"turn": 2, "step": 1}),
    assistant(2, 1, "c1"),
    tool_call(2, 1, "c1"),
]


def two_batches(root: Path, compression: Compression) -> tuple[Path, int, list[SessionEvent]]:
    """A log whose last batch is the durable ``tool/call`` of an open turn, in a record (or a
    frame) of its own; the log, where that batch starts, and the events."""
    logged = events(*OPEN_CALL)
    header = encode_header(SessionHeader("s", logged[0].time))
    head = compress_frame(header) if compression == "zstd" else header
    head += encode_events(logged[:-1], pack=True, compression=compression)
    path = log_path(root, "s", compression)
    path.parent.mkdir(parents=True)
    path.write_bytes(head + encode_events(logged[-1:], compression=compression))
    return path, len(head), logged


def recover_torn(root: Path, compression: Compression, keep: int) -> tuple[Path, StoredLog]:
    """Recover the log of :func:`two_batches` with only *keep* bytes of its last batch."""
    path, start, _ = two_batches(root, compression)
    path.write_bytes(path.read_bytes()[: start + keep])
    return path, anyio.run(JsonlSessionPersistence(root).load, "s")


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_torn_last_batch_is_cut_and_kept(tmp_path: Path, compression: Compression) -> None:
    path, start, logged = two_batches(tmp_path, compression)
    torn = path.read_bytes()[start : start + 20]  # no record of the last batch is whole
    path, loaded = recover_torn(tmp_path / "again", compression, 20)
    assert loaded.torn_bytes == 20
    assert path.with_name(f"{path.name}.torn-{start}").read_bytes() == torn
    assert loaded.events[: len(logged) - 1] == tuple(logged[:-1])
    assert [e.type for e in loaded.repair] == ["tool/result", "step/end", "turn/end"]
    # The cut bytes may have held the call's tool/call: its outcome is unknown, and no
    # tool/call is in the log for the result to cite.
    assert loaded.repair[0].data["error"] == {
        "name": "ToolOutcomeUnknownError",
        "code": "TOOL_OUTCOME_UNKNOWN",
    }
    assert (loaded.repair[0].surface_op, loaded.repair[0].source_event_seqs) == ("append", None)
    assert stored_events(path) == loaded.events


def test_the_repair_of_a_torn_frame_matches_the_repair_of_a_torn_line(tmp_path: Path) -> None:
    _, plain = recover_torn(tmp_path / "plain", "none", 20)
    _, compressed = recover_torn(tmp_path / "zstd", "zstd", 20)
    assert (compressed.events, compressed.repair) == (plain.events, plain.repair)


def test_a_frame_torn_in_its_checksum_keeps_every_event_it_holds(tmp_path: Path) -> None:
    path, start, logged = two_batches(tmp_path, "zstd")
    data = path.read_bytes()
    path.write_bytes(data[:-2])  # two bytes of the checksum lost
    loaded = anyio.run(JsonlSessionPersistence(tmp_path).load, "s")
    assert loaded.torn_bytes == len(data) - 2 - start
    assert loaded.events[: len(logged)] == tuple(logged)  # salvaged, and written again
    assert [e.type for e in loaded.repair] == ["tool/result", "step/end", "turn/end"]
    assert loaded.repair[0].source_event_seqs == (logged[-1].seq,)
    assert stored_events(path) == loaded.events
    assert anyio.run(JsonlSessionPersistence(tmp_path).load, "s").repair == ()


class FailingAfterTheCut(OsFiles):
    """Real files on which every write after the first truncate (a recovery's cut) fails."""

    def __init__(self) -> None:
        super().__init__()
        self.cut = False

    def truncate(self, fd: int, size: int) -> None:
        super().truncate(fd, size)
        self.cut = True

    def write(self, fd: int, data: bytes) -> None:
        if self.cut:
            raise OSError(5, "injected failure to append the repair")
        super().write(fd, data)


def test_an_interrupted_recovery_salvages_again_from_the_kept_bytes(tmp_path: Path) -> None:
    path, start, logged = two_batches(tmp_path, "zstd")
    data = path.read_bytes()
    path.write_bytes(data[:-2])
    with pytest.raises(OSError, match="injected failure"):
        anyio.run(JsonlSessionPersistence(tmp_path, files=FailingAfterTheCut()).load, "s")
    assert path.read_bytes() == data[:start]  # cut; the salvaged tool/call not written again
    loaded = anyio.run(JsonlSessionPersistence(tmp_path).load, "s")
    assert loaded.events[: len(logged)] == tuple(logged)
    assert [e.type for e in loaded.repair] == ["tool/result", "step/end", "turn/end"]
    assert loaded.repair[0].source_event_seqs == (logged[-1].seq,)


def test_a_damaged_frame_followed_by_an_intact_one_is_corruption(tmp_path: Path) -> None:
    """The checksum tells exactly: the frame after the damaged one was written after it was
    durable, so the damage is inside the log."""
    path, start, logged = two_batches(tmp_path, "zstd")
    damaged = bytearray(path.read_bytes())
    damaged[start - 8] ^= 0xFF  # inside the first batch's frame
    path.write_bytes(bytes(damaged))
    before = tree(tmp_path)
    with pytest.raises(CorruptLogError) as refused:
        anyio.run(JsonlSessionPersistence(tmp_path).load, "s")
    frame = len(compress_frame(encode_header(SessionHeader("s", logged[0].time))))
    assert (refused.value.byte, refused.value.line, refused.value.seq) == (frame, None, 0)
    assert str(refused.value) == (
        f"corrupt session log {path}, byte {frame}: the frame at byte {frame} is whole but "
        "fails its checksum: a write cut short never leaves a whole frame, so it held an "
        "acknowledged batch"
    )
    assert tree(tmp_path) == before


def test_a_last_frame_that_fails_its_checksum_is_damage_not_a_torn_tail(tmp_path: Path) -> None:
    """A whole last frame is an acknowledged batch (here, the durable ``tool/call``): cut as if
    torn, the call would vanish and be dispatched again. It is refused, and nothing changes."""
    path, start, logged = two_batches(tmp_path, "zstd")
    damaged = bytearray(path.read_bytes())
    damaged[-1] ^= 0xFF
    path.write_bytes(bytes(damaged))
    before = tree(tmp_path)
    with pytest.raises(CorruptLogError) as refused:
        anyio.run(JsonlSessionPersistence(tmp_path).load, "s")
    assert (refused.value.byte, refused.value.seq) == (start, len(logged) - 1)
    assert "is whole but fails its checksum" in str(refused.value)
    assert tree(tmp_path) == before


# -- what a reader refuses -------------------------------------------------------------------------


def test_an_event_of_an_unknown_type_is_unsupported_unless_ignorable(tmp_path: Path) -> None:
    unknown = b'{"type":"vision/frame","seq":0,"time":1,"data":{}}\n'
    header = encode_header(SessionHeader("s", 1))
    path = write_log(tmp_path, "s", header + unknown)
    for read in (JsonlSessionPersistence(tmp_path).inspect, JsonlSessionPersistence(tmp_path).load):
        with pytest.raises(UnsupportedFormatError) as refused:
            anyio.run(read, "s")
        assert str(refused.value) == (
            f"{path}, line 2: session 's': the event type 'vision/frame' (seq 0) is unknown to "
            "this release and the event is not marked ignorable; refusing to interpret the log "
            "(a newer release wrote it?)"
        )
    path.write_bytes(header + unknown[:-2] + b',"ignorable":true}\n')
    (event,) = anyio.run(JsonlSessionPersistence(tmp_path).load, "s").events
    assert (event.type, event.ignorable) == ("vision/frame", True)


@pytest.mark.parametrize(
    ("name", "data", "why"),
    [
        ("session.jsonl.zstd", b'{"type":"session"}\n', "it does not start with a Zstandard frame"),
        ("session.jsonl", compress_frame(b"x\n"), "it holds Zstandard data"),
        ("session.jsonl", b'{"rows":[1,2,3]}\n', "its first line is not a session header"),
    ],
)
def test_a_file_that_is_not_a_session_log_is_said_so(
    tmp_path: Path, name: str, data: bytes, why: str
) -> None:
    path = tmp_path / "_no-cwd" / "s" / name
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    with pytest.raises(UnsupportedFormatError, match=f"is not a session log: {why}") as refused:
        anyio.run(JsonlSessionPersistence(tmp_path).inspect, "s")
    assert not isinstance(refused.value, CorruptLogError)
    listing = anyio.run(JsonlSessionPersistence(tmp_path).scan_sessions)
    assert [type(problem.error) for problem in listing.problems] == [UnsupportedFormatError]


def test_a_session_stored_where_its_header_does_not_put_it_is_refused(tmp_path: Path) -> None:
    header = encode_header(SessionHeader("s", 1, cwd="/work"))
    path = write_log(
        tmp_path, "s", header + b'{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}\n'
    )
    with pytest.raises(PersistenceError, match=r"belong at .*/--work--/s; refusing to read it"):
        anyio.run(JsonlSessionPersistence(tmp_path).inspect, "s")
    target = tmp_path / "--work--" / "s"
    target.parent.mkdir()
    path.parent.rename(target)
    assert anyio.run(JsonlSessionPersistence(tmp_path).inspect, "s").header.cwd == "/work"


# -- this project's earlier format -----------------------------------------------------------------

EARLIER: Final = b'{"format":"kai-session","version":1,"id":"old/1","createdAt":1700000000000}\n'


def earlier_log(root: Path) -> Path:
    """A log of the earlier format and layout: a complete turn, and an open one with a call."""
    body = "".join(f"{event.encode()}\n" for event in events(*OPEN_CALL, ("note", {"n": 1})))
    body = body.replace(',"surfaceOp":"append"', "")  # the earlier format had four keys only
    path = root / "old~2F1" / "session.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(EARLIER + body.encode())
    return path


def test_a_log_in_the_earlier_format_reads_as_the_current_format_writes_it(
    tmp_path: Path,
) -> None:
    earlier_log(tmp_path)
    before = tree(tmp_path)
    stored = anyio.run(JsonlSessionPersistence(tmp_path).inspect, "old/1")
    assert tree(tmp_path) == before
    assert stored.header == SessionHeader("old/1", 1_700_000_000_000, 1, earlier_format=True)
    assert stored.events[:-1] == tuple(events(*OPEN_CALL))  # surface events "append"
    assert (stored.events[-1].type, stored.events[-1].ignorable) == ("note", True)
    assert [e.type for e in stored.repair] == ["tool/result", "step/end", "turn/end"]
    assert [h.id for h in anyio.run(JsonlSessionPersistence(tmp_path).list_sessions)] == ["old/1"]


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_recovery_converts_a_log_in_the_earlier_format(
    tmp_path: Path, compression: Compression
) -> None:
    old = earlier_log(tmp_path)
    inspected = anyio.run(JsonlSessionPersistence(tmp_path).inspect, "old/1")
    loaded = anyio.run(JsonlSessionPersistence(tmp_path, compression=compression).load, "old/1")
    new = log_path(tmp_path, "old/1", compression)
    assert loaded.events == (*inspected.events, *inspected.repair)
    assert loaded.repair == inspected.repair
    assert loaded.location == str(new)
    assert stored_events(new) == loaded.events
    assert scan_log(new.read_bytes(), new).header == SessionHeader("old/1", 1_700_000_000_000)
    assert not old.exists()
    assert old.with_name("session.jsonl.migrated").read_bytes().startswith(EARLIER)
    again = anyio.run(JsonlSessionPersistence(tmp_path).load, "old/1")
    assert (again.events, again.repair) == (loaded.events, ())
    listing = anyio.run(JsonlSessionPersistence(tmp_path).scan_sessions)
    assert (listing.logs, listing.problems) == ((new,), ())


def test_an_interrupted_conversion_is_finished_by_the_next_recovery(
    tmp_path: Path,
) -> None:
    old = earlier_log(tmp_path)

    class NoRename(OsFiles):
        def rename(self, source: Path, target: Path) -> None:
            raise OSError(5, "injected crash before the rename")

    with pytest.raises(OSError, match="injected crash"):
        anyio.run(JsonlSessionPersistence(tmp_path, files=NoRename()).load, "old/1")
    assert old.exists()
    assert find_log(tmp_path, "old/1").exists()
    listing = anyio.run(JsonlSessionPersistence(tmp_path).scan_sessions)
    assert [h.id for h in listing.headers] == ["old/1"]  # listed once, from the new log
    loaded = anyio.run(JsonlSessionPersistence(tmp_path).load, "old/1")
    assert loaded.repair == ()
    assert not old.exists()
    assert old.with_name("session.jsonl.migrated").exists()


def test_writing_a_session_whose_earlier_log_was_not_converted_is_refused(tmp_path: Path) -> None:
    earlier_log(tmp_path)

    async def write() -> None:
        backend = JsonlSessionPersistence(tmp_path)
        async with Host([backend]) as host:
            stored = await backend.inspect("old/1")
            session = host.sessions.create("old/1", seed=stored.events)
            session.append("turn/start", {"turn": 3})
            await host.sessions.flush(session)

    before = tree(tmp_path)
    with pytest.raises(PersistenceError, match="load it with recovery first, which converts it"):
        anyio.run(write)
    assert tree(tmp_path, locks=False) == {
        name: entry for name, entry in before.items() if not name.endswith("lock")
    }


def test_the_format_knows_the_original_s_48_event_types() -> None:
    from kai_session_checkpoint_policy.events import EVENT_TYPES, KNOWN_EVENT_TYPES

    assert len(KNOWN_EVENT_TYPES) == 48
    assert EVENT_TYPES <= KNOWN_EVENT_TYPES
    assert {"mode/set", "request/header-delta", "text-chunks"}.isdisjoint(KNOWN_EVENT_TYPES)


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        (
            b'{"type":"text-chunks","seq0":0,"time0":1,"data":{"turn":1,"step":1,"index":0,'
            b'"dt":[0],"texts":["a","b","c"]}}',
            "a malformed text-chunks row: dt does not hold one time step fewer than its 3 pieces",
        ),
        (
            b'{"type":"tool-call-chunks","seq0":0,"time0":1,"data":{"turn":1,"step":1,'
            b'"index":0,"dt":[0,0],"id":"c","args":["a","b",7]}}',
            "a malformed tool-call-chunks row: its pieces are not a non-empty list of strings",
        ),
        (
            b'{"type":"text-chunks","seq0":3,"time0":1,"data":{"turn":1,"step":1,"index":0,'
            b'"dt":[0],"texts":["a","b"]}}',
            "seq 3 where 0 was expected",
        ),
    ],
)
def test_a_malformed_row_is_corruption_never_a_torn_tail(
    tmp_path: Path, row: bytes, problem: str
) -> None:
    path = write_log(tmp_path, "s", encode_header(SessionHeader("s", 1)) + row + b"\n")
    with pytest.raises(CorruptLogError) as refused:
        anyio.run(JsonlSessionPersistence(tmp_path).load, "s")
    assert (refused.value.line, refused.value.seq, refused.value.problem) == (2, 0, problem)
    assert path.read_bytes().endswith(row + b"\n")
