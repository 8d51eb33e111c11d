"""A page on 127.0.0.1 that a test changes between audits: title, status, robots, headers, links."""

from __future__ import annotations

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


class _Handler(QuietHandler):
    server: ChangingPage

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


class ChangingPage(LocalServer):
    def __init__(self):
        super().__init__(_Handler)
        self.state = PageState()

    @property
    def url(self) -> str:
        return f"{self.base_url}/"
