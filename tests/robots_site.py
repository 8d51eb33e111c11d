"""A host on 127.0.0.1 with a robots.txt a test sets: its status, body, delay or redirect.

`/robots.txt` answers `robots` (a RobotsAnswer), counted in `robots_requests`; a path in
`redirects` answers 301 to its target; every other path is a link target answering 200.
Every arrival but robots.txt's is kept per path in `hits` (with times in `arrivals`), so a
test sees what was requested and what was not.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


@dataclass
class RobotsAnswer:
    status: int = 200
    body: bytes = b""
    delay: float = 0.0  # seconds before the answer
    location: str = ""  # a redirect's target


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RobotsSite

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        path = urlsplit(self.path).path
        if path == "/robots.txt":
            with self.server.lock:
                self.server.robots_requests += 1
            answer = self.server.robots
            time.sleep(answer.delay)
            self.send_response(answer.status)
            if answer.location:
                self.send_header("Location", answer.location)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)
            return
        with self.server.lock:
            self.server.hits[path] += 1
            self.server.arrivals.append(time.monotonic())
        location = self.server.redirects.get(path)
        if location is not None:
            self.send_response(301)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"<!doctype html><title>Target</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class RobotsSite(ThreadingHTTPServer):
    daemon_threads = True
    # Stopping does not wait for requests still being answered (a receiver holding one
    # for seconds, a slow page): socketserver joins every handler thread on close otherwise.
    block_on_close = False

    def __init__(self, robots: RobotsAnswer | None = None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.robots = robots or RobotsAnswer()
        self.lock = threading.Lock()
        self.robots_requests = 0
        self.hits: Counter[str] = Counter()
        self.arrivals: list[float] = []
        self.redirects: dict[str, str] = {}  # path -> the Location of its 301

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> RobotsSite:
        # Polled often: stop() (shutdown) waits up to one poll interval, 0.5 s by default.
        threading.Thread(
            target=self.serve_forever, args=(0.05,), name="robots-site", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
