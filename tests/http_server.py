"""The one HTTP server the tests' downstreams are built on: a real server on a free port of
127.0.0.1, serving from a daemon thread until stopped.

- `LocalServer(handler)`: a ThreadingHTTPServer with `url`, `start()` and `stop()`; every
  test downstream (tests/receiver.py, tests/hostile.py, tests/fake_github.py, ...)
  subclasses it, and the `http_server` fixture (tests/conftest.py) starts any of them for
  one test and stops it at the test's end.
- `QuietHandler`: the request handler they share (HTTP/1.1, no access log, `send`).
- `LocalServer(respond=...)`: a server whose every request is answered by a function of
  the request, for a test that needs one route and no class of its own.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# What `respond` returns: a status, (status, headers) or (status, headers, body).
Answer = int | tuple[int, dict[str, str]] | tuple[int, dict[str, str], bytes]


class QuietHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass  # the test's output is for the test

    def body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def send(self, status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.send_response(status)
        for name, value in {**(headers or {}), "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


class RespondingHandler(QuietHandler):
    """Answers every request with what the server's `respond(handler)` returns."""

    server: LocalServer

    def _answer(self):
        answer = self.server.respond(self)
        status, headers, body = (
            (*answer, b"")[:3] if isinstance(answer, tuple) else (answer, {}, b"")
        )
        self.send(status, headers, body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _answer


class LocalServer(ThreadingHTTPServer):
    daemon_threads = True
    # Stopping does not wait for requests still being answered (a receiver holding one
    # for seconds, a slow page): socketserver joins every handler thread on close otherwise.
    block_on_close = False
    # A client that hung up mid-answer is not the server's problem (bombs, byte caps,
    # timeouts): no traceback on stderr. Servers whose errors a test wants say False.
    quiet_errors = True

    def __init__(
        self,
        handler: type[BaseHTTPRequestHandler] = RespondingHandler,
        *,
        respond: Callable[[QuietHandler], Answer] | None = None,
        port: int = 0,
    ):
        super().__init__(("127.0.0.1", port), handler)
        if respond is not None:
            self.respond = respond

    def respond(self, request: QuietHandler) -> Answer:
        return 200

    def handle_error(self, request, client_address):
        if not self.quiet_errors:
            super().handle_error(request, client_address)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def url(self) -> str:
        return self.base_url

    def start(self):
        # Polled often: stop() (shutdown) waits up to one poll interval, 0.5 s by default.
        threading.Thread(
            target=self.serve_forever, args=(0.05,), name=type(self).__name__, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class Scripted(LocalServer):
    """Answers each request with the next (status, headers, JSON body) of its script, the
    last one again once the script is spent; counts the requests."""

    def __init__(self, script: list[tuple[int, dict, dict | None]]):
        super().__init__()
        self.script = list(script)
        self.requests = 0

    def respond(self, request):
        self.requests += 1
        status, headers, body = self.script[min(self.requests, len(self.script)) - 1]
        return status, headers, json.dumps(body or {}).encode()
