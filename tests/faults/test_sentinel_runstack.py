"""`make run` under Sentinel: it asks the sentinels for the master, as every process it
starts does, and never starts a Redis of its own outside the group.

The group is private (config.devservices.SentinelGroup: a primary, a replica, three
sentinels on free ports); the stack's database is a SQLite file of the test's own.
"""

from __future__ import annotations

import signal

import psutil
import pytest

from config.devservices import SentinelGroup, free_port, redis_answers
from tests.stack import healthy, runstack, stack_env
from tests.workers import wait_for


@pytest.fixture
def group(tmp_path_factory):
    group = SentinelGroup(tmp_path_factory.mktemp("sentinel")).start()
    yield group
    group.stop()


def test_make_run_serves_on_the_master_the_sentinels_name(tmp_path, group):
    env = stack_env(tmp_path, group.env(db=0))
    stack = runstack(env)
    try:
        wait_for(lambda: healthy(stack, env), timeout=180, interval=0.5, message="/healthz")
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
