"""Flower runs behind basic auth: FLOWER_BASIC_AUTH, or credentials runstack generates once."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx2
import pytest
from django.conf import settings

from config.devservices import free_port
from config.flower import LoginFailures
from devstack.management.commands.runstack import flower_basic_auth
from tests.workers import ROOT, terminate, wait_for


def test_configured_credentials_are_used_as_they_are(tmp_path):
    assert flower_basic_auth(tmp_path, "ops:pw") == ("ops:pw", False)
    assert not (tmp_path / "flower-basic-auth").exists()


def test_without_a_setting_credentials_are_generated_once_and_kept(tmp_path):
    credentials, generated = flower_basic_auth(tmp_path, "")
    user, _, password = credentials.partition(":")
    assert generated and user == "flower" and len(password) >= 16
    assert flower_basic_auth(tmp_path, "") == (credentials, True)
    assert (tmp_path / "flower-basic-auth").stat().st_mode & 0o777 == 0o600


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_many_addresses_do_not_grow_the_lockout_without_bound():
    failures = LoginFailures(3, window_seconds=600, max_addresses=100, clock=Clock())
    for n in range(5000):
        failures.failed(f"10.{n // 65536}.{n // 256 % 256}.{n % 256}")
    # It kept one entry per address, forever: 5,000 here, any number from a botnet or an
    # IPv6 prefix.
    assert len(failures) == 100


def test_the_lockout_still_locks_an_address_and_forgets_it_after_the_window():
    clock = Clock()
    failures = LoginFailures(3, window_seconds=600, max_addresses=100, clock=clock)
    for _ in range(3):
        assert not failures.locked("203.0.113.7")
        failures.failed("203.0.113.7")
    assert failures.locked("203.0.113.7")
    # Other addresses failing within the bound neither unlock it nor lock themselves.
    for n in range(50):
        failures.failed(f"198.51.100.{n}")
    assert failures.locked("203.0.113.7") and not failures.locked("198.51.100.1")
    clock.now += 601
    assert not failures.locked("203.0.113.7")
    assert len(failures) == 0  # every address's failures expired: nothing is kept


def start_flower(port: int, **env) -> subprocess.Popen:
    """Flower as runstack and docker-compose start it: with Plumb's flowerconfig.py."""
    env = {**os.environ, "REDIS_URL": settings.REDIS_URL, "FLOWER_BASIC_AUTH": "ops:let-me-in",
           **env}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "flower",
         f"--conf={ROOT / 'flowerconfig.py'}", "--address=127.0.0.1", f"--port={port}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.slow
def test_flower_refuses_a_request_without_its_basic_auth(redis_client):
    port = free_port()
    flower = start_flower(port)
    url = f"http://127.0.0.1:{port}/"

    def answers():
        try:
            return httpx2.get(url, timeout=2)
        except httpx2.TransportError:
            return None

    try:
        refused = wait_for(answers, timeout=60, interval=0.3, message="Flower to answer")
        assert refused.status_code == 401
        assert httpx2.get(url, auth=("ops", "wrong"), timeout=5).status_code == 401
        assert httpx2.get(url, auth=("ops", "let-me-in"), timeout=5).status_code == 200
        # docker-compose's healthcheck polls this one without credentials.
        assert httpx2.get(f"{url}healthcheck", timeout=5).status_code == 200
        # /metrics (every task name, worker and queue) answered anyone.
        assert httpx2.get(f"{url}metrics", timeout=5).status_code == 401
        metrics = httpx2.get(f"{url}metrics", auth=("ops", "let-me-in"), timeout=5)
        assert metrics.status_code == 200 and "flower_" in metrics.text
    finally:
        terminate(flower)


@pytest.mark.slow
def test_flower_locks_out_an_address_after_repeated_failed_logins(redis_client):
    port = free_port()
    flower = start_flower(port, LOGIN_FAILURE_LIMIT="3")
    url = f"http://127.0.0.1:{port}/"

    def answers():
        try:
            return httpx2.get(f"{url}healthcheck", timeout=2)
        except httpx2.TransportError:
            return None

    try:
        wait_for(answers, timeout=60, interval=0.3, message="Flower to answer")
        for _ in range(3):
            assert httpx2.get(url, auth=("ops", "guess"), timeout=5).status_code == 401
        # Locked: even the right password is refused, on every page that needs a login.
        assert httpx2.get(url, auth=("ops", "let-me-in"), timeout=5).status_code == 429
        assert httpx2.get(f"{url}metrics", auth=("ops", "let-me-in"), timeout=5).status_code == 429
        assert httpx2.get(f"{url}healthcheck", timeout=5).status_code == 200
    finally:
        terminate(flower)


@pytest.mark.slow
def test_flower_reports_the_length_of_plumbs_queues(redis_client):
    # Three entries waiting on the audits queue (no worker here takes them).
    redis_client.lpush(settings.AUDIT_QUEUE, "a", "b", "c")
    port = free_port()
    flower = start_flower(port)
    url = f"http://127.0.0.1:{port}/"

    def lengths():
        try:
            answer = httpx2.get(f"{url}api/queues/length", auth=("ops", "let-me-in"), timeout=5)
        except httpx2.TransportError:
            return None
        return answer

    try:
        answer = wait_for(lengths, timeout=60, interval=0.3, message="Flower to answer")
        # Flower chose its broker client by the scheme of kombu's URI for Plumb's
        # transport and answered 404 "'redis' broker is not supported".
        assert answer.status_code == 200, answer.text
        queues = {queue["name"]: queue["messages"] for queue in answer.json()["active_queues"]}
        assert queues[settings.AUDIT_QUEUE] == 3
        broker_page = httpx2.get(f"{url}broker", auth=("ops", "let-me-in"), timeout=5)
        assert broker_page.status_code == 200
    finally:
        terminate(flower)
