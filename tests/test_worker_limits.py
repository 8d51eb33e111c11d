"""Worker limits: a burst of retries coming due cannot take more database connections."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from audits import submission
from audits.models import Audit
from outbound.urls import normalize_url
from tests.workers import wait_for

pytestmark = pytest.mark.slow


def worker_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="counts PostgreSQL sessions")
def test_a_burst_of_retries_holds_at_most_one_connection_per_worker_process(site, start_worker):
    # A worker the previous test stopped may still be closing its session.
    wait_for(lambda: worker_connections() == 0, timeout=15, message="no other session")
    start_worker(
        "audits", concurrency=2,
        env={"RETRY_BACKOFF_BASE_SECONDS": "0.05", "BREAKER_ENABLED": "false"},
    )  # fmt: skip
    audits = [
        submission.submit_audit(normalize_url(f"{site.base_url}/flaky?key=burst{i}&fail=2"))
        for i in range(20)
    ]
    peak = 0
    deadline = time.monotonic() + 60
    while Audit.objects.exclude(status__in=Audit.FINISHED).exists():
        assert time.monotonic() < deadline, "the burst did not drain in 60 s"
        peak = max(peak, worker_connections())
        time.sleep(0.02)
    assert Audit.objects.filter(status="succeeded").count() == len(audits)
    # Two pool processes, one connection each, kept for reuse (DB_CONN_MAX_AGE);
    # the main process connects only to write a dead letter or a breaker's row.
    assert 2 <= peak <= 3
