"""The JSONL backend: batching, the flush barrier, failures, and loading with recovery."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import AsyncGenerator, AsyncIterator, Generator
from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from kai_session_checkpoint_policy import (
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    Agent,
    Finish,
    Host,
    LlmRequest,
    Session,
    SessionExistsError,
    StreamChunk,
    TextDelta,
    Tool,
    ToolExecution,
    hookimpl,
    policy,
    tool_call_block,
)
from kai_session_checkpoint_policy.hookspecs import ToolThunk
from kai_session_checkpoint_policy.persistence import (
    FORMAT_VERSION,
    JsonlSessionPersistence,
    OsFiles,
    PersistenceError,
    RollbackError,
    SeqMismatchError,
    SessionLockedError,
    SessionNotFoundError,
    StoredLog,
)

from ..support.persistence_helpers import (
    COMPLETE_TURN,
    FailingFiles,
    GatedFiles,
    assistant,
    event,
    events,
    find_log,
    lines,
    log_bytes,
    tree,
    write_log,
)

pytestmark = pytest.mark.anyio


def log_path(root: Path, session_id: str) -> Path:
    return find_log(root, session_id)


def append_turn_start(session: Session, count: int = 1) -> None:
    for turn in range(1, count + 1):
        session.append("turn/start", {"turn": turn})


@pytest.fixture
async def opened(tmp_path: Path) -> AsyncIterator[tuple[Host, JsonlSessionPersistence]]:
    backend = JsonlSessionPersistence(tmp_path / "root")
    async with Host([backend, policy]) as host:
        yield host, backend


async def test_opening_the_host_makes_it_the_persistence_service(
    opened: tuple[Host, JsonlSessionPersistence],
) -> None:
    host, backend = opened
    assert host.session_persistence is backend


async def test_nothing_is_created_before_the_first_write(tmp_path: Path) -> None:
    backend = JsonlSessionPersistence(tmp_path / "root", batch_window=60)
    async with Host([backend]) as host:
        session = host.sessions.create("lazy")
        session.append("turn/start", {"turn": 1})
        assert not (tmp_path / "root").exists()
        assert await host.sessions.flush(session) is True
        assert (tmp_path / "root").exists()


async def test_flush_writes_header_and_events_as_lines(
    opened: tuple[Host, JsonlSessionPersistence], tmp_path: Path
) -> None:
    host, backend = opened
    session = host.sessions.create("s/1")
    first = session.append("turn/start", {"turn": 1})
    second = session.append("user/message", {"text": "héllo", "n": [1, 2.5, None, True]})
    await host.sessions.flush(session)
    path = log_path(tmp_path / "root", "s/1")
    assert lines(path) == [
        {
            "type": "session",
            "version": FORMAT_VERSION,
            "id": "s/1",
            "createdAt": session.meta.created_at,
            "delegationDepth": 0,
        },
        first.to_json(),
        second.to_json(),
    ]
    assert backend.durable_count("s/1") == 2
    stored = await JsonlSessionPersistence(tmp_path / "root").inspect("s/1")
    assert stored.events == (first, second)
    assert [(e.type, e.seq) for e in stored.repair] == [("turn/end", 2)]


async def test_files_are_private(
    opened: tuple[Host, JsonlSessionPersistence], tmp_path: Path
) -> None:
    host, _ = opened
    session = host.sessions.create("private")
    append_turn_start(session)
    await host.sessions.flush(session)
    path = log_path(tmp_path / "root", "private")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "root").stat().st_mode) == 0o700


async def test_a_flush_with_nothing_admitted_succeeds_and_writes_nothing(
    opened: tuple[Host, JsonlSessionPersistence],
) -> None:
    host, backend = opened
    session = host.sessions.create("quiet")
    assert await host.sessions.flush(session) is True
    assert backend.statistics().writes == 0


async def test_the_window_writes_in_the_background_even_while_events_keep_coming(
    tmp_path: Path,
) -> None:
    files = GatedFiles()
    backend = JsonlSessionPersistence(tmp_path, batch_window=0.05, files=files)
    async with Host([backend]) as host:
        session = host.sessions.create("window")
        with anyio.fail_after(10):
            # A debounce would never fire while events keep arriving; the window does.
            while backend.durable_count("window") == 0:
                session.append("assistant/chunk", {"n": session.seq})
                await anyio.lowlevel.checkpoint()  # a checkpoint, so the timer can run
        assert backend.statistics().fsyncs == 1
        assert session.seq > backend.durable_count("window") > 0


async def test_concurrent_flushes_share_one_barrier_that_drains_late_events(
    tmp_path: Path,
) -> None:
    files = GatedFiles()
    backend = JsonlSessionPersistence(tmp_path, batch_window=60, inline_write_limit=0, files=files)
    async with Host([backend]) as host:
        session = host.sessions.create("barrier")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)  # the file exists; later batches are appends
        before = backend.statistics()
        session.append("step/start", {"turn": 1, "step": 1})
        files.gate_next = True
        finished: list[str] = []

        async def flush(name: str) -> None:
            await host.sessions.flush(session)
            finished.append(name)

        async with anyio.create_task_group() as group:
            group.start_soon(flush, "first")
            assert await anyio.to_thread.run_sync(files.entered.wait, 10)
            group.start_soon(flush, "second")
            session.append("user/message", {"late": True})  # admitted while the write runs
            await anyio.wait_all_tasks_blocked()
            assert finished == []
            files.release.set()
        assert sorted(finished) == ["first", "second"]
        assert backend.durable_count("barrier") == 3
        after = backend.statistics()
        assert (after.writes - before.writes, after.fsyncs - before.fsyncs) == (2, 2)
        assert (after.batches - before.batches, after.pending_events) == (2, 0)


async def test_a_burst_of_tool_checkpoints_costs_one_write_and_one_fsync(
    opened: tuple[Host, JsonlSessionPersistence],
) -> None:
    host, backend = opened
    session = host.sessions.create("burst")
    session.append("turn/start", {"turn": 1})
    await host.sessions.flush(session)
    before = backend.statistics()
    for index in range(32):
        session.append("tool/call", {"callId": f"c{index}"})
    async with anyio.create_task_group() as group:
        for _ in range(32):
            group.start_soon(host.sessions.flush, session)
    after = backend.statistics()
    assert (after.writes - before.writes, after.fsyncs - before.fsyncs) == (1, 1)
    assert backend.durable_count("burst") == 33


async def test_a_gap_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    backend = JsonlSessionPersistence(tmp_path)
    expected = (
        r"refusing to write seq 5 at position 0 of a batch; "
        r"the stored log holds 1 events, so seq 1 was expected"
    )
    with pytest.raises(SeqMismatchError, match=expected):  # noqa: PT012 (raised again at close)
        async with Host([backend]) as host:
            session = host.sessions.create("gap")
            session.append("turn/start", {"turn": 1})
            await host.sessions.flush(session)
            size = log_path(tmp_path, "gap").stat().st_size
            backend.session_event(session, event("step/start", 5, {}))
            with pytest.raises(SeqMismatchError, match=expected):
                await host.sessions.flush(session)
            assert log_path(tmp_path, "gap").stat().st_size == size
    assert log_path(tmp_path, "gap").stat().st_size == size


@pytest.mark.parametrize("failing", ["fsync", "write-after-partial"])
async def test_a_failed_append_is_rolled_back_and_retried_whole(
    tmp_path: Path, failing: str
) -> None:
    files = FailingFiles()
    backend = JsonlSessionPersistence(tmp_path, batch_window=60, files=files)
    async with Host([backend]) as host:
        session = host.sessions.create("retry")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
        path = log_path(tmp_path, "retry")
        size = path.stat().st_size
        session.append("step/start", {"turn": 1, "step": 1})
        session.append("user/message", {"n": 1})
        files.fail[failing] = 1
        with pytest.raises(OSError, match=f"injected {failing} failure"):
            await host.sessions.flush(session)
        assert path.stat().st_size == size
        assert backend.durable_count("retry") == 1
        assert backend.statistics().pending_events == 2
        await host.sessions.flush(session)
    assert [line.get("seq") for line in lines(path)] == [None, 0, 1, 2]


async def test_a_failed_rollback_reports_both_errors(tmp_path: Path) -> None:
    files = FailingFiles()
    backend = JsonlSessionPersistence(tmp_path, batch_window=60, files=files)
    async with Host([backend]) as host:
        session = host.sessions.create("stuck")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
        session.append("step/start", {"turn": 1, "step": 1})
        files.fail.update({"fsync": 1, "truncate": 1})
        with pytest.raises(RollbackError) as caught:
            await host.sessions.flush(session)
        assert str(caught.value.error) == "[Errno 5] injected fsync failure"
        assert str(caught.value.rollback_error) == "[Errno 5] injected truncate failure"
        assert str(log_path(tmp_path, "stuck")) in str(caught.value)
        # The next flush re-reads the file, cuts the unsynced bytes and writes the batch again.
        await host.sessions.flush(session)
    assert [line.get("seq") for line in lines(log_path(tmp_path, "stuck"))] == [None, 0, 1]


async def test_a_second_writer_of_a_session_is_refused_before_writing(tmp_path: Path) -> None:
    async with Host([JsonlSessionPersistence(tmp_path)]) as first:
        session = first.sessions.create("shared")
        session.append("turn/start", {"turn": 1})
        await first.sessions.flush(session)
        size = log_path(tmp_path, "shared").stat().st_size
        locked = "'shared' is being written by another process"
        with pytest.raises(SessionLockedError, match=locked):  # noqa: PT012 (raised again at close)
            async with Host([JsonlSessionPersistence(tmp_path)]) as second:
                rival = second.sessions.create("shared", seed=session.events)
                rival.append("step/start", {"turn": 1, "step": 1})
                with pytest.raises(SessionLockedError, match=locked):
                    await second.sessions.flush(rival)
        assert log_path(tmp_path, "shared").stat().st_size == size


async def test_a_new_session_cannot_overwrite_a_stored_one(tmp_path: Path) -> None:
    path = write_log(tmp_path, "taken", log_bytes("taken", events(*COMPLETE_TURN)))
    before = path.read_bytes()
    async with Host([JsonlSessionPersistence(tmp_path)]) as host:
        with pytest.raises(SessionExistsError) as refused:
            host.sessions.create("taken")
        assert str(refused.value) == (
            "session 'taken' already has a log in session-persistence-jsonl: continue it with "
            "'await host.sessions.resume('taken')', which recovers it first"
        )
        assert host.sessions.get("taken") is None
    assert path.read_bytes() == before


async def test_a_log_another_process_created_meanwhile_is_not_written_over(
    tmp_path: Path,
) -> None:
    exists = r"^session 'raced' already has a log of 6 events at .*; a new session cannot write"
    with pytest.raises(SessionExistsError, match=exists):  # noqa: PT012 - the close tries again
        async with Host([JsonlSessionPersistence(tmp_path)]) as host:
            session = host.sessions.create("raced")
            path = write_log(tmp_path, "raced", log_bytes("raced", events(*COMPLETE_TURN)))
            before = path.read_bytes()
            session.append("turn/start", {"turn": 1})
            with pytest.raises(SessionExistsError, match=exists):
                await host.sessions.flush(session)
    assert path.read_bytes() == before


async def test_resume_continues_a_stored_session_and_open_picks_resume_or_create(
    tmp_path: Path,
) -> None:
    write_log(tmp_path, "stored", log_bytes("stored", events(*COMPLETE_TURN)))
    async with Host([JsonlSessionPersistence(tmp_path, compression="none")]) as host:
        resumed = await host.sessions.open("stored")
        assert [event.type for event in resumed.events] == [t for t, _ in COMPLETE_TURN]
        assert host.sessions.get("stored") is resumed
        resumed.append("turn/start", {"turn": 2})
        fresh = await host.sessions.open("fresh")
        assert fresh.events == ()
        fresh.append("turn/start", {"turn": 1})
        await host.sessions.flush(resumed)
        await host.sessions.flush(fresh)
        with pytest.raises(SessionNotFoundError, match="no session 'missing'"):
            await host.sessions.resume("missing")
    assert [record["type"] for record in lines(log_path(tmp_path, "stored"))[1:]][-2:] == [
        "turn/end",
        "turn/start",
    ]


def crashed_log(tmp_path: Path) -> Path:
    """A complete turn, then turn 2 opened and a torn chunk: what a crash mid-stream leaves."""
    logged = events(
        *COMPLETE_TURN, ("turn/start", {"turn": 2}), ("step/start", {"turn": 2, "step": 1})
    )
    return write_log(tmp_path, "crashed", log_bytes("crashed", logged) + b'{"type":"assistant/ch')


async def test_inspect_shows_the_repair_and_changes_nothing(tmp_path: Path) -> None:
    crashed_log(tmp_path)
    before = tree(tmp_path)
    stored = await JsonlSessionPersistence(tmp_path).inspect("crashed")
    assert [e.seq for e in stored.events] == list(range(8))
    assert [(e.type, e.seq) for e in stored.repair] == [("step/end", 8), ("turn/end", 9)]
    assert stored.torn_bytes == len(b'{"type":"assistant/ch')
    assert tree(tmp_path) == before


async def test_load_cuts_the_torn_tail_closes_the_turn_and_continues_the_log(
    tmp_path: Path,
) -> None:
    path = crashed_log(tmp_path)
    committed = len(path.read_bytes()) - len(b'{"type":"assistant/ch')
    backend = JsonlSessionPersistence(tmp_path)
    loaded = await backend.load("crashed")
    assert [e.seq for e in loaded.events] == list(range(10))
    assert [(e.type, e.data) for e in loaded.repair] == [
        ("step/end", {"turn": 2, "step": 1}),
        ("turn/end", {"turn": 2, "reason": {"kind": "interrupted"}}),
    ]
    assert path.with_name(f"{path.name}.torn-{committed}").read_bytes() == b'{"type":"assistant/ch'
    assert [line.get("seq") for line in lines(path)] == [None, *range(10)]
    again = await backend.load("crashed")
    assert (again.events, again.repair, again.torn_bytes) == (loaded.events, (), 0)
    assert repr(loaded) == (  # counts, not a million events
        f"StoredLog(header={loaded.header!r}, events=<10 events>, repair=<2 events>, "
        "torn_bytes=21, "
        f"location={str(path)!r})"
    )
    async with Host([backend]) as host:
        resumed = host.sessions.create("crashed", seed=loaded.events)
        assert resumed.append("turn/start", {"turn": 3}).seq == 10
    assert [line.get("seq") for line in lines(path)] == [None, *range(11)]


async def test_a_missing_session_is_named(tmp_path: Path) -> None:
    backend = JsonlSessionPersistence(tmp_path)
    with pytest.raises(SessionNotFoundError, match="no session 'ghost' under"):
        await backend.inspect("ghost")
    with pytest.raises(SessionNotFoundError, match="no session 'ghost' under"):
        await backend.load("ghost")


async def test_a_symlinked_log_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(log_bytes("link", events(*COMPLETE_TURN)))
    path = log_path(tmp_path / "root", "link")
    path.parent.mkdir(parents=True)
    os.symlink(outside, path)
    with pytest.raises(PersistenceError, match="is a symbolic link; refusing to follow it"):
        await JsonlSessionPersistence(tmp_path / "root").inspect("link")


async def test_list_sessions_reads_only_headers(tmp_path: Path) -> None:
    write_log(tmp_path, "b", log_bytes("b", events(*COMPLETE_TURN)))
    write_log(tmp_path, "a/x", log_bytes("a/x", events(*COMPLETE_TURN)))
    (tmp_path / "not-a-session").mkdir()
    headers = await JsonlSessionPersistence(tmp_path).list_sessions()
    assert [header.id for header in headers] == ["a/x", "b"]
    assert await JsonlSessionPersistence(tmp_path / "absent").list_sessions() == []


@pytest.mark.usefixtures("entry_point_autoload")
async def test_the_entry_point_configures_a_backend_from_host_options(tmp_path: Path) -> None:
    options = {
        "jsonl.root": str(tmp_path),
        "jsonl.batch_window": 0.5,
        "jsonl.inline_write_limit": 0,
    }
    async with Host(options=options) as host:
        backend = host.session_persistence
        assert isinstance(backend, JsonlSessionPersistence)
        assert (backend.root, backend.batch_window, backend.inline_write_limit) == (
            tmp_path,
            0.5,
            0.0,
        )
        assert host.pm.get_plugin("session-checkpoint-policy") is policy
        assert (backend.compression, backend.pack_chunks, backend.shared_sync) == (
            "zstd",
            True,
            True,
        )
    options = {
        "jsonl.root": str(tmp_path),
        "jsonl.compression": "none",
        "jsonl.pack_chunks": False,
        "jsonl.shared_sync": False,
    }
    async with Host(options=options) as host:
        backend = host.session_persistence
        assert isinstance(backend, JsonlSessionPersistence)
        assert (backend.compression, backend.pack_chunks, backend.shared_sync) == (
            "none",
            False,
            False,
        )


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("jsonl.compression", "gzip", "must be 'zstd' or 'none', not 'gzip'"),
        ("jsonl.pack_chunks", "yes", "must be True or False, not 'yes'"),
        ("jsonl.shared_sync", 1, "must be True or False, not 1"),
    ],
)
@pytest.mark.usefixtures("entry_point_autoload")
async def test_a_format_option_must_be_one_the_backend_knows(
    option: str, value: object, problem: str, tmp_path: Path
) -> None:
    with pytest.raises(TypeError, match=f"host option '{option}' {problem}"):
        async with Host(options={"jsonl.root": str(tmp_path), option: value}):
            pass


@pytest.mark.parametrize("option", ["jsonl.batch_window", "jsonl.inline_write_limit"])
@pytest.mark.usefixtures("entry_point_autoload")
async def test_a_host_option_in_seconds_must_be_a_number(option: str, tmp_path: Path) -> None:
    message = f"host option '{option}' must be seconds, not '1s'"
    with pytest.raises(TypeError, match=re.escape(message)):
        async with Host(options={"jsonl.root": str(tmp_path), option: "1s"}):
            pass


@pytest.mark.parametrize("window", [0, -1, float("nan"), float("inf")])
def test_the_batch_window_must_be_positive(window: float) -> None:
    with pytest.raises(ValueError, match="batch_window must be a positive number of seconds"):
        JsonlSessionPersistence("root", batch_window=window)


async def test_concurrent_tool_checkpoints_of_a_turn_share_one_fsync(tmp_path: Path) -> None:
    """Eight safe calls checkpoint together: contiguous seqs, no duplicates, one fsync."""
    backend = JsonlSessionPersistence(tmp_path, batch_window=60)
    call_ids = [f"c{index}" for index in range(8)]
    calls = [
        chunk
        for index, id_ in enumerate(call_ids)
        for chunk in tool_call_block(index, id_, "lookup")
    ]
    all_started = anyio.Event()
    started: list[str] = []
    fsyncs_at_first_body: list[int] = []

    async def model(request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        if len(request.messages) == 1:
            for call in calls:
                yield call
            yield Finish("tool-calls")
        else:
            yield TextDelta("done")
            yield Finish("stop")

    async def lookup(execution: ToolExecution) -> str:
        if not started:
            fsyncs_at_first_body.append(backend.statistics().fsyncs)
        started.append(execution.call_id)
        if len(started) == len(call_ids):
            all_started.set()
        await all_started.wait()  # every body runs at the same time
        return execution.call_id

    async with Host([backend, policy]) as host:
        host.llm.register_adapter("scripted", model)
        host.tools.register(Tool("lookup", lookup, concurrency_safe=True))
        session = host.sessions.create("parallel")
        agent = Agent(host, session, provider="scripted", model="m")
        before_tools: list[int] = []

        class CountBeforeTools:
            @hookimpl(wrapper=True, tryfirst=True)
            def tools_execute(self) -> Generator[None, ToolThunk, ToolThunk]:
                downstream = yield
                if not before_tools:
                    before_tools.append(backend.statistics().fsyncs)
                return downstream

        host.register(CountBeforeTools())
        outcome = await agent.run_turn("look everything up")
        assert outcome.reason == {"kind": "completed"}
    assert sorted(started) == call_ids
    assert fsyncs_at_first_body[0] - before_tools[0] == 1  # one group commit for eight calls
    stored = await JsonlSessionPersistence(tmp_path).inspect("parallel")
    assert [event.seq for event in stored.events] == list(range(len(stored.events)))
    results = [e.data["message"] for e in stored.events if e.type == "tool/result"]
    assert [m["source"]["callId"] for m in results] == call_ids  # type: ignore[index,call-overload]


def asked_for_a_call(tmp_path: Path, tail: bytes) -> Path:
    """A log whose last complete line is an assistant message asking for call c1; then *tail*."""
    logged = events(*COMPLETE_TURN[:3], assistant(1, 1, "c1"))
    return write_log(tmp_path, "asked", log_bytes("asked", logged) + tail)


def call_outcome(stored: StoredLog) -> object:
    (result,) = [event for event in stored.repair if event.type == "tool/result"]
    error = result.data["error"]
    assert isinstance(error, dict)
    return error["code"]


@pytest.mark.parametrize(
    ("tail", "outcome"),
    [(b'{"type":"tool/call","seq":4,"ti', TOOL_OUTCOME_UNKNOWN), (b"", TOOL_NOT_STARTED)],
    ids=["torn tail", "no tail"],
)
async def test_a_call_is_not_started_only_if_nothing_was_cut_after_it(
    tmp_path: Path, tail: bytes, outcome: str
) -> None:
    """The bytes a recovery cuts may have been the call's tool/call (its body may have run)."""
    asked_for_a_call(tmp_path, tail)
    backend = JsonlSessionPersistence(tmp_path)
    assert call_outcome(await backend.inspect("asked")) == outcome
    loaded = await backend.load("asked")
    assert call_outcome(loaded) == outcome
    assert loaded.torn_bytes == len(tail)


