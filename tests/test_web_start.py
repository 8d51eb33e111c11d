"""From the moment the web's port accepts connections, /healthz answers within a second.

A load balancer probing a starting web needs a refused connection or a quick answer:
once gunicorn had bound its port, and before its workers had loaded Django, a probe was
accepted and not answered for seconds, and the log then recorded it as a 500. The web
runs as `make run` starts it (runstack's `web_command`, from the checkout, where
gunicorn reads gunicorn.conf.py); a probe every 50 ms from before it starts.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx2
import pytest
from django.conf import settings

from config.devservices import free_port
from devstack.management.commands.runstack import web_command

ROOT = Path(__file__).resolve().parent.parent
PROBE_TIMEOUT_SECONDS = 1.0
PROBE_EVERY_SECONDS = 0.05
STARTS = 2


def probe_a_start(tmp_path: Path) -> tuple[list[str], str]:
    """Start the web, probe it until /healthz answers 200; every probe's outcome, and
    the web's log. A port another process took between `free_port` and gunicorn's bind
    is given up for another (at most three)."""
    for _ in range(3):
        outcomes, log = probe_a_start_on(tmp_path, free_port())
        if outcomes != ["taken"]:
            return outcomes, log
    return outcomes, log


def probe_a_start_on(tmp_path: Path, port: int) -> tuple[list[str], str]:
    log = tmp_path / f"web-{port}.log"
    env = {
        **os.environ,
        "DEBUG": "false",
        "SECRET_KEY": "web-start-test-" + "k" * 50,
        "DATABASE_URL": f"sqlite:///{tmp_path}/web.sqlite3",
        "REDIS_URL": settings.REDIS_URL,
        "PLUMB_VAR_DIR": str(tmp_path),
    }
    outcomes = []
    with log.open("w") as out:
        web = subprocess.Popen(
            web_command("127.0.0.1", port, workers=2).split(), cwd=ROOT, env=env,
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and "200" not in outcomes:
                if "Connection in use" in log.read_text():  # gunicorn's bind, refused
                    return ["taken"], log.read_text()
                assert web.poll() is None, log.read_text()
                try:
                    status = httpx2.get(
                        f"http://127.0.0.1:{port}/healthz", timeout=PROBE_TIMEOUT_SECONDS
                    ).status_code
                    outcomes.append(str(status))
                except httpx2.ConnectError:
                    outcomes.append("refused")
                except httpx2.TimeoutException:
                    outcomes.append("hung")
                time.sleep(PROBE_EVERY_SECONDS)
        finally:
            web.terminate()
            web.wait(timeout=30)
    return outcomes, log.read_text()


@pytest.mark.parametrize("start", range(STARTS))
def test_healthz_is_refused_or_answers_quickly_from_the_first_probe(tmp_path, start):
    outcomes, log = probe_a_start(tmp_path)
    assert outcomes[-1] == "200", log
    answered = [o for o in outcomes if o != "refused"]
    # Refused until the port is bound; from then on, an answer to every probe: 200,
    # or 503 while the database or Redis does not answer yet. Never a hang, never a 500.
    assert set(answered) <= {"200", "503"}, f"{outcomes}\n{log}"
    assert '"GET /healthz HTTP/1.1" 500' not in log, log
