"""The database goes away for a while: /healthz says so, workers retry and recover."""

from __future__ import annotations

import os

import httpx2
import pytest

from audits import submission
from audits.models import Audit
from outbound.urls import normalize_url
from tests.faults.outages import WebProcess, via
from tests.workers import wait_for

pytestmark = [pytest.mark.slow]


def test_healthz_reports_the_database_and_recovers(db_proxy):
    web = WebProcess({**os.environ, "DEBUG": "true", "DATABASE_URL": via(db_proxy)})
    try:
        assert httpx2.get(f"{web.url}/healthz", timeout=10).status_code == 200
        db_proxy.cut()
        down = httpx2.get(f"{web.url}/healthz", timeout=30)
        assert down.status_code == 503
        assert down.json()["checks"]["database"].startswith("error")
        assert down.json()["checks"]["redis"] == "ok"
        db_proxy.restore()
        wait_for(lambda: httpx2.get(f"{web.url}/healthz", timeout=10).status_code == 200,
                 timeout=30, message="/healthz to recover")  # fmt: skip
    finally:
        web.stop()


def test_a_worker_retries_through_a_database_outage_and_finishes_the_audit(
    db_proxy, site, start_worker
):
    worker = start_worker(
        "audits", env={"DATABASE_URL": via(db_proxy), "RETRY_BACKOFF_BASE_SECONDS": "1"}
    )
    db_proxy.cut()
    # Accepted while the workers cannot reach the database (the web process can).
    audit = submission.submit_audit(normalize_url(f"{site.base_url}/noindex"))
    wait_for(lambda: "task.outage_wait" in worker.output(), timeout=30,
             message="the worker to wait the outage out")  # fmt: skip
    assert Audit.objects.get(id=audit.id).status == "queued"

    db_proxy.restore()
    wait_for(lambda: Audit.objects.get(id=audit.id).status == "succeeded", timeout=60,
             message="the audit to finish once the database is back")  # fmt: skip
    assert site.hits["/noindex"] == 1


def test_a_submission_while_the_database_is_away_gets_503_and_can_retry(db_proxy, site):
    web = WebProcess({**os.environ, "DEBUG": "true", "DATABASE_URL": via(db_proxy)})
    try:
        db_proxy.cut()
        refused = web.submit(f"{site.base_url}/noindex?during=outage")
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"] == "database_unavailable"
        assert 5 <= int(refused.headers["Retry-After"]) <= 15

        db_proxy.restore()
        wait_for(lambda: web.submit(f"{site.base_url}/noindex?after=outage").status_code == 202,
                 timeout=30, message="submissions to be accepted again")  # fmt: skip
        assert not Audit.objects.filter(page__url__contains="during=outage").exists()
    finally:
        web.stop()


# A kept connection (config.postgresql checks its socket) and a pooled one (psycopg_pool's
# check, which Django hands it).
@pytest.mark.parametrize("pool_size", ["0", "2"], ids=["kept", "pooled"])
def test_a_connection_is_checked_before_use_after_a_database_restart(db_proxy, pool_size):
    web = WebProcess(
        {
            **os.environ,
            "DEBUG": "true",
            "DATABASE_URL": via(db_proxy),
            "DB_POOL_MAX_SIZE": pool_size,
        }
    )
    try:
        before = httpx2.get(f"{web.url}/healthz", timeout=10)
        assert before.status_code == 200, before.text
        # Every connection the web holds dies, as in a restart or failover; then the
        # database is back before the next request.
        db_proxy.cut()
        db_proxy.restore()
        # The very first request after it gets a live connection.
        first = httpx2.get(f"{web.url}/healthz", timeout=30)
        assert first.status_code == 200, first.text
    finally:
        web.stop()


def test_the_queue_endpoint_shows_the_backlog_while_the_database_is_away(db_proxy, redis_client):
    # The backlog lives in Redis: an operator reads it most while PostgreSQL is away, when
    # the jobs waiting the outage out show as `retrying` (bench/outages.py). Only
    # `scheduled` (tonight's re-audits) is the database's; it answered 503 for want of it.
    web = WebProcess({**os.environ, "DEBUG": "true", "DATABASE_URL": via(db_proxy)})
    try:
        redis_client.lpush("audits", "a message waiting")
        db_proxy.cut()
        response = httpx2.get(f"{web.url}/api/queue", timeout=30)
        assert response.status_code == 200, response.text
        body = response.json()
        assert (body["waiting"], body["backlog"], body["scheduled"]) == (1, 1, None)
    finally:
        web.stop()
