"""A small site with the faults an audit should report, served on 127.0.0.1.

`make demo` registers its pages; the tests serve it to audit real HTTP. Paths:

    /                       a tidy page with every security header
    /redirect               301 -> /moved (302) -> /
    /broken-link            links to a page that answers 404
    /slow?delay=2           answers after `delay` seconds (`&status=500`: fails then)
    /no-security-headers    an HTML page without CSP, nosniff or Referrer-Policy
    /report.pdf             not HTML
    /noindex                robots noindex
    /missing                404
    /huge?mb=8              an HTML page of `mb` megabytes
    /flaky?key=k&fail=2     500 for the first `fail` requests per key, then 200
                            (after `delay` seconds, if given)
    /busy?key=k&fail=1&retry_after=5&status=503
                            503 (or `status`, say 429) with that Retry-After for the first
                            `fail` requests per key
    /loop                   redirects to itself
    /trickle                a body that never ends, a byte every half second
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

SECURE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

DEMO_PATHS = [
    "/",
    "/redirect",
    "/broken-link",
    "/slow",
    "/no-security-headers",
    "/report.pdf",
    "/noindex",
]


def _page(title: str, body: str, *, head: str = "") -> bytes:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        f"<meta name='description' content='{title} on the Plumb demo site'>{head}</head>"
        f"<body><h1>{title}</h1>{body}</body></html>"
    ).encode()


class DemoSiteHandler(BaseHTTPRequestHandler):
    server_version = "PlumbDemo/1.0"
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # keep test and demo output quiet
        pass

    def do_GET(self):
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.server.hits[url.path] += 1
        route = ROUTES.get(url.path)
        if route is None:
            self._send(404, _page("Not found", "<p>Nothing here.</p>"), headers=SECURE_HEADERS)
            return
        route(self, query)

    def _send(
        self, status: int, body: bytes, *, content_type="text/html; charset=utf-8", headers=None
    ):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, status: int, location: str):
        self.send_response(status)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    # --- routes --------------------------------------------------------------
    def index(self, query):
        links = "".join(f"<li><a href='{p}'>{p}</a></li>" for p in DEMO_PATHS[1:])
        # An external link that stays on this machine: the same site under another host name.
        port = self.server.server_address[1]
        body = (
            f"<ul>{links}</ul>"
            f"<p><a href='http://localhost:{port}/'>an external link (this site as localhost)</a></p>"
        )
        self._send(
            200,
            _page("Plumb demo", body, head="<link rel='canonical' href='/'>"),
            headers=SECURE_HEADERS,
        )

    def redirect(self, query):
        self._redirect(301, "/moved")

    def moved(self, query):
        self._redirect(302, "/")

    def broken_link(self, query):
        body = "<p><a href='/missing'>a page that is gone</a> and <a href='/'>home</a></p>"
        self._send(200, _page("Broken link", body), headers=SECURE_HEADERS)

    def slow(self, query):
        time.sleep(float(query.get("delay", "2")))
        # `status`: a slow failure (a 500 after the delay), for a failure met mid-outage.
        status = int(query.get("status", "200"))
        self._send(status, _page("Slow page", "<p>Took a while.</p>"), headers=SECURE_HEADERS)

    def no_security_headers(self, query):
        self._send(200, _page("No security headers", "<p>Nothing protects this page.</p>"))

    def report_pdf(self, query):
        self._send(
            200,
            b"%PDF-1.4\n% not really a PDF\n",
            content_type="application/pdf",
            headers=SECURE_HEADERS,
        )

    def noindex(self, query):
        head = "<meta name='robots' content='noindex, nofollow'>"
        self._send(
            200, _page("Hidden page", "<p>Do not index.</p>", head=head), headers=SECURE_HEADERS
        )

    def missing(self, query):
        self._send(404, _page("Not found", "<p>Gone.</p>"), headers=SECURE_HEADERS)

    def huge(self, query):
        size = int(float(query.get("mb", "8")) * 1024 * 1024)
        head = b"<!doctype html><html><head><title>Huge</title></head><body><h1>Huge</h1>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        self.wfile.write(head)
        chunk = b"<p>" + b"x" * 8185 + b"</p>"
        sent = len(head)
        try:
            while sent < size:
                part = chunk[: size - sent]
                self.wfile.write(part)
                sent += len(part)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def flaky(self, query):
        key = query.get("key", "default")
        with self.server.lock:
            self.server.flaky_counts[key] += 1
            count = self.server.flaky_counts[key]
        if count <= int(query.get("fail", "2")):
            self._send(500, b"temporarily broken", content_type="text/plain")
        else:
            time.sleep(float(query.get("delay", "0")))
            self._send(
                200,
                _page("Recovered", f"<p>Answered after {count - 1} failures.</p>"),
                headers=SECURE_HEADERS,
            )

    def busy(self, query):
        key = query.get("key", "default")
        with self.server.lock:
            self.server.flaky_counts[key] += 1
            self.server.request_times[key].append(time.time())
            count = self.server.flaky_counts[key]
        if count <= int(query.get("fail", "1")):
            self._send(
                int(query.get("status", "503")),
                b"busy, come back later",
                content_type="text/plain",
                headers={"Retry-After": query.get("retry_after", "5")},
            )
        else:
            self._send(200, _page("Not busy now", "<p>Thanks for waiting.</p>"))

    def loop(self, query):
        self._redirect(302, "/loop")

    def trickle(self, query):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        try:
            self.wfile.write(b"<html><body>")
            while not self.server.stopping.is_set():
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.5)
        except (BrokenPipeError, ConnectionResetError):
            pass


ROUTES = {
    "/": DemoSiteHandler.index,
    "/redirect": DemoSiteHandler.redirect,
    "/moved": DemoSiteHandler.moved,
    "/broken-link": DemoSiteHandler.broken_link,
    "/slow": DemoSiteHandler.slow,
    "/no-security-headers": DemoSiteHandler.no_security_headers,
    "/report.pdf": DemoSiteHandler.report_pdf,
    "/noindex": DemoSiteHandler.noindex,
    "/missing": DemoSiteHandler.missing,
    "/huge": DemoSiteHandler.huge,
    "/flaky": DemoSiteHandler.flaky,
    "/busy": DemoSiteHandler.busy,
    "/loop": DemoSiteHandler.loop,
    "/trickle": DemoSiteHandler.trickle,
}


class DemoSite(ThreadingHTTPServer):
    daemon_threads = True
    # Stopping does not wait for requests still being answered (a receiver holding one
    # for seconds, a slow page): socketserver joins every handler thread on close otherwise.
    block_on_close = False

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        super().__init__((host, port), DemoSiteHandler)
        self.hits: Counter[str] = Counter()
        self.flaky_counts: Counter[str] = Counter()
        self.request_times: defaultdict[str, list[float]] = defaultdict(list)
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def handle_error(self, request, client_address):
        pass  # a client hanging up mid-response is normal here (size caps, timeouts)

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> DemoSite:
        # Polled often: stop() (shutdown) waits up to one poll interval, 0.5 s by default.
        threading.Thread(
            target=self.serve_forever, args=(0.05,), name="demo-site", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099)
    args = parser.parse_args()
    site = DemoSite(args.host, args.port)
    print(f"demo site on {site.base_url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        site.serve_forever()


if __name__ == "__main__":
    main()
