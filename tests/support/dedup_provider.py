"""A provider that deduplicates on the ``Idempotency-Key`` header, served on the loopback address.

Each POST is one request for an effect. The first request with a key applies the effect (it is
recorded in ``effects``) and answers 201; a later request with the same key applies nothing and
answers 200 with the first answer, as payment providers do. A request without a key always
applies its effect.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["DedupProvider", "dedup_provider"]


@dataclass
class DedupProvider:
    """What the provider saw: every request ``(key, body)``, and every effect it applied."""

    url: str = ""
    requests: list[tuple[str | None, object]] = field(default_factory=list)
    effects: list[tuple[str | None, object]] = field(default_factory=list)
    answers: dict[str, bytes] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


@contextmanager
def dedup_provider() -> Iterator[DedupProvider]:
    """Serve a :class:`DedupProvider` on 127.0.0.1 while the block runs."""
    provider = DedupProvider()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"null")
            key = self.headers.get("Idempotency-Key")
            with provider.lock:
                provider.requests.append((key, body))
                answer = provider.answers.get(key) if key is not None else None
                status = 200
                if answer is None:
                    status = 201
                    provider.effects.append((key, body))
                    answer = json.dumps({"effect": len(provider.effects)}).encode()
                    if key is not None:
                        provider.answers[key] = answer
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            """Keep the test output quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    provider.url = f"http://127.0.0.1:{server.server_address[1]}/orders"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield provider
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
