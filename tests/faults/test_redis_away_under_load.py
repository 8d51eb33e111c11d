"""Redis away 20 s under load, back empty: no attempt is spent, every audit succeeds once.

tests/faults/under_load.py: what the outage tests under load share, and why.
"""

from __future__ import annotations

import os
import time

import pytest

from jobs.models import ReconcileMark
from tests.faults.outages import WebProcess
from tests.faults.under_load import (
    AUDITS,
    OUTAGE_SECONDS,
    RECOVERY_SECONDS,
    THREADS,
    WORKER_ENV,
    all_succeeded,
    assert_every_audit_succeeded_once,
    slow_pages,
)
from tests.workers import database_url_for_workers, wait_for

pytestmark = [pytest.mark.slow]


def test_redis_away_20s_under_load_spends_no_attempt(
    site, start_worker, transactional_db, private_redis
):
    redis_url = private_redis.url
    env = {**os.environ, "DEBUG": "true", "REDIS_URL": redis_url,
           "DATABASE_URL": database_url_for_workers(), "AUDIT_ALLOW_PRIVATE_TARGETS": "true"}  # fmt: skip
    web = WebProcess(env)
    try:
        worker = start_worker(
            "audits", concurrency=THREADS, pool="threads",
            env={"REDIS_URL": redis_url, "RECONCILE_INTERVAL_SECONDS": "1", **WORKER_ENV},
        )  # fmt: skip
        wait_for(ReconcileMark.objects.exists, timeout=20, message="a first reconcile tick")
        for url in slow_pages(site, "redis20"):
            assert web.submit(url).status_code == 202
        wait_for(lambda: site.hits["/slow"] >= THREADS // 2, timeout=30, message="fetches")

        private_redis.restart_empty(down_seconds=OUTAGE_SECONDS)
        back = time.monotonic()

        wait_for(all_succeeded, timeout=RECOVERY_SECONDS, interval=0.5,
                 message=f"every audit to succeed within {RECOVERY_SECONDS} s of the return")  # fmt: skip
        assert_every_audit_succeeded_once("".join(worker.lines))
        print(f"all {AUDITS} succeeded {time.monotonic() - back:.1f} s after Redis returned")
    finally:
        web.stop()
