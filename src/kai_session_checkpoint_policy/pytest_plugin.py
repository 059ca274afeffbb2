"""pytest fixtures for host authors: a reference host with the checkpoint policy, and doubles.

The package installs this module as the ``kai`` pytest plugin (a ``pytest11`` entry point), so
the fixtures are there in every test session of an environment that has the package. Every
fixture name starts with ``kai_``, none is autouse, and the fixtures import the package only
when a test asks for them.

The async fixtures run on anyio's own pytest plugin: mark the test ``@pytest.mark.anyio`` (or
let it request ``anyio_backend``); they work on asyncio and trio alike.

``kai_order``
    A list that the flush recorder and the recording adapter both append to, so a test can
    assert the exact interleaving: ``["flush:start", "flush:end", "adapter"]``.
``kai_flush_recorder``
    A :class:`FlushRecorder`: the host's stand-in persistence backend, recording flushes.
``kai_recording_adapter``
    A :class:`RecordingAdapter` for provider ``"mock"``, recording requests.
``kai_host``
    An open reference host, entry-point autoloading off, with the flush recorder, the
    checkpoint policy and the recording adapter registered.
``kai_session``
    A live session ``"kai-session"`` of ``kai_host``.
"""

from __future__ import annotations

from collections import deque
from functools import partial
from typing import TYPE_CHECKING, Final

import anyio
import pytest

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator

    from .contract import LlmRequest, PluginHost, StreamChunk
    from .hookspecs import FlushThunk
    from .host import Host, Session
    from .persistence import StoredLog

__all__ = ["FlushRecorder", "Gate", "RecordingAdapter"]

MOCK_PROVIDER: Final = "mock"
"""The provider name the recording adapter is registered under in ``kai_host``."""


class Gate:
    """Holds whoever waits on it until :meth:`release` is called; stays open afterwards."""

    __slots__ = ("_event", "_released")

    def __init__(self) -> None:
        self._released = False
        self._event: anyio.Event | None = None

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Let every current and future waiter through."""
        self._released = True
        if self._event is not None:
            self._event.set()

    async def wait(self) -> None:
        """Wait until the gate is released."""
        if self._released:
            return
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()


class FlushRecorder:
    """A stand-in persistence backend that records flushes instead of writing anything.

    Register :attr:`plugin` on a host: while the host is open the recorder is its
    ``session_persistence`` (unless it already has one), which activates the checkpoint
    policy, and every ``session_flush`` of a live session is answered by :meth:`flush`.

    A flush appends the session id to :attr:`flushes` and ``"flush:start"`` to :attr:`order`,
    waits for the gate of :meth:`hold` if there is one, then raises the exception given to
    :meth:`fail_with` (appending ``"flush:failed"``) or appends ``"flush:end"``. It stores
    nothing, so its ``load`` and ``inspect`` raise :exc:`NotImplementedError`.
    """

    name: Final = "kai-flush-recorder"

    def __init__(self, order: list[str] | None = None) -> None:
        self.flushes: list[str] = []
        """The ids of the flushed sessions, in the order the flushes started."""
        self.order: list[str] = [] if order is None else order
        self._gate: Gate | None = None
        self._failure: Exception | None = None
        self.plugin: Final = _recorder_plugin(self)
        """The pluggy plugin to register on a host."""

    def __repr__(self) -> str:
        return f"<FlushRecorder of {len(self.flushes)} flushes>"

    def hold(self) -> Gate:
        """Make every later flush wait, after it started, until the returned gate is released."""
        gate = self._gate = Gate()
        return gate

    def fail_with(self, exc: Exception | None) -> None:
        """Make every later flush raise *exc* (the same object each time); ``None`` stops it."""
        self._failure = exc

    async def flush(self, session: Session) -> None:
        """Record one flush of *session*."""
        self.flushes.append(session.id)
        self.order.append("flush:start")
        if self._gate is not None:
            await self._gate.wait()
        if self._failure is not None:
            self.order.append("flush:failed")
            raise self._failure
        self.order.append("flush:end")

    def session_exists(self, session_id: str) -> bool:
        """Always ``False``: the recorder stores nothing."""
        return False

    async def load(self, session_id: str) -> StoredLog:
        raise NotImplementedError("the flush recorder stores no sessions")

    async def inspect(self, session_id: str) -> StoredLog:
        raise NotImplementedError("the flush recorder stores no sessions")


def _recorder_plugin(recorder: FlushRecorder) -> object:
    from kai_session_checkpoint_policy import hookimpl

    class FlushRecorderPlugin:
        name = recorder.name

        @hookimpl(trylast=True)  # a real backend configured at the same time comes first
        def host_configure(self, host: PluginHost[Session]) -> None:
            if host.session_persistence is None:
                host.provide_session_persistence(recorder)

        @hookimpl
        def host_unconfigure(self, host: PluginHost[Session]) -> None:
            host.withdraw_session_persistence(recorder)

        @hookimpl
        def session_flush(self, session: Session) -> FlushThunk:
            return partial(recorder.flush, session)

    return FlushRecorderPlugin()


class RecordingAdapter:
    """A model adapter that records every request and answers with scripted chunks.

    Register it with ``host.llm.register_adapter("mock", adapter)``. When a response stream
    starts, the adapter appends the request to :attr:`requests` and ``"adapter"`` to
    :attr:`order`, then yields the chunks of the next script given to :meth:`script`; with no
    script left it answers ``Finish("stop")``.
    """

    def __init__(self, order: list[str] | None = None) -> None:
        self.requests: list[LlmRequest] = []
        self.order: list[str] = [] if order is None else order
        self._scripts: deque[tuple[StreamChunk, ...]] = deque()

    def script(self, *chunks: StreamChunk) -> None:
        """Queue one response: the chunks the next request is answered with."""
        self._scripts.append(chunks)

    async def __call__(self, request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        from kai_session_checkpoint_policy.contract import Finish

        self.requests.append(request)
        self.order.append("adapter")
        chunks = self._scripts.popleft() if self._scripts else (Finish("stop"),)
        for chunk in chunks:
            yield chunk


@pytest.fixture
def kai_order() -> list[str]:
    """The order list shared by ``kai_flush_recorder`` and ``kai_recording_adapter``."""
    return []


@pytest.fixture
def kai_flush_recorder(kai_order: list[str]) -> FlushRecorder:
    """A :class:`FlushRecorder` appending to ``kai_order``."""
    return FlushRecorder(kai_order)


@pytest.fixture
def kai_recording_adapter(kai_order: list[str]) -> RecordingAdapter:
    """A :class:`RecordingAdapter` appending to ``kai_order``."""
    return RecordingAdapter(kai_order)


@pytest.fixture
async def kai_host(
    anyio_backend: object,
    kai_flush_recorder: FlushRecorder,
    kai_recording_adapter: RecordingAdapter,
) -> AsyncIterator[Host]:
    """An open host with the flush recorder, the checkpoint policy and the recording adapter."""
    from kai_session_checkpoint_policy import Host, policy

    host = Host([kai_flush_recorder.plugin, policy], autoload=False)
    host.llm.register_adapter(MOCK_PROVIDER, kai_recording_adapter)
    async with host:
        yield host


@pytest.fixture
def kai_session(kai_host: Host) -> Session:
    """A live session ``"kai-session"`` of ``kai_host``."""
    return kai_host.sessions.create("kai-session")
