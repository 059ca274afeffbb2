"""A host whose persistence layer is its own: the contract asks nothing of it but to be there.

``mypy --strict`` checks this module: ``OwnHost`` offers, as ``host.session_persistence``, a
``Ledger`` that has no ``name``, ``session_exists`` or ``load``, and still is a
``HostServices``, because no plugin reads those members. The reference host, which does read
them to resume sessions, refuses a backend without them.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import anyio
import pluggy
import pytest

from kai_session_checkpoint_policy import Host, eventdata, hookspecs, policy
from kai_session_checkpoint_policy.cancellation import checkpoint_if_cancelled
from kai_session_checkpoint_policy.contract import Finish, HostServices, LlmRequest, PluginHost
from kai_session_checkpoint_policy.events import SessionEvent, encode_data
from kai_session_checkpoint_policy.hookspecs import PROJECT, hookimpl

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator
    from pathlib import Path

    from kai_session_checkpoint_policy.contract import StreamChunk
    from kai_session_checkpoint_policy.hookspecs import FlushThunk, StreamThunk

pytestmark = pytest.mark.anyio


class Ledger:
    """The host's own persistence: one JSON line per event, written and fsynced on a flush."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending: list[SessionEvent] = []

    @hookimpl
    def session_event(self, event: SessionEvent) -> None:
        self._pending.append(event)

    @hookimpl
    def session_flush(self) -> FlushThunk | None:
        return self._write if self._pending else None

    async def _write(self) -> None:
        batch, self._pending = self._pending, []
        await anyio.to_thread.run_sync(self._append, batch)

    def _append(self, batch: list[SessionEvent]) -> None:
        with self.path.open("a", encoding="utf-8") as file:
            file.writelines(json.dumps(event.to_json()) + "\n" for event in batch)
            file.flush()
            os.fsync(file.fileno())

    def durable(self) -> list[str]:
        """The types of the events on disk."""
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line)["type"] for line in lines]


class Log:
    """A session of the host."""

    def __init__(self, session_id: str, manager: pluggy.PluginManager, host: OwnHost) -> None:
        self.id = session_id
        self._manager, self._host = manager, host
        self.events: list[SessionEvent] = []

    def append(self, event_type: str, data: object) -> None:
        copy, encoded = encode_data(event_type, data)
        event = SessionEvent(event_type, len(self.events), 0, copy, encoded)
        self.events.append(event)
        self._manager.hook.session_event(session=self, event=event, host=self._host)


class Sessions:
    def __init__(self, manager: pluggy.PluginManager, host: OwnHost) -> None:
        self._manager, self._host = manager, host
        self._live: dict[str, Log] = {}

    def create(self, session_id: str) -> Log:
        log = self._live[session_id] = Log(session_id, self._manager, self._host)
        return log

    def get(self, session_id: str) -> Log | None:
        return self._live.get(session_id)

    async def flush(self, session: Log) -> bool:
        if self._live.get(session.id) is not session:
            raise LookupError(f"session {session.id!r} is not live")
        thunks: list[FlushThunk | None] = self._manager.hook.session_flush(
            session=session, host=self._host
        )
        started = [thunk for thunk in thunks if thunk is not None]
        for thunk in started:  # one plugin flushes here: no need to run them concurrently
            await thunk()
        await checkpoint_if_cancelled()
        return bool(started)


class Model:
    """The innermost ``llm_stream``: records what is on disk when its stream is pulled."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.saw: list[list[str]] = []

    @hookimpl
    def llm_stream(self) -> StreamThunk:
        async def stream() -> AsyncGenerator[StreamChunk, None]:
            self.saw.append(self.ledger.durable())
            yield Finish("stop")

        return stream


class OwnHost:
    """A host with the policy and a persistence layer of its own."""

    def __init__(self, root: Path) -> None:
        self.manager = pluggy.PluginManager(PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self.ledger = Ledger(root / "ledger.jsonl")
        self.model = Model(self.ledger)
        self.sessions = Sessions(self.manager, self)
        self.llm, self.tools, self.invariants = "model", "tools", None
        for plugin in (self.ledger, policy, self.model):
            self.manager.register(plugin)

    @property
    def session_persistence(self) -> Ledger | None:
        return self.ledger


_checked: type[HostServices[Log]] = OwnHost  # mypy: the host is what every hook receives


async def test_the_policy_makes_the_request_durable_in_the_hosts_own_persistence(
    tmp_path: Path,
) -> None:
    host = OwnHost(tmp_path)
    session = host.sessions.create("own")
    session.append("turn/start", eventdata.turn_start(1))
    session.append("request/context", eventdata.request_context("own", "model"))
    stream: StreamThunk = host.manager.hook.llm_stream(
        request=LlmRequest("own", "model", session_id="own"), host=host
    )
    chunks = [chunk async for chunk in stream()]
    assert chunks == [Finish("stop")]
    assert host.model.saw == [["turn/start", "request/context"]]


class Bare:
    """A backend with nothing but its hooks: enough for every plugin, not for the host."""

    @hookimpl
    def host_configure(self, host: PluginHost[Any]) -> None:
        host.provide_session_persistence(self)


async def test_the_reference_host_refuses_a_backend_it_cannot_resume_with() -> None:
    backend = Bare()
    with pytest.raises(TypeError) as caught:
        async with Host([backend], autoload=False):
            pass
    assert str(caught.value) == (
        f"{backend!r} cannot be the session persistence of this host: it has no name and no "
        "session_exists and no load (the host tells new sessions from stored ones and "
        "resumes them with these)"
    )
