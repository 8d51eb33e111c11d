"""`make run` keeps serving when one of its processes exits: that process is started
again with backoff, and the others never notice."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading

import httpx2
import pytest

from config import devservices
from devstack.supervisor import RESTART_BACKOFF_MAX_SECONDS, Supervisor, restart_delay
from tests.workers import wait_for


def test_restarts_back_off_doubling_up_to_the_cap():
    assert [restart_delay(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 8]
    assert restart_delay(50) == RESTART_BACKOFF_MAX_SECONDS


@pytest.fixture
def supervisor():
    out = io.StringIO()
    running = Supervisor(out, stop_timeout=5)
    thread = threading.Thread(target=running.run, kwargs={"handle_signals": False}, daemon=True)
    yield running, thread, out
    running.stop()
    thread.join(timeout=15)
    assert not thread.is_alive()


def answers(url: str) -> bool:
    try:
        return httpx2.get(url, timeout=1).status_code == 200
    except httpx2.HTTPError:
        return False


def test_a_process_that_exits_is_restarted_and_the_others_keep_serving(supervisor):
    running, thread, out = supervisor
    port = devservices.free_port()
    web = running.add("web", f"{sys.executable} -m http.server {port} --bind 127.0.0.1")
    crasher = running.add("crasher", f"{sys.executable} -c 'raise SystemExit(3)'")
    thread.start()
    url = f"http://127.0.0.1:{port}/"
    wait_for(lambda: answers(url), timeout=20, message="the web process")

    # Three exits in a row: restarted each time, 1 s then 2 s later.
    wait_for(lambda: len(crasher.starts) >= 3, timeout=20, message="three restarts")
    gaps = [
        later - earlier for earlier, later in zip(crasher.starts, crasher.starts[1:], strict=False)
    ]
    assert gaps[0] >= 1.0 and gaps[1] >= 2.0
    assert "crasher exited (rc=3); restarting in 2 s" in out.getvalue()
    assert answers(url) and len(web.starts) == 1


def test_a_killed_process_comes_back(supervisor):
    running, thread, out = supervisor
    port = devservices.free_port()
    web = running.add("web", f"{sys.executable} -m http.server {port} --bind 127.0.0.1")
    thread.start()
    url = f"http://127.0.0.1:{port}/"
    wait_for(lambda: answers(url), timeout=20, message="the web process")

    os.kill(web.process.pid, signal.SIGKILL)
    wait_for(lambda: len(web.starts) == 2 and answers(url), timeout=20, message="web again")
    assert "web exited (rc=-9)" in out.getvalue()


def test_stopping_ends_every_process(supervisor):
    running, thread, _ = supervisor
    sleeper = running.add("sleeper", f"{sys.executable} -c 'import time; time.sleep(600)'")
    thread.start()
    wait_for(lambda: sleeper.process is not None, timeout=10, message="the sleeper")
    running.stop()
    thread.join(timeout=15)
    assert sleeper.process.poll() is not None
