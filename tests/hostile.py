"""A hostile downstream on 127.0.0.1, for the tests and the bench: decompression bombs and
servers that trickle their headers.

    /bomb...?codings=gzip,gzip&status=200  BOMB_BYTES of zeros gzipped once per coding (gzip,
                                           gzip when none is named), sent with that
                                           Content-Encoding and status
    /plain?codings=deflate                 a small HTML page under those codings (one it
                                           cannot apply, such as br, is only declared)
    /trickle...                            a status line, then one header byte every
                                           `trickle_interval` seconds, for minutes

GET and POST alike. It counts requests and connections in flight (and their peak).

And a resolver that never answers (`SilentResolver`), for lookups that hang.
"""

from __future__ import annotations

import gzip
import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import zlib
from functools import cache
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from tests.http_server import LocalServer, QuietHandler

# The bomb: a GiB of zeros gzipped twice is 1,827 bytes on the wire.
BOMB_BYTES = 1024**3
PAGE = (
    b"<!doctype html><html><head><title>Encoded</title></head><body>"
    + b"x" * 5000
    + b"</body></html>"
)


@cache
def zeros_gzipped(size: int) -> bytes:
    """`size` zero bytes gzipped, built piece by piece (never the whole inflated body)."""
    out = bytearray()
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    piece = bytes(1024 * 1024)
    for _ in range(size // len(piece)):
        out += compressor.compress(piece)
    out += compressor.compress(bytes(size % len(piece)))
    out += compressor.flush()
    return bytes(out)


def encode(body: bytes, coding: str) -> bytes:
    if coding == "gzip":
        return gzip.compress(body, 9)
    if coding == "deflate":
        return zlib.compress(body, 9)
    if coding == "raw-deflate":
        compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
        return compressor.compress(body) + compressor.flush()
    return body  # declared, not applied


@cache
def bomb(codings: tuple[str, ...]) -> bytes:
    """BOMB_BYTES of zeros under `codings` (applied in order; all gzip here)."""
    body = zeros_gzipped(BOMB_BYTES)
    for coding in codings[1:]:
        body = encode(body, coding)
    return body


class _Handler(QuietHandler):
    server: HostileServer

    def do_GET(self):
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.accept_encodings.append(self.headers.get("Accept-Encoding", ""))
        with self.server.tracking():
            if url.path.startswith("/trickle"):
                return self._trickle()
            default = "gzip,gzip" if url.path.startswith("/bomb") else ""
            codings = tuple(c for c in query.get("codings", default).split(",") if c)
            if url.path.startswith("/bomb"):
                body = bomb(codings)
                content_type = "text/html"
            else:
                body = PAGE
                for coding in codings:
                    body = encode(body, coding)
                content_type = "text/html; charset=utf-8"
            self.send_response(int(query.get("status", 200)))
            self.send_header("Content-Type", content_type)
            if codings:
                names = ["deflate" if c == "raw-deflate" else c for c in codings]
                self.send_header("Content-Encoding", ", ".join(names))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    do_POST = do_GET

    def _trickle(self):
        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
        self.wfile.flush()
        ends = time.monotonic() + self.server.trickle_seconds
        try:
            while time.monotonic() < ends:
                self.wfile.write(b"X")
                self.wfile.flush()
                time.sleep(self.server.trickle_interval)
        except OSError:
            pass  # the client gave up: what the tests wait for
        self.close_connection = True


class HostileServer(LocalServer):
    def __init__(self, *, trickle_interval: float = 0.5, trickle_seconds: float = 120.0):
        super().__init__(_Handler)
        self.trickle_interval = trickle_interval
        self.trickle_seconds = trickle_seconds
        self.lock = threading.Lock()
        self.requests = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.finished = 0
        self.accept_encodings: list[str] = []  # what each request asked for

    def tracking(self):
        server = self

        class _Tracking:
            def __enter__(self):
                with server.lock:
                    server.requests += 1
                    server.in_flight += 1
                    server.peak_in_flight = max(server.peak_in_flight, server.in_flight)

            def __exit__(self, *exc):
                with server.lock:
                    server.in_flight -= 1
                    server.finished += 1

        return _Tracking()


class SilentResolver:
    """A DNS server that takes every query and never answers, and a way to run a process
    that resolves through it: a mount namespace of its own (`unshare --mount`, root only)
    with /etc/resolv.conf bound over by one naming this server, so the process's real
    getaddrinfo waits on it (30 s a try, one try) while everything else on the machine
    keeps the machine's resolver.

    It listens on port 53 (resolv.conf cannot name a port) of a random 127/8 address, so
    two test processes do not collide.
    """

    def __init__(self):
        self.address = (
            f"127.{random.randint(64, 250)}.{random.randint(1, 250)}.{random.randint(2, 250)}"
        )
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind((self.address, 53))
        self.socket.settimeout(0.2)
        self.queries = 0
        self._stopping = threading.Event()
        self._dir = tempfile.TemporaryDirectory(prefix="plumb-resolver-")
        self.resolv_conf = Path(self._dir.name) / "resolv.conf"
        self.resolv_conf.write_text(f"nameserver {self.address}\noptions timeout:30 attempts:1\n")

    @staticmethod
    def unavailable() -> str | None:
        """Why this machine cannot run it, or None."""
        if os.geteuid() != 0:
            return "a mount namespace needs root"
        if shutil.which("unshare") is None:
            return "unshare (util-linux) is not installed"
        return None

    def start(self) -> SilentResolver:
        self._thread = threading.Thread(target=self._swallow, daemon=True)
        self._thread.start()
        return self

    def _swallow(self) -> None:
        while not self._stopping.is_set():
            try:
                self.socket.recvfrom(4096)
            except TimeoutError:
                continue
            self.queries += 1

    def run(self, argv: list[str], *, env: dict, timeout: float) -> subprocess.CompletedProcess:
        script = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
        return subprocess.run(
            ["unshare", "--mount", "--", "sh", "-c", script, str(self.resolv_conf), *argv],
            env=env, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        self.socket.close()
        self._dir.cleanup()
