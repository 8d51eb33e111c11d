"""The web process `make run` starts survives clients that trickle their requests.

With gunicorn's sync workers, three sockets sending a header byte at a time took
/healthz down for as long as they kept sending (28 s in the report). Each test starts
the command line runstack uses (`web_command`; docker-compose runs the same server).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

import httpx
import pytest
from django.conf import settings

from config.devservices import free_port
from devstack.management.commands.runstack import web_command
from tests.workers import ROOT, wait_for

pytestmark = pytest.mark.slow

TRICKLERS = 50


@pytest.fixture
def web(tmp_path, redis_client):
    port = free_port()
    env = {
        **os.environ,
        "DEBUG": "false",
        "SECRET_KEY": "slow-client-test-" + "k" * 50,
        "DATABASE_URL": f"sqlite:///{tmp_path}/web.sqlite3",
        "REDIS_URL": settings.REDIS_URL,
        "PLUMB_VAR_DIR": str(tmp_path),
    }
    server = subprocess.Popen(
        web_command("127.0.0.1", port, workers=2).split(), cwd=ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    def answers():
        try:
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(answers, timeout=60, interval=0.3, message="the web process to answer")
        yield base, port
    finally:
        server.terminate()
        server.wait(timeout=30)


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
            response = httpx.get(f"{base}/healthz", timeout=10)
            assert response.status_code == 200
            time.sleep(0.2)
    finally:
        for sock in tricklers:
            sock.close()


def test_a_body_over_the_cap_is_refused_before_django_reads_it(web):
    base, _ = web
    cap = settings.ASGI_MAX_BODY_BYTES
    declared = httpx.post(f"{base}/api/audits", content=b"x" * (cap + 1), timeout=10)
    assert declared.status_code == 413

    def endless():
        for _ in range(cap // 65536 + 2):
            yield b"x" * 65536

    chunked = httpx.post(f"{base}/api/audits", content=endless(), timeout=10)
    assert chunked.status_code == 413
    # Under the cap, Django's own limit answers with the API's JSON error.
    over_api = httpx.post(
        f"{base}/api/audits", content=b"x" * (settings.API_MAX_BODY_BYTES + 1),
        headers={"Content-Type": "application/json"}, timeout=10,
    )  # fmt: skip
    assert over_api.status_code == 413 and over_api.json()["error"] == "payload_too_large"
    assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
