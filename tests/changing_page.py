"""A page on 127.0.0.1 that a test changes between audits: title, status, robots, headers, links.

With `etag` or `last_modified` set it sends them and answers a request whose
If-None-Match (or, without one, If-Modified-Since) still matches with `304 Not
Modified` and no body, sending the validators and `not_modified_headers` only.
Every request's headers are kept in `requests`."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from tests.http_server import LocalServer, QuietHandler

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
    etag: str = ""
    last_modified: str = ""
    # What a 304 sends besides the validators (a 304 need not repeat the page's headers).
    not_modified_headers: dict[str, str] = field(default_factory=dict)


class _Handler(QuietHandler):
    server: ChangingPage

    def do_GET(self):
        state = self.server.state
        with self.server.lock:
            self.server.requests.append(dict(self.headers.items()))
        validators = {}
        if state.etag:
            validators["ETag"] = state.etag
        if state.last_modified:
            validators["Last-Modified"] = state.last_modified
        if self._not_modified(state):
            self.send_response(304)
            for name, value in {**validators, **state.not_modified_headers}.items():
                self.send_header(name, value)
            self.end_headers()
            return
        robots = "<meta name='robots' content='noindex'>" if state.noindex else ""
        links = "".join(f"<a href='{url}'>{url}</a>" for url in state.links)
        body = (
            f"<!doctype html><html><head><title>{state.title}</title>{robots}</head>"
            f"<body><h1>{state.title}</h1>{links}</body></html>"
        ).encode()
        self.send_response(state.status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for name, value in {**state.headers, **validators}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _not_modified(self, state: PageState) -> bool:
        """RFC 9110 13.2.2: If-None-Match when sent, else If-Modified-Since (exact match)."""
        if_none_match = self.headers.get("If-None-Match")
        if if_none_match is not None:
            return bool(state.etag) and state.etag in [
                tag.strip() for tag in if_none_match.split(",")
            ]
        since = self.headers.get("If-Modified-Since")
        return since is not None and bool(state.last_modified) and since == state.last_modified


class ChangingPage(LocalServer):
    def __init__(self):
        super().__init__(_Handler)
        self.state = PageState()
        self.lock = threading.Lock()
        self.requests: list[dict[str, str]] = []

    @property
    def url(self) -> str:
        return f"{self.base_url}/"