class RepairFails(OsFiles):
    """Real files, except that writing the closers of an interrupted turn fails."""

    def write(self, fd: int, data: bytes) -> None:
        if b'"reason":{"kind":"interrupted"}' in data:
            raise OSError(5, "injected failure to append the repair")
        super().write(fd, data)


async def test_a_recovery_interrupted_after_its_cut_still_knows_bytes_were_cut(
    tmp_path: Path,
) -> None:
    """The first recovery cuts the tail, then fails to append its repair; the next one finds the
    log ending cleanly, but the kept bytes say that something was cut there."""
    path = asked_for_a_call(tmp_path, b'{"type":"tool/call","seq":4,"ti')
    with pytest.raises(OSError, match="injected failure to append the repair"):
        await JsonlSessionPersistence(tmp_path, files=RepairFails()).load("asked")
    assert path.read_bytes().endswith(b"\n")  # the cut is done, the repair is not
    for read in (JsonlSessionPersistence(tmp_path).inspect, JsonlSessionPersistence(tmp_path).load):
        stored = await read("asked")
        assert (stored.torn_bytes, call_outcome(stored)) == (0, TOOL_OUTCOME_UNKNOWN)


async def test_a_second_torn_tail_at_the_same_offset_is_kept_too(tmp_path: Path) -> None:
    path = crashed_log(tmp_path)
    committed = len(path.read_bytes()) - len(b'{"type":"assistant/ch')
    keep = path.with_name(f"{path.name}.torn-{committed}")
    keep.write_bytes(b"bytes cut by an earlier recovery")
    await JsonlSessionPersistence(tmp_path).load("crashed")
    assert keep.read_bytes() == b"bytes cut by an earlier recovery"
    assert keep.with_name(f"{keep.name}.2").read_bytes() == b'{"type":"assistant/ch'
