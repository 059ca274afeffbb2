"""Session metadata in the log's header, forks and their seeds, and creating through a backend.

Each test runs on the JSONL backend (real files) and on the PostgreSQL backend (a real server
the tests started), on asyncio and on trio. The byte-for-byte tests compare with a root the
original harness wrote (``support/fixtures/original-logs/zstd-project-dir``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import pytest

from kai_session_checkpoint_policy import Host, SessionExistsError, cli
from kai_session_checkpoint_policy.host import SessionMeta
from kai_session_checkpoint_policy.persistence import (
    JsonlSessionPersistence,
    SeedMismatchError,
    SessionHeader,
)

from ..support import SUPPORT

if TYPE_CHECKING:
    from kai_session_checkpoint_policy.persistence import PostgresSessionPersistence
from ..support.persistence_helpers import COMPLETE_TURN, events, text_of

pytestmark = pytest.mark.anyio

FIXTURE: Final = SUPPORT / "fixtures" / "original-logs" / "zstd-project-dir" / "root"
CWD: Final = "/home/dev/payments-app"
PROJECT: Final = "--home-dev-payments-app--"
CREATED: Final = 1_796_110_450_021
"""The creation time of the fixture's session."""
META: Final = SessionMeta(
    created_at=CREATED,
    cwd=CWD,
    parent_session="lead",
    seed_length=4,
    delegation_depth=2,
    origin="subagent",
    agent_preset="reviewer",
)
HEADER: Final = SessionHeader(
    "child",
    CREATED,
    cwd=CWD,
    delegation_depth=2,
    parent_session="lead",
    seed_length=4,
    origin="subagent",
    agent_preset="reviewer",
)


@dataclass
class Store:
    """A backend under test: a factory, and its name."""

    name: str
    make: Callable[[], JsonlSessionPersistence | PostgresSessionPersistence]
    root: Path | None = None


