"""Pages on 127.0.0.1 built to hurt an auditor: huge, binary, link-stuffed (issue 26)."""

from __future__ import annotations

from urllib.parse import urlsplit

from tests.http_server import LocalServer, QuietHandler

CHUNK = 64 * 1024


class _Handler(QuietHandler):
    server: HostilePages

    def do_GET(self):
        page = self.server.pages.get(urlsplit(self.path).path)
        if page is None:
            body, size, content_type = b"<title>Target</title>", None, "text/html"
        else:
            body, size, content_type = page
        size = len(body) if size is None else size
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        sent = 0
        try:
            while sent < size:  # the body repeated up to `size`: 50 MB without holding it
                piece = body[: size - sent]
                self.wfile.write(piece)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the auditor stopped reading at its byte cap


class HostilePages(LocalServer):
    """`pages[path] = (body, size or None, content type)`; any other path is a small page."""

    def __init__(self):
        super().__init__(_Handler)
        self.pages: dict[str, tuple[bytes, int | None, str]] = {}


def link_stuffed_page(host: str, *, links: int, length: int = 0) -> bytes:
    """`links` distinct external links to `host` (each padded to `length` characters),
    then one 100,000-character link."""
    anchors = []
    for i in range(links):
        url = f"http://{host}/{i}/"
        anchors.append(f"<a href='{url}{'p' * max(0, length - len(url))}'>{i}</a>")
    anchors.append(f"<a href='http://{host}/long/{'x' * 100_000}'>long</a>")
    return ("<!doctype html><title>Links</title>" + "".join(anchors)).encode()


def one_tag_page(attributes: bytes, *, title: str = "Attributes") -> bytes:
    """A page whose one `<p>` tag holds `attributes`: what a tag's attributes cost the tree
    (DECISIONS.md, "A large page's tree is built in a child process")."""
    return f"<title>{title}</title><p".encode() + attributes + b">x</p>"


def distinct_attributes(count: int) -> bytes:
    """`count` attributes of different names (` a0 a1 ...`): Lexbor's tree costs their square."""
    return b"".join(b" a%d" % i for i in range(count))
