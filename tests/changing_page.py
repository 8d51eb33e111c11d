"""A page on 127.0.0.1 that a test changes between audits: title, status, robots, headers, links."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@dataclass
class PageState:
    status: int = 200
    title: str = "Home"
    noindex: bool = False
    headers: dict[str, str] = field(default_factory=lambda: dict(SECURITY_HEADERS))
    links: list[str] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ChangingPage

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        state = self.server.state
        robots = "<meta name='robots' content='noindex'>" if state.noindex else ""
        links = "".join(f"<a href='{url}'>{url}</a>" for url in state.links)
        body = (
            f"<!doctype html><html><head><title>{state.title}</title>{robots}</head>"
            f"<body><h1>{state.title}</h1>{links}</body></html>"
        ).encode()
        self.send_response(state.status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for name, value in state.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


class ChangingPage(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = PageState()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"

    def start(self) -> ChangingPage:
        threading.Thread(target=self.serve_forever, name="changing-page", daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
