"""Plumb's Redis clients and broker channel under Sentinel: the traps of a failover.

Each test starts its own primary, replica and three sentinels (config.devservices.SentinelGroup).
"""

from __future__ import annotations

import threading

import kombu
import pytest
import redis

from config.devservices import SentinelGroup
from config.redis import lua, queue_script, redis_client
from jobs.transport import SentinelTransport
from tests.workers import wait_for

COUNT_LUA = lua("return redis.call('INCR', KEYS[1])")


@pytest.fixture
def group(settings, tmp_path_factory):
    group = SentinelGroup(tmp_path_factory.mktemp("sentinel")).start()
    settings.REDIS_URL = f"redis://{group.MASTER_NAME}/0"
    settings.REDIS_SENTINEL_ADDRESSES = [("127.0.0.1", port) for port in group.sentinel_ports]
    settings.REDIS_SENTINEL_MASTER = group.MASTER_NAME
    yield group
    group.stop()


def demote_the_master(group: SentinelGroup) -> None:
    """Make the master a replica by hand, as a failover does, without the CLIENT KILL
    with which Sentinel follows it: a client blocked on it then sees what Redis sends."""
    primary, replica = group.redis_ports
    group.client(replica).execute_command("REPLICAOF", "NO", "ONE")
    group.client(primary).execute_command("REPLICAOF", "127.0.0.1", str(replica))


def blocked_until_demoted(group: SentinelGroup, pop) -> Exception:
    raised = []

    def run():
        try:
            pop()
        except Exception as exc:  # noqa: BLE001 - what it raised is the answer
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    primary = group.client(group.redis_ports[0])
    wait_for(lambda: primary.info("clients")["blocked_clients"] == 1, timeout=10, message="BRPOP")
    demote_the_master(group)
    thread.join(timeout=10)
    return raised[0]


def test_a_brpop_unblocked_by_a_demotion_is_a_lost_connection(group):
    # redis-py would raise ResponseError("UNBLOCKED ..."), which is no connection error.
    client = redis_client()
    raised = blocked_until_demoted(group, lambda: client.brpop(["queue"], timeout=20))
    assert isinstance(raised, redis.ConnectionError), repr(raised)


def test_the_broker_takes_an_unblocked_brpop_for_a_lost_connection(group):
    # A channel error here stops a Celery worker ("Unrecoverable error"); a connection
    # error makes it reconnect, through the sentinels, to the new master.
    url = ";".join(f"sentinel://127.0.0.1:{port}/0" for port in group.sentinel_ports)
    with kombu.Connection(
        url, transport=SentinelTransport, transport_options={"master_name": group.MASTER_NAME}
    ) as connection:
        queue = connection.SimpleQueue("audits")
        raised = blocked_until_demoted(group, lambda: queue.get(timeout=20))
        assert isinstance(raised, connection.connection_errors), repr(raised)
        queue.close()


def test_scripts_and_pipelines_run_on_a_new_master_without_its_script_cache(group):
    client = redis_client()
    assert COUNT_LUA(keys=["counted"], client=client) == 1  # cached on the old master
    new_master = group.failover(kill=True)
    group.client(new_master).script_flush()
    # A Script in a pipeline would fail here with NOSCRIPT (redis-py loads a pipeline's
    # scripts once, before its retries); queue_script sends the text, so nothing is missing.
    pipe = client.pipeline(transaction=False)
    queue_script(pipe, COUNT_LUA, keys=["counted"], args=[])
    assert pipe.execute() == [2]
    assert COUNT_LUA(keys=["counted"], client=client) == 3  # EVALSHA, NOSCRIPT, loaded
    assert group.client(new_master).get("counted") == b"3"


def test_a_group_that_does_not_get_ready_leaves_no_server_running(tmp_path):
    # With no time to wait, the group starts its servers and times out waiting for the
    # replica: what it started must not outlive the failure (no caller holds it to stop).
    group = SentinelGroup(tmp_path)
    with pytest.raises(RuntimeError, match="timed out"):
        group.start(wait=0)
    assert group.processes
    assert all(process.poll() is not None for process in group.processes.values())
