"""The web process `make run` starts survives clients that trickle their requests.

With gunicorn's sync workers, three sockets sending a header byte at a time took
/healthz down for as long as they kept sending (28 s in the report). Each test starts
the command line runstack uses (`web_command`; docker-compose runs the same server).
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import time

import httpx2
import pytest
from django.conf import settings

from config.devservices import free_port
from devstack.management.commands.runstack import web_command
from tests.workers import ROOT, wait_for

pytestmark = pytest.mark.slow

TRICKLERS = 50
STALLERS = 40
BODY_DEADLINE_SECONDS = 1
# The stalled upload: most of a declared 1,040,000 bytes.
DECLARED = 1_040_000


@pytest.fixture
def web(tmp_path, redis_client):
    env = {
        **os.environ,
        "DEBUG": "false",
        "SECRET_KEY": "slow-client-test-" + "k" * 50,
        "DATABASE_URL": f"sqlite:///{tmp_path}/web.sqlite3",
        "REDIS_URL": settings.REDIS_URL,
        "PLUMB_VAR_DIR": str(tmp_path),
        "WEB_BODY_READ_TIMEOUT_SECONDS": str(BODY_DEADLINE_SECONDS),
    }
    server, base, port = start_web(tmp_path, env)
    try:
        yield base, port
    finally:
        server.terminate()
        server.wait(timeout=30)


def start_web(tmp_path, env: dict) -> tuple[subprocess.Popen, str, int]:
    """The web on a free port once /healthz answers 200: (process, base URL, port).

    Another process can take the port between `free_port()` and gunicorn's bind (a client's
    connection is given any free port): gunicorn then says so and exits, and the web starts
    again on another port. Any other exit, or no answer within 60 s, fails with the web's log.
    """
    for _ in range(3):
        port = free_port()
        log = tmp_path / f"web-{port}.log"
        with log.open("w") as out:
            server = subprocess.Popen(
                web_command("127.0.0.1", port, workers=2).split(), cwd=ROOT, env=env,
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        base = f"http://127.0.0.1:{port}"

        def answered_or_exited(server=server, base=base):
            if server.poll() is not None:
                return "exited"
            try:
                return httpx2.get(f"{base}/healthz", timeout=2).status_code == 200 and "answered"
            except httpx2.TransportError:
                return False

        try:
            outcome = wait_for(answered_or_exited, timeout=60, interval=0.3)
        except AssertionError:
            outcome = "silent"
        if outcome == "answered":
            return server, base, port
        server.terminate()
        server.wait(timeout=30)
        if "Connection in use" not in log.read_text():
            raise AssertionError(f"the web {outcome} before /healthz answered:\n{log.read_text()}")
    raise AssertionError("three free ports were taken before the web could bind one")


def test_healthz_answers_while_fifty_clients_trickle_their_headers(web):
    base, port = web
    tricklers = []
    try:
        for _ in range(TRICKLERS):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            tricklers.append(sock)
        for _ in range(3):
            for sock in tricklers:
                sock.sendall(b"a")  # still sending: a header is never finished
            # The bound is generous against a loaded machine; sync workers never answered.
            response = httpx2.get(f"{base}/healthz", timeout=10)
            assert response.status_code == 200
            time.sleep(0.2)
    finally:
        for sock in tricklers:
            sock.close()


def post_headers(length: int | None) -> bytes:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (
        "POST /api/audits HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"{framing}\r\n\r\n"
    ).encode()


def answer(sock: socket.socket, timeout: float) -> tuple[int, dict]:
    """The status and JSON body of the response on `sock` (the server closes it after)."""
    sock.settimeout(timeout)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_stalled_bodies_are_cut_off_at_the_deadline_and_the_web_keeps_answering(web):
    base, port = web
    cap = settings.API_MAX_BODY_BYTES
    stalled, started = [], time.monotonic()
    try:
        for _ in range(STALLERS):
            # Within the cap, so only the deadline can end it: all of the body but a byte.
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(post_headers(cap) + b"x" * (cap - 1))
            stalled.append(sock)
        assert httpx2.get(f"{base}/healthz", timeout=10).status_code == 200
        # A whole body still reaches the API meanwhile (which says `[]` is no object).
        submission = httpx2.post(
            f"{base}/api/audits", content=b"[]", headers={"Content-Type": "application/json"},
            timeout=10,
        )  # fmt: skip
        assert submission.status_code == 400, submission.text
        selector = selectors.DefaultSelector()
        for sock in stalled:
            selector.register(sock, selectors.EVENT_READ)
        ended = set()
        # gunicorn alone gives up on a body after 30 s without a byte; the bound is
        # generous against a loaded machine and well short of that.
        deadline = started + 15
        while len(ended) < STALLERS and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.5):
                selector.unregister(key.fileobj)
                ended.add(key.fileobj)
        selector.close()
        assert len(ended) == STALLERS, f"{STALLERS - len(ended)} stalled bodies still held"
        for sock in stalled:
            status, body = answer(sock, timeout=5)
            assert status == 408 and body["error"] == "request_timeout"
        assert httpx2.get(f"{base}/healthz", timeout=10).status_code == 200
    finally:
        for sock in stalled:
            sock.close()


def test_a_body_declared_over_the_cap_is_refused_before_it_is_sent(web):
    _, port = web
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(post_headers(DECLARED) + b"x" * 1000)  # then nothing: it waits
        status, body = answer(sock, timeout=10)
    assert status == 413 and body["error"] == "payload_too_large"
    assert str(settings.API_MAX_BODY_BYTES) in body["message"]
    # Chunked, the length is known only as it comes: refused once past the cap.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        chunk = b"x" * 4096
        sock.sendall(post_headers(None))
        for _ in range(settings.API_MAX_BODY_BYTES // len(chunk) + 1):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        status, body = answer(sock, timeout=10)  # the final chunk never comes
    assert status == 413 and body["error"] == "payload_too_large"


def test_a_body_over_the_cap_is_refused_before_django_reads_it(web):
    base, _ = web
    cap = settings.API_MAX_BODY_BYTES
    declared = httpx2.post(f"{base}/api/audits", content=b"x" * (cap + 1), timeout=10)
    assert declared.status_code == 413

    def endless():
        for _ in range(cap // 65536 + 2):
            yield b"x" * 65536

    chunked = httpx2.post(f"{base}/api/audits", content=endless(), timeout=10)
    assert chunked.status_code == 413
    assert chunked.json()["error"] == "payload_too_large"
    # A body within the cap reaches the API, which answers it (here: not a JSON object).
    within = httpx2.post(
        f"{base}/api/audits", content=b"[" + b" " * (cap - 2) + b"]",
        headers={"Content-Type": "application/json"}, timeout=10,
    )  # fmt: skip
    assert within.status_code == 400, within.text
    assert httpx2.get(f"{base}/healthz", timeout=10).status_code == 200
