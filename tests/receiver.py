"""A webhook receiver on 127.0.0.1 that records what arrives: for the tests and the benchmark.

`Receiver(respond=...)` answers every POST with what `respond(seconds since
start, request number)` returns: a status code, (status, headers), or (status, headers,
body), and holds
each request `hold_seconds` first. It counts requests in flight and their peak,
and keeps every request (time, headers, body).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.http_server import LocalServer, QuietHandler


@dataclass
class ReceivedRequest:
    at: float  # seconds since the receiver started
    headers: dict[str, str]
    body: bytes
    status: int = 0
    webhook_id: str = field(init=False)

    def __post_init__(self):
        self.webhook_id = self.headers.get("webhook-id", "")


Response = int | tuple[int, dict[str, str]] | tuple[int, dict[str, str], bytes]


class _Handler(QuietHandler):
    server: Receiver

    def do_POST(self):
        server = self.server
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        request = ReceivedRequest(
            at=time.monotonic() - server.started,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
        )
        with server.lock:
            server.in_flight += 1
            server.peak_in_flight = max(server.peak_in_flight, server.in_flight)
            number = len(server.requests)
            server.requests.append(request)
        try:
            if server.hold_seconds:
                time.sleep(server.hold_seconds)
            answer = server.respond(request.at, number)
            status, headers, body = (
                (*answer, b"")[:3] if isinstance(answer, tuple) else (answer, {}, b"")
            )
            request.status = status
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        finally:
            with server.lock:
                server.in_flight -= 1


class Receiver(LocalServer):
    # A burst with no concurrency cap opens hundreds of connections at once.
    request_queue_size = 2048

    def __init__(
        self,
        respond: Callable[[float, int], Response] = lambda at, number: 200,
        *,
        hold_seconds: float = 0.0,
        port: int = 0,
    ):
        super().__init__(_Handler, port=port)
        self.respond = respond
        self.hold_seconds = hold_seconds
        self.lock = threading.Lock()
        self.requests: list[ReceivedRequest] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self.started = time.monotonic()

    @property
    def url(self) -> str:
        return f"{self.base_url}/hook"

    def start(self) -> Receiver:
        self.started = time.monotonic()
        return super().start()

    def count(self, status: int | None = None) -> int:
        with self.lock:
            return sum(1 for r in self.requests if status is None or r.status == status)
