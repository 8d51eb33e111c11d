"""Redis stops and starts again, empty, under a running web process and worker.

Submissions during the outage get a clear 503 and write nothing; what was accepted
before is finished: audits that were running complete, and audits whose messages
died with Redis are published again by the reconciler (jobs.reconcile).
"""

from __future__ import annotations

import os

import pytest

from audits.models import Audit
from jobs.models import ReconcileMark
from tests.faults.outages import WebProcess
from tests.workers import database_url_for_workers, wait_for

pytestmark = pytest.mark.slow


def test_a_redis_restart_loses_no_accepted_audit(
    site, start_worker, transactional_db, private_redis
):
    redis_url = private_redis.url
    env = {**os.environ, "DEBUG": "true", "REDIS_URL": redis_url, "DATABASE_URL": database_url_for_workers(),
           "AUDIT_ALLOW_PRIVATE_TARGETS": "true"}  # fmt: skip
    web = WebProcess(env)
    try:
        start_worker("audits", env={"REDIS_URL": redis_url, "RECONCILE_INTERVAL_SECONDS": "0.5"})
        wait_for(ReconcileMark.objects.exists, timeout=20, message="a first reconcile tick")
        running = web.submit(f"{site.base_url}/slow?delay=3").json()
        wait_for(lambda: site.hits["/slow"] == 1, timeout=20, message="the first audit's fetch")
        # Queued behind it (one process, prefetch 1): these messages live only in Redis.
        queued = [web.submit(f"{site.base_url}/noindex?n={n}").json() for n in range(2)]

        private_redis.stop()
        refused = web.submit(f"{site.base_url}/noindex?during=outage")
        assert refused.status_code == 503
        assert refused.json()["error"] == "admission_unavailable"
        assert "Retry-After" in refused.headers
        assert Audit.objects.count() == 3  # the refused submission wrote nothing

        private_redis.start()  # back, and empty
        wait_for(lambda: Audit.objects.get(id=running["id"]).status == "succeeded", timeout=30,
                 message="the running audit to finish")  # fmt: skip

        # The worker's reconciler finds the mark it left in Redis gone and publishes again
        # what PostgreSQL says is owed (jobs.reconcile), within its interval.
        for audit in queued:
            wait_for(lambda a=audit: Audit.objects.get(id=a["id"]).status == "succeeded", timeout=30,
                     message="a requeued audit to finish")  # fmt: skip

        after = web.submit(f"{site.base_url}/noindex?after=restart")
        assert after.status_code == 202
        wait_for(lambda: Audit.objects.get(id=after.json()["id"]).status == "succeeded", timeout=30,
                 message="a submission after the restart")  # fmt: skip
        assert all(a.attempts >= 1 for a in Audit.objects.all())
    finally:
        web.stop()
