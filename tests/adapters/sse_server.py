"""An OpenAI-compatible chat completions endpoint of the tests' own, on 127.0.0.1.

It answers each ``POST /v1/chat/completions`` with the next reply of its script: a recorded
event stream from ``streams/`` (sent whole, or cut after some events and then ended early,
dropped, or stalled until the server closes), or an error status. It keeps every request it
received, body and headers, for the test to check.

The server runs in a thread of its own, so it serves asyncio and trio tests alike.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Callable

    from kai_session_checkpoint_policy import JSONObject

STREAMS = Path(__file__).resolve().parent / "streams"
PATH = "/v1/chat/completions"


def stream_events(name: str) -> list[str]:
    """The events of a recorded stream, each with the blank line that ends it."""
    text = (STREAMS / name).read_text()
    return [f"{event}\n\n" for event in text.split("\n\n") if event]


@dataclass(frozen=True)
class Replay:
    """Send the recorded stream *name*; with *cut_after*, only that many events, then *then*.

    ``"end"`` ends the response properly there (a stream that stops early); ``"drop"`` shuts
    the connection down in the middle of the body; ``"stall"`` sends nothing more until the
    server closes.
    """

    name: str
    cut_after: int | None = None
    then: Literal["end", "drop", "stall"] = "end"


@dataclass(frozen=True)
class Refuse:
    """Answer with the error *status* and a JSON *body*."""

    status: int
    body: JSONObject
    headers: tuple[tuple[str, str], ...] = ()


Reply: TypeAlias = "Replay | Refuse"


@dataclass(frozen=True)
class Received:
    """A request the server received."""

    path: str
    headers: dict[str, str]
    """By lower-case name."""
    body: JSONObject


@dataclass
class ModelServer:
    """The endpoint; use as a context manager, and script its replies with :meth:`reply`."""

    received: list[Received] = field(default_factory=list)
    on_request: Callable[[Received], None] | None = None
    """Called in the server's thread with each request, before it is answered."""
    _script: list[Reply] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _released: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL of the endpoint (``http://127.0.0.1:<port>/v1``)."""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def reply(self, *replies: Reply) -> None:
        with self._lock:
            self._script += replies

    def _next(self) -> Reply | None:
        with self._lock:
            return self._script.pop(0) if self._script else None

    def __enter__(self) -> ModelServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass  # keep the test output clean

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                headers = {name.lower(): value for name, value in self.headers.items()}
                received = Received(self.path, headers, body)
                server.received.append(received)
                if server.on_request is not None:
                    server.on_request(received)
                reply = server._next() if self.path == PATH else None
                if reply is None:
                    what = "no reply scripted" if self.path == PATH else f"no route {self.path}"
                    self._refuse(Refuse(500, {"error": {"message": f"test server: {what}"}}))
                elif isinstance(reply, Refuse):
                    self._refuse(reply)
                else:
                    self._replay(reply)

            def _refuse(self, reply: Refuse) -> None:
                data = json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in reply.headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _replay(self, reply: Replay) -> None:
                events = stream_events(reply.name)
                if reply.cut_after is not None:
                    events = events[: reply.cut_after]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in events:
                    data = event.encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                if reply.cut_after is None or reply.then == "end":
                    self.wfile.write(b"0\r\n\r\n")
                elif reply.then == "drop":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                else:
                    server._released.wait()
                    self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._released.set()  # a stalled reply returns
        assert self._server is not None
        assert self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
