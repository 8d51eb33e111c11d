"""Redis Sentinel: the master fails over under load, and Plumb follows it.

A primary, a replica and three sentinels on free ports (config.devservices.SentinelGroup);
a web process and a real audits worker pointed at them through REDIS_SENTINELS; audits of
a local site submitted before, during and after the failover. Every accepted audit
finishes, the worker is still taking work afterwards, and Flower still reaches the workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import httpx2
import pytest

from audits.models import Audit
from config.devservices import SentinelGroup, free_port
from tests.faults.outages import WebProcess
from tests.workers import ROOT, database_url_for_workers, terminate, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def sentinel_group(tmp_path_factory):
    group = SentinelGroup(tmp_path_factory.mktemp("sentinel")).start()
    yield group
    group.stop()


def sentinel_env(group: SentinelGroup) -> dict:
    return {
        **os.environ, **group.env(), "DEBUG": "true", "DATABASE_URL": database_url_for_workers(),
        "AUDIT_ALLOW_PRIVATE_TARGETS": "true",
        # The load is one client at 10 a second: above its token bucket's default rate.
        "AUDIT_SUBMIT_BURST": "1000", "AUDIT_SUBMIT_RATE_PER_MINUTE": "6000",
    }  # fmt: skip


class Load:
    """Submits an audit of the site every `interval` seconds until stopped."""

    def __init__(self, web: WebProcess, site, interval: float = 0.1):
        self.web, self.site, self.interval = web, site, interval
        self.accepted: list[str] = []
        self.refused: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        n = 0
        while not self._stop.wait(self.interval):
            n += 1
            answer = self.web.submit(f"{self.site.base_url}/noindex?n={n}")
            if answer.status_code == 202:
                self.accepted.append(answer.json()["id"])
            else:
                self.refused.append(answer.status_code)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=30)


def reconcile_now(env: dict) -> dict[str, int]:
    """What a worker's reconciler thread does every RECONCILE_INTERVAL_SECONDS (jobs.reconcile),
    run now against the Sentinel's master: {source: jobs published again}."""
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c",
         "import json; from config.redis import redis_client; from jobs import reconcile; "
         "print(json.dumps(reconcile.reconcile(client=redis_client(), overdue_after=0).republished))"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def finished(ids: list[str]) -> bool:
    return Audit.objects.filter(id__in=ids, status="succeeded").count() == len(ids)


@pytest.mark.parametrize("kill", [True, False], ids=["master-killed", "sentinel-failover"])
def test_a_failover_under_load_loses_no_accepted_audit(
    kill, sentinel_group, site, start_worker, transactional_db
):
    env = sentinel_env(sentinel_group)
    web = WebProcess(env)
    try:
        worker = start_worker("audits", pool="threads", concurrency=4, env=sentinel_group.env())
        with Load(web, site) as load:
            wait_for(
                lambda: len(load.accepted) >= 10, timeout=20, message="audits before the failover"
            )
            started = time.monotonic()
            sentinel_group.failover(kill=kill)
            failover_seconds = time.monotonic() - started
            during = len(load.accepted)
            wait_for(lambda: len(load.accepted) >= during + 10, timeout=30,
                     message="audits accepted after the failover")  # fmt: skip
        accepted = load.accepted
        print(f"failover {failover_seconds:.1f}s, accepted {len(accepted)}, refused {load.refused}")
        drain_started = time.monotonic()
        try:
            wait_for(lambda: finished(accepted), timeout=20, message="every accepted audit",
                     show=[worker])  # fmt: skip
            requeued = None
        except AssertionError:
            # Messages the old master took after its replica's last sync are gone with it:
            # the reconciler publishes their audits again from PostgreSQL.
            requeued = reconcile_now(env)
            wait_for(lambda: finished(accepted), timeout=30, message="every accepted audit",
                     show=[worker])  # fmt: skip
        print(f"all finished {time.monotonic() - drain_started:.1f}s after the load stopped; "
              f"republished by the reconciler: {requeued}")  # fmt: skip
        # The worker is not wedged: a new audit runs on the new master.
        fresh = web.submit(f"{site.base_url}/noindex?after=failover")
        assert fresh.status_code == 202
        wait_for(lambda: finished([fresh.json()["id"]]), timeout=20, message="an audit after the failover",
                 show=[worker])  # fmt: skip
        assert worker.process.poll() is None
        assert "Unrecoverable error" not in worker.output()
    finally:
        web.stop()


def test_flower_reaches_the_workers_through_the_sentinels_across_a_failover(
    sentinel_group, start_worker
):
    port = free_port()
    env = {**sentinel_env(sentinel_group), "FLOWER_BASIC_AUTH": "ops:pw"}
    worker = start_worker("audits", env=sentinel_group.env())
    flower = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "flower",
         "--address=127.0.0.1", f"--port={port}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def lists_the_worker() -> bool:
        # refresh=1: Flower asks the workers now (a broadcast over the broker's pub/sub).
        try:
            answer = httpx2.get(f"http://127.0.0.1:{port}/api/workers?refresh=1",
                               auth=("ops", "pw"), timeout=10)  # fmt: skip
        except httpx2.TransportError:
            return False
        return answer.status_code == 200 and worker.name in "".join(answer.json())

    try:
        wait_for(lists_the_worker, timeout=60, interval=0.5, message="Flower to list the worker")
        sentinel_group.failover()
        wait_for(lists_the_worker, timeout=30, interval=0.5, message="Flower, after the failover")
        # Its queue lengths come from the master the first sentinel names.
        lengths = httpx2.get(f"http://127.0.0.1:{port}/api/queues/length",
                            auth=("ops", "pw"), timeout=10)  # fmt: skip
        assert lengths.status_code == 200, lengths.text
    finally:
        terminate(flower)
