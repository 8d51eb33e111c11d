"""Downstreams that misbehave at the socket level end an audit with a clear error, on time."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from audits import submission
from audits.models import Audit
from outbound.urls import normalize_url
from tests.workers import wait_for

pytestmark = pytest.mark.slow


class RawServer:
    """A TCP server on 127.0.0.1 that does one bad thing with every connection."""

    def __init__(self, behaviour: str):
        self.behaviour = behaviour
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.stopping = threading.Event()
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections.append(conn)
            if self.behaviour == "garbage":
                conn.recv(65536)
                conn.sendall(b"THIS IS NOT HTTP\r\n\x00\x01\x02\r\n\r\n")
                conn.close()
            # "hang": accept and never answer.

    def stop(self):
        self.stopping.set()
        self.sock.close()
        for conn in self.connections:
            conn.close()


@pytest.fixture
def raw_server():
    servers: list[RawServer] = []

    def start(behaviour: str) -> RawServer:
        servers.append(RawServer(behaviour))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


ONE_SHORT_ATTEMPT = {"AUDIT_MAX_ATTEMPTS": "1", "AUDIT_FETCH_TIMEOUT_SECONDS": "2"}


def run_one_audit(url: str, start_worker) -> Audit:
    start_worker("audits", env=ONE_SHORT_ATTEMPT)
    audit = submission.submit_audit(normalize_url(url))
    started = time.monotonic()
    wait_for(
        lambda: Audit.objects.get(id=audit.id).is_finished, timeout=30, message="the audit to end"
    )
    audit = Audit.objects.get(id=audit.id)
    audit.elapsed = time.monotonic() - started
    return audit


def test_a_downstream_that_hangs_forever_times_out(raw_server, start_worker):
    server = raw_server("hang")
    audit = run_one_audit(f"http://127.0.0.1:{server.port}/", start_worker)
    assert audit.status == "failed"
    assert "timed out after 2s" in audit.error
    assert audit.elapsed < 15


def test_a_body_without_end_times_out(site, start_worker):
    audit = run_one_audit(f"{site.base_url}/trickle", start_worker)
    assert audit.status == "failed"
    assert "timed out after 2s reading the body" in audit.error


def test_garbage_http_is_a_clear_error(raw_server, start_worker):
    server = raw_server("garbage")
    audit = run_one_audit(f"http://127.0.0.1:{server.port}/", start_worker)
    assert audit.status == "failed"
    assert "could not fetch" in audit.error and "Protocol" in audit.error
