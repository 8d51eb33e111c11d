"""Worker limits: a burst of retries coming due cannot take more database connections."""

from __future__ import annotations

import contextlib
import time

import psutil
import pytest
from django.db import connection

from audits import submission
from audits.models import Audit
from outbound.urls import normalize_url

pytestmark = pytest.mark.slow


def worker_connections(worker: psutil.Process) -> int:
    """The sessions of this database whose client is the worker or one of its pool
    processes (matched by the client's port): not a session another test left behind."""
    ports = set()
    for process in [worker, *worker.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):  # a pool process replaced meanwhile
            ports |= {c.laddr.port for c in process.net_connections("tcp") if c.raddr}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT client_port FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return sum(1 for (port,) in cursor.fetchall() if port in ports)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="counts PostgreSQL sessions")
def test_a_burst_of_retries_holds_at_most_one_connection_per_worker_process(site, start_worker):
    worker = start_worker(
        "audits", concurrency=2,
        env={"RETRY_BACKOFF_BASE_SECONDS": "0.05", "BREAKER_ENABLED": "false"},
    )  # fmt: skip
    process = psutil.Process(worker.process.pid)
    audits = [
        submission.submit_audit(normalize_url(f"{site.base_url}/flaky?key=burst{i}&fail=2"))
        for i in range(20)
    ]
    peak = 0
    deadline = time.monotonic() + 60
    while Audit.objects.exclude(status__in=Audit.FINISHED).exists():
        assert time.monotonic() < deadline, "the burst did not drain in 60 s"
        peak = max(peak, worker_connections(process))
        time.sleep(0.02)
    assert Audit.objects.filter(status="succeeded").count() == len(audits)
    # Two pool processes, one connection each, kept for reuse (DB_CONN_MAX_AGE);
    # the main process connects only to write a dead letter or a breaker's row.
    assert 2 <= peak <= 3
