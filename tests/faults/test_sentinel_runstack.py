"""`make run` under Sentinel: it asks the sentinels for the master, as every process it
starts does, and never starts a Redis of its own outside the group.

The group is private (config.devservices.SentinelGroup: a primary, a replica, three
sentinels on free ports); the stack's database is a SQLite file of the test's own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import psutil
import pytest

from config.devservices import SentinelGroup, free_port, redis_answers
from tests.workers import wait_for

ROOT = Path(__file__).resolve().parents[2]


def stack_env(tmp_path: Path, redis_env: dict[str, str]) -> dict[str, str]:
    return {
        **os.environ,
        **redis_env,
        "DEBUG": "true",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'stack.sqlite3'}",
        "PLUMB_VAR_DIR": str(tmp_path / "var"),
        "WEB_PORT": str(free_port()),
        "FLOWER_PORT": str(free_port()),
        "AUDITS_WORKER_PROCESSES": "1",
    }


def runstack(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "manage.py", "runstack"], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


@pytest.fixture
def group():
    group = SentinelGroup(Path(tempfile.mkdtemp(prefix="plumb-sentinel-"))).start()
    yield group
    group.stop()


def test_make_run_serves_on_the_master_the_sentinels_name(tmp_path, group):
    env = stack_env(tmp_path, group.env(db=0))
    stack = runstack(env)
    healthz = f"http://127.0.0.1:{env['WEB_PORT']}/healthz"

    def healthy():
        assert stack.poll() is None, stack.stdout.read()
        try:
            return httpx.get(healthz, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, timeout=180, interval=0.5, message="the stack's /healthz")
        family = psutil.Process(stack.pid).children(recursive=True)
        assert not [p for p in family if "redis-server" in p.name()]
        # The stack's broker is the master too: the workers' queues are there.
        master = group.client(group.master_port())
        wait_for(lambda: master.keys("_kombu.binding.*"), timeout=60, message="bindings")
    finally:
        stack.send_signal(signal.SIGTERM)
        output, _ = stack.communicate(timeout=60)
    assert f"Redis: master 'plumb' at 127.0.0.1:{group.redis_ports[0]}" in output
    assert [p for p in family if p.is_running()] == []


def test_make_run_starts_no_redis_when_no_sentinel_answers(tmp_path):
    """REDIS_URL names a local port where nothing answers: without Sentinel, make run
    would start a Redis there; with REDIS_SENTINELS set, it says so and stops."""
    redis_port, sentinel_port = free_port(), free_port()
    env = stack_env(tmp_path, {
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "REDIS_SENTINELS": f"127.0.0.1:{sentinel_port}",
        "REDIS_SENTINEL_MASTER": "plumb",
    })  # fmt: skip
    stack = runstack(env)
    output, _ = stack.communicate(timeout=60)
    assert stack.returncode != 0
    assert f"The sentinels 127.0.0.1:{sentinel_port} name no master 'plumb'" in output
    assert "starting one" not in output
    assert not redis_answers(env["REDIS_URL"], timeout=0.5)
