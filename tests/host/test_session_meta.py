"""The reference host's sessions: their creation metadata, forks, and seeds."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest

from kai_session_checkpoint_policy import Host, SessionEvent
from kai_session_checkpoint_policy.host import Session, SessionError, SessionMeta, SessionMetaError
from kai_session_checkpoint_policy.persistence import JsonlSessionPersistence, SessionHeader

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.anyio

NOW: Final = 1_700_000_000_000
CWD: Final = "/srv/app"


@pytest.fixture
async def host() -> AsyncIterator[Host]:
    async with Host([], clock=lambda: NOW) as opened:
        yield opened


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"created_at": -1},
            "session metadata created_at must be an integer of Unix epoch milliseconds from 0 "
            "to 253402300799999, not -1",
        ),
        (
            {"created_at": 1.5},
            "session metadata created_at must be an integer of Unix epoch milliseconds from 0 "
            "to 253402300799999, not 1.5",
        ),
        (
            {"cwd": "relative/dir"},
            "session metadata cwd must be an absolute path, not 'relative/dir'",
        ),
        ({"cwd": ""}, "session metadata cwd must be an absolute path, not ''"),
        (
            {"parent_session": ""},
            "session metadata parent_session must be a non-empty string, not ''",
        ),
        (
            {"seed_length": -2},
            "session metadata seed_length must be a non-negative integer, not -2",
        ),
        (
            {"delegation_depth": True},
            "session metadata delegation_depth must be a non-negative integer, not True",
        ),
        ({"origin": "fork"}, "session metadata origin must be 'subagent' or None, not 'fork'"),
        ({"agent_preset": 3}, "session metadata agent_preset must be a string, not 3"),
    ],
)
def test_metadata_no_log_can_hold_is_refused_naming_the_field(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(SessionMetaError) as refused:
        SessionMeta(**fields)
    assert str(refused.value) == message
    assert isinstance(refused.value, ValueError)


async def test_a_session_is_created_with_its_metadata(host: Host) -> None:
    meta = SessionMeta(cwd=CWD, parent_session="lead", delegation_depth=1, origin="subagent")

    session = host.sessions.create("child", meta=meta)

    assert session.meta == SessionMeta(
        created_at=NOW, cwd=CWD, parent_session="lead", delegation_depth=1, origin="subagent"
    )
    assert host.sessions.create("given", meta=SessionMeta(created_at=5)).meta.created_at == 5
    assert host.sessions.create("plain").meta == SessionMeta(created_at=NOW)
    with pytest.raises(SessionError, match=r"^meta must be a SessionMeta, not \{'cwd': '/'\}$"):
        host.sessions.create("bad", meta={"cwd": "/"})  # type: ignore[arg-type]
    assert host.sessions.get("bad") is None


async def test_a_fork_starts_with_the_seed_and_its_marker(host: Host) -> None:
    parent = host.sessions.create("lead", meta=SessionMeta(cwd=CWD))
    parent.append("turn/start", {"turn": 1})
    parent.append("step/start", {"turn": 1, "step": 1})
    parent.append("step/end", {"turn": 1, "step": 1})

    child = host.sessions.fork(parent, 1, "child")

    assert [(event.type, event.seq) for event in child.events] == [
        ("turn/start", 0),
        ("step/start", 1),
        ("session/end-seed", 2),
    ]
    assert child.events[2].data == {}
    assert child.first_live_seq == 3
    assert child.meta == SessionMeta(created_at=NOW, cwd=CWD, parent_session="lead", seed_length=2)
    whole = host.sessions.fork(parent)  # every event, under a new id
    assert whole.id != parent.id
    assert (whole.meta.seed_length, whole.first_live_seq) == (3, 4)
    again = host.sessions.fork(child, session_id="grandchild")  # ends with a marker already
    assert [event.type for event in again.events][-2:] == ["step/start", "session/end-seed"]
    assert again.first_live_seq == 3


@pytest.mark.parametrize("through", [-1, 3, "1"])
async def test_a_fork_through_a_seq_the_source_lacks_is_refused(host: Host, through: Any) -> None:
    parent = host.sessions.create("lead")
    for turn in (1, 2, 3):
        parent.append("turn/start", {"turn": turn})

    with pytest.raises(SessionError) as refused:
        host.sessions.fork(parent, through, "child")

    assert str(refused.value) == (
        f"cannot fork session 'lead' through seq {through!r}: it holds seqs 0 to 2"
    )
    assert host.sessions.get("child") is None


def test_a_detached_session_marks_a_seed_only_when_asked() -> None:
    seed = [SessionEvent("turn/start", 0, 1, {"turn": 1})]

    assert len(Session("replay", seed, clock=lambda: NOW).events) == 1
    marked = Session("fork", seed, clock=lambda: NOW, mark_seed=True)
    assert [event.type for event in marked.events] == ["turn/start", "session/end-seed"]
    assert marked.events[1].time == NOW


async def test_a_resumed_session_has_its_stored_metadata(tmp_path: Path) -> None:
    meta = SessionMeta(created_at=42, cwd=CWD, delegation_depth=3, agent_preset="ops")
    async with Host([JsonlSessionPersistence(tmp_path)], clock=lambda: NOW) as host:
        session = host.sessions.create("kept", meta=meta)
        session.append("turn/start", {"turn": 1})
        await host.sessions.close(session)
    async with Host([JsonlSessionPersistence(tmp_path)], clock=lambda: NOW) as host:
        resumed = await host.sessions.resume("kept")
        assert resumed.meta == meta
        assert resumed.seed_stored
        # A stored log is not a fork's seed: no marker, and it is not checked again.
        assert [event.type for event in resumed.events] == ["turn/start", "turn/end"]
        assert resumed.first_live_seq == 2
        await host.sessions.close(resumed)
    listed = await JsonlSessionPersistence(tmp_path).list_sessions()
    assert listed == [SessionHeader("kept", 42, cwd=CWD, delegation_depth=3, agent_preset="ops")]