@pytest.fixture(params=["jsonl", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "jsonl":
        root = tmp_path / "root"
        yield Store("jsonl", lambda: JsonlSessionPersistence(root, compression="none"), root)
        return
    from kai_session_checkpoint_policy.persistence import PostgresSessionPersistence

    dsn: str = request.getfixturevalue("postgres_dsn")
    made: list[PostgresSessionPersistence] = []

    def make() -> PostgresSessionPersistence:
        backend = PostgresSessionPersistence(dsn)
        made.append(backend)
        return backend

    yield Store("postgres", make)
    for backend in made:
        backend.store.close()


def kinds(logged: Any) -> list[tuple[str, int]]:
    return [(event.type, event.seq) for event in logged]


async def test_metadata_comes_back_on_load_list_and_inspect(store: Store) -> None:
    async with Host([store.make()]) as host:
        session = host.sessions.create("child", meta=META)
        session.append("turn/start", {"turn": 1})
        await host.sessions.close(session)

    reader = store.make()
    try:
        assert (await reader.inspect("child")).header == HEADER
        listing = await reader.scan_sessions()
        assert listing.headers == (HEADER,)
        assert (await reader.load("child")).header == HEADER
    finally:
        await reader.aclose()
    if store.root is not None:  # in the project directory of its working directory
        assert listing.logs == (store.root / PROJECT / "child" / "session.jsonl",)
        header = json.loads(listing.logs[0].read_bytes().splitlines()[0])
        assert header == {
            "type": "session",
            "version": 0,
            "id": "child",
            "createdAt": CREATED,
            "cwd": CWD,
            "parentSession": "lead",
            "seedLength": 4,
            "origin": "subagent",
            "delegationDepth": 2,
            "agentPreset": "reviewer",
        }


async def test_a_session_without_metadata_is_created_at_the_hosts_time(store: Store) -> None:
    async with Host([store.make()], clock=lambda: 1_700_000_000_000) as host:
        session = host.sessions.create("plain")
        assert session.meta == SessionMeta(created_at=1_700_000_000_000)
        session.append("turn/start", {"turn": 1})
        await host.sessions.close(session)
    reader = store.make()
    try:
        assert (await reader.inspect("plain")).header == SessionHeader("plain", 1_700_000_000_000)
    finally:
        await reader.aclose()


async def test_a_fork_stores_its_seed_once_then_the_end_seed_marker(store: Store) -> None:
    async with Host([store.make()], clock=lambda: 1_700_000_000_000) as host:
        parent = host.sessions.create("lead", meta=SessionMeta(cwd=CWD))
        for event_type, data in COMPLETE_TURN:
            parent.append(event_type, data)
        await host.sessions.flush(parent)
        child = host.sessions.fork(parent, 5, "child")
        child.append("turn/start", {"turn": 2})
        await host.sessions.flush(child)
        await host.sessions.flush(child)  # nothing more: the seed is written once
        await host.sessions.close(child)
        await host.sessions.close(parent)

    reader = store.make()
    try:
        stored = await reader.inspect("child")
        parent_log = await reader.inspect("lead")
    finally:
        await reader.aclose()
    assert stored.header == SessionHeader(
        "child", 1_700_000_000_000, cwd=CWD, parent_session="lead", seed_length=6
    )
    assert kinds(stored.events) == [
        *kinds(parent_log.events),
        ("session/end-seed", 6),
        ("turn/start", 7),
    ]
    assert [event.encode() for event in stored.events[:6]] == [
        event.encode() for event in parent_log.events
    ]
    assert stored.events[6].encode() == (
        '{"type":"session/end-seed","seq":6,"time":1700000000000,"data":{}}'
    )

    async with Host([store.make()]) as host:  # resumed: its log goes on, never marked again
        resumed = await host.sessions.resume("child")
        resumed.append("turn/start", {"turn": 3})  # after the closer of the open turn 2
        await host.sessions.close(resumed)
    reader = store.make()
    try:
        again = await reader.inspect("child")
    finally:
        await reader.aclose()
    assert kinds(again.events) == [*kinds(stored.events), ("turn/end", 8), ("turn/start", 9)]


async def test_a_seed_of_a_stored_session_persists_only_what_follows_it(store: Store) -> None:
    logged = events(*COMPLETE_TURN)
    async with Host([store.make()]) as host:
        first = host.sessions.create("s", seed=[])  # a fork of nothing: its marker only
        await host.sessions.close(first)
    async with Host([store.make()]) as host:
        # The stored log (seq 0), and two events it does not have yet, as a seed.
        marker = (await host.session_persistence.inspect("s")).events[0]  # type: ignore[union-attr]
        seed = [marker, *(event.replace(seq=event.seq + 1) for event in logged[:2])]
        session = host.sessions.create("s", seed=seed)
        assert session.first_live_seq == 3  # no second marker: the id is stored
        session.append("step/end", {"turn": 1, "step": 1})
        await host.sessions.close(session)
    reader = store.make()
    try:
        stored = await reader.inspect("s")
    finally:
        await reader.aclose()
    assert kinds(stored.events) == [
        ("session/end-seed", 0),
        ("turn/start", 1),
        ("step/start", 2),
        ("step/end", 3),
    ]


async def test_a_seed_that_differs_from_the_stored_log_is_refused_at_its_first_seq(
    store: Store,
) -> None:
    logged = events(*COMPLETE_TURN)
    async with Host([store.make()]) as host:
        session = host.sessions.create("s")
        for item in logged[:3]:
            session.append(item.type, item.data)
        await host.sessions.close(session)
        stored = await host.session_persistence.inspect("s")  # type: ignore[union-attr]

    other = [*stored.events[:1], stored.events[1].replace(time=5), stored.events[2]]
    with pytest.raises(SeedMismatchError) as refused:  # noqa: PT012 (raised again at close)
        async with Host([store.make()]) as host:
            session = host.sessions.create("s", seed=other)
            session.append("step/end", {"turn": 1, "step": 1})
            with pytest.raises(SeedMismatchError) as flushed:
                await host.sessions.flush(session)
            assert flushed.value.seq == 1
            assert str(flushed.value) == (
                f"session 's': its seed differs from the log stored at {stored.location} at "
                "seq 1: the seed has 'step/start' where the log has 'step/start'; nothing was "
                "written"
            )
    assert refused.value.seq == 1

    shorter = stored.events[:2]
    with pytest.raises(SeedMismatchError) as refused:  # noqa: PT012 (raised again at close)
        async with Host([store.make()]) as host:
            session = host.sessions.create("s", seed=shorter)
            session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
            with pytest.raises(SeedMismatchError) as flushed:
                await host.sessions.flush(session)
            assert flushed.value.seq == 2
            assert str(flushed.value) == (
                f"session 's': its seed ends at seq 2, but the log stored at "
                f"{stored.location} goes on to seq 2 ('user/message' at seq 2); nothing was "
                "written"
            )
    reader = store.make()
    try:
        assert (await reader.inspect("s")).events == stored.events  # nothing written
    finally:
        await reader.aclose()


async def test_the_created_notification_heard_again_initializes_nothing_more(
    store: Store,
) -> None:
    async with Host([store.make()]) as host:
        parent = host.sessions.create("lead")
        parent.append("turn/start", {"turn": 1})
        child = host.sessions.fork(parent, session_id="child")
        host.hooks.session_attach(child)  # announced again
        host.hooks.session_attach(child)
        await host.sessions.flush(child)
        host.hooks.session_attach(child)
        child.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        await host.sessions.close(child)
        await host.sessions.close(parent)
    reader = store.make()
    try:
        stored = await reader.inspect("child")
    finally:
        await reader.aclose()
    assert kinds(stored.events) == [("turn/start", 0), ("session/end-seed", 1), ("turn/end", 2)]


async def test_a_session_created_through_the_backend_starts_at_cursor_zero(store: Store) -> None:
    backend = store.make()
    try:
        header = await backend.create("made", SessionMeta(created_at=5, cwd=CWD))
        assert header == SessionHeader("made", 5, cwd=CWD)
        assert backend.durable_count("made") == 0
        assert not backend.session_exists("made")  # nothing is written before its events
        assert (await backend.scan_sessions()).headers == ()
        with pytest.raises(SessionExistsError) as twice:
            await backend.create("made")
        assert str(twice.value) == f"session 'made' already exists in {backend.name}"
        await backend.write_log("made", events(*COMPLETE_TURN))
        assert (await backend.inspect("made")).header == header
        with pytest.raises(SessionExistsError) as stored:
            await backend.create("made")
        assert str(stored.value) == (
            f"session 'made' already has a log in {backend.name}: continue it with "
            "'await host.sessions.resume('made')'"
        )
    finally:
        await backend.aclose()


async def test_a_live_session_takes_the_header_its_backend_created(store: Store) -> None:
    backend = store.make()
    async with Host([backend]) as host:
        await backend.create("made", SessionMeta(created_at=7, delegation_depth=1))
        session = host.sessions.create("made")
        session.append("turn/start", {"turn": 1})
        await host.sessions.close(session)
    reader = store.make()
    try:
        assert (await reader.inspect("made")).header == SessionHeader("made", 7, delegation_depth=1)
    finally:
        await reader.aclose()


# -- the original's bytes -------------------------------------------------------------------


async def test_a_project_session_is_written_as_the_original_wrote_it(tmp_path: Path) -> None:
    original = JsonlSessionPersistence(FIXTURE)
    stored = await original.inspect("interop")
    root = tmp_path / "root"
    backend = JsonlSessionPersistence(root)  # the original's defaults: zstd, packed rows
    try:
        await backend.create("interop", SessionMeta(created_at=CREATED, cwd=CWD))
        await backend.write_log("interop", stored.events)
    finally:
        await backend.aclose()
    path = Path(PROJECT, "interop", "session.jsonl.zstd")
    assert (root / path).read_bytes() == (FIXTURE / path).read_bytes()


async def test_a_fork_of_the_originals_session_keeps_its_bytes(tmp_path: Path) -> None:
    """The fork's header line is the original's, with the fork's fields where the original
    puts them; the seed is the original's text, byte for byte; then the original's marker."""
    root = tmp_path / "root"
    shutil.copytree(FIXTURE, root)
    later = CREATED + 1000
    async with Host([JsonlSessionPersistence(root)], clock=lambda: later) as host:
        source = await host.sessions.resume("interop")
        fork = host.sessions.fork(source, session_id="fork")
        await host.sessions.close(fork)
        await host.sessions.close(source)

    theirs = text_of(FIXTURE / PROJECT / "interop" / "session.jsonl.zstd")
    ours = text_of(root / PROJECT / "fork" / "session.jsonl.zstd")
    their_header, their_body = theirs.split(b"\n", 1)
    our_header, our_body = ours.split(b"\n", 1)
    assert their_header == (
        b'{"type":"session","version":0,"id":"interop","createdAt":%d,'
        b'"cwd":"/home/dev/payments-app","delegationDepth":0}' % CREATED
    )
    seed = len((await JsonlSessionPersistence(FIXTURE).inspect("interop")).events)
    assert our_header == (
        b'{"type":"session","version":0,"id":"fork","createdAt":%d,'
        b'"cwd":"/home/dev/payments-app","parentSession":"interop","seedLength":%d,'
        b'"delegationDepth":0}' % (later, seed)
    )
    marker = b'{"type":"session/end-seed","seq":%d,"time":%d,"data":{}}\n' % (seed, later)
    assert our_body == their_body + marker


def test_the_command_line_lists_the_working_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"

    async def write() -> None:
        async with Host([JsonlSessionPersistence(root)], clock=lambda: 1_700_000_000_000) as host:
            for session_id, meta in (("a", SessionMeta(cwd=CWD)), ("b", None)):
                session = host.sessions.create(session_id, meta=meta)
                session.append("turn/start", {"turn": 1})
                await host.sessions.close(session)

    anyio.run(write)
    assert cli.main(["list", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in out] == ["a", "b"]
    assert out[0].endswith(f"\t{PROJECT}/a/session.jsonl.zstd\tcwd {CWD}")
    assert out[1].endswith("\t_no-cwd/b/session.jsonl.zstd")
    assert cli.main(["list", str(root), "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert records == [
        {"id": "a", "createdAt": 1_700_000_000_000, "version": 0, "cwd": CWD},
        {"id": "b", "createdAt": 1_700_000_000_000, "version": 0},
    ]


async def test_a_postgres_row_from_before_the_meta_column_has_a_plain_header(
    postgres_dsn: str,
) -> None:
    import psycopg

    from kai_session_checkpoint_policy.persistence import PostgresSessionPersistence

    backend = PostgresSessionPersistence(postgres_dsn)
    try:
        async with Host([backend]) as host:
            session = host.sessions.create("old", meta=SessionMeta(created_at=9, cwd=CWD))
            session.append("turn/start", {"turn": 1})
            await host.sessions.close(session)
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            stored = admin.execute("SELECT meta FROM kai_sessions.sessions").fetchall()
            assert stored == [('{"cwd":"/home/dev/payments-app","delegationDepth":0}',)]
            admin.execute("UPDATE kai_sessions.sessions SET meta = NULL")  # as schema 1 left it
    finally:
        backend.store.close()
    reader = PostgresSessionPersistence(postgres_dsn)
    try:
        assert (await reader.inspect("old")).header == SessionHeader("old", 9)
        assert (await reader.scan_sessions()).headers == (SessionHeader("old", 9),)
    finally:
        await reader.aclose()
        reader.store.close()


async def test_a_copy_keeps_the_header_metadata(tmp_path: Path, postgres_dsn: str) -> None:
    from kai_session_checkpoint_policy.persistence import (
        PostgresSessionPersistence,
        copy_session,
    )

    source = JsonlSessionPersistence(tmp_path / "a")
    async with Host([source]) as host:
        session = host.sessions.create("child", meta=META)
        session.append("turn/start", {"turn": 1})
        await host.sessions.close(session)
    database = PostgresSessionPersistence(postgres_dsn)
    back = JsonlSessionPersistence(tmp_path / "b")
    try:
        await copy_session(JsonlSessionPersistence(tmp_path / "a"), database, "child")
        assert (await database.inspect("child")).header == HEADER
        await copy_session(database, back, "child")
        assert (await back.inspect("child")).header == HEADER
    finally:
        await database.aclose()
        database.store.close()
    assert (tmp_path / "b" / PROJECT / "child" / "session.jsonl.zstd").is_file()
