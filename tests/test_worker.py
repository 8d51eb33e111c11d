"""Submissions over HTTP, run by real Celery workers on the real Redis: one audits worker
(four slots, fast retries), shared by the module's tests but the one that needs a lower
attempt limit, which starts its own."""

from __future__ import annotations

import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import httpx2
import pytest
from django.db import connection

from audits.models import Audit
from devstack.demo_site import DEMO_PATHS
from jobs.task import in_flight_key
from observability.metrics import TASK_RETRIES, read_counter
from tests.submitting import post_audit
from tests.workers import database_url_for_workers, module_worker, wait_for

pytestmark = pytest.mark.slow

# Four slots (the demo's pages side by side); a retry 0.2 s after a failure (x0.75-1.25).
audits_worker = module_worker("audits", concurrency=4, env={"RETRY_BACKOFF_BASE_SECONDS": "0.2"})


def read(live_server, audit: dict) -> dict:
    return httpx2.get(
        audit["links"]["self"].replace("http://testserver", live_server.url), timeout=10
    ).json()


def finished(live_server, audit: dict, timeout: float = 30.0, show=()) -> dict:
    return wait_for(
        lambda: (body := read(live_server, audit))["status"] in {"succeeded", "failed"} and body,
        timeout=timeout, message=f"audit {audit['id']} to finish", show=show,
    )  # fmt: skip


def test_a_submitted_audit_is_run_by_a_worker(live_server, site, audits_worker):
    worker = audits_worker
    audit = post_audit(live_server.url, f"{site.base_url}/redirect", expect=202).json()
    done = finished(live_server, audit, show=[worker])
    assert done["status"] == "succeeded"
    assert done["attempts"] == 1
    assert done["result"]["final_url"] == f"{site.base_url}/"
    assert [hop["status_code"] for hop in done["result"]["redirects"]] == [301, 302]
    assert done["started_at"] and done["finished_at"]


def test_a_finished_audit_leaves_no_in_flight_key(live_server, site, audits_worker, redis_client):
    # A copy of it published again (the reconciler after a Redis restart) would otherwise
    # wait for the key to lapse, up to the task's lease, before finding the row finished.
    audit = post_audit(live_server.url, f"{site.base_url}/", expect=202).json()
    assert finished(live_server, audit, show=[audits_worker])["status"] == "succeeded"
    task_id = Audit.objects.get(id=audit["id"]).task_id
    wait_for(lambda: not redis_client.exists(in_flight_key(task_id)), timeout=5,
             message="the in-flight key gone with the audit's end", show=[audits_worker])  # fmt: skip


def test_a_500_is_retried_until_the_page_recovers(live_server, site, audits_worker):
    worker = audits_worker
    audit = post_audit(
        live_server.url, f"{site.base_url}/flaky?key=worker&fail=2", expect=202
    ).json()
    seen = set()

    def succeeded():
        status = Audit.objects.get(id=audit["id"]).status
        seen.add(status)
        return status == "succeeded"

    wait_for(succeeded, timeout=30, interval=0.02, message="the flaky page to be audited")
    done = read(live_server, audit)
    assert done["attempts"] == 3, worker.output()
    assert "retrying" in seen
    assert site.flaky_counts["worker"] == 3


def test_a_4xx_page_succeeds_and_reports_it_without_retrying(live_server, site, audits_worker):
    done = finished(
        live_server, post_audit(live_server.url, f"{site.base_url}/missing", expect=202).json()
    )
    assert done["status"] == "succeeded"
    assert done["result"]["status_code"] == 404
    assert done["attempts"] == 1


def test_every_demo_page_is_audited_successfully_on_its_first_attempt(
    live_server, site, audits_worker
):
    # What `make demo` submits, through the same API, to a worker with four slots.
    worker = audits_worker
    audits = [
        post_audit(live_server.url, f"{site.base_url}{path}", expect=202).json()
        for path in DEMO_PATHS
    ]
    done = [finished(live_server, audit, timeout=60, show=[worker]) for audit in audits]
    assert [(body["status"], body["attempts"]) for body in done] == [("succeeded", 1)] * len(
        DEMO_PATHS
    ), worker.output()


def test_retries_stop_at_the_attempt_limit_and_fail_the_audit(live_server, site, start_worker):
    # A worker of its own: the attempt limit of two would fail the shared one's flaky page.
    start_worker("audits", env={"RETRY_BACKOFF_BASE_SECONDS": "0.1", "AUDIT_MAX_ATTEMPTS": "2"})
    audit = post_audit(
        live_server.url, f"{site.base_url}/flaky?key=never&fail=100", expect=202
    ).json()
    done = finished(live_server, audit)
    assert done["status"] == "failed"
    assert done["attempts"] == 2
    assert "gave up after 2 attempt(s)" in done["error"]
    # A third attempt would follow the second's failure within 0.5 s (a 0.2 s backoff at
    # most x1.25 jitter, then the delayed store's 0.25 s poll): a second is past it.
    time.sleep(1)
    assert site.flaky_counts["never"] == 2


def worker_backends(application_name: str) -> set[tuple[int, object]]:
    """The worker's PostgreSQL sessions now, as (pid, backend_start)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, backend_start FROM pg_stat_activity WHERE application_name = %s",
            [application_name],
        )
        return set(cursor.fetchall())


def sessions_after_an_audit(live_server, site, start_worker, *, concurrency: int):
    """An audits worker whose sessions carry a name of their own, after one audit: the
    worker and the sessions it then holds."""
    name = f"plumb-test-{uuid.uuid4().hex[:8]}"
    url = urlsplit(database_url_for_workers())
    query = "&".join(filter(None, [url.query, f"application_name={name}"]))
    worker = start_worker("audits", concurrency=concurrency,
                          env={"DATABASE_URL": urlunsplit(url._replace(query=query))})  # fmt: skip
    audit = post_audit(live_server.url, f"{site.base_url}/", expect=202).json()
    assert finished(live_server, audit, show=[worker])["status"] == "succeeded"
    held = wait_for(lambda: worker_backends(name), timeout=5,
                    message="a session the worker holds after its audit", show=[worker])  # fmt: skip
    return worker, name, held


@pytest.mark.skipif(connection.vendor != "postgresql", reason="reads PostgreSQL's sessions")
def test_a_worker_keeps_its_database_connections_between_audits(live_server, site, start_worker):
    # Celery's Django fixup closed them after every task: each audit connected anew.
    worker, name, held = sessions_after_an_audit(live_server, site, start_worker, concurrency=2)
    for _ in range(5):
        audit = post_audit(live_server.url, f"{site.base_url}/", expect=202).json()
        assert finished(live_server, audit, show=[worker])["status"] == "succeeded"
    # The worker's main-process threads close theirs after every tick: what is still
    # there from before the five audits is a pool thread's, kept.
    assert held & worker_backends(name)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="terminates PostgreSQL sessions")
def test_a_kept_connection_the_server_ended_is_replaced_before_the_next_audit(
    live_server, site, start_worker
):
    worker, _, held = sessions_after_an_audit(live_server, site, start_worker, concurrency=1)
    with connection.cursor() as cursor:
        for pid, _ in held:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    audit = post_audit(live_server.url, f"{site.base_url}/", expect=202).json()
    done = finished(live_server, audit, show=[worker])
    # Checked before its use (conn_health_checks), not found broken by the audit's claim,
    # which would send the audit to wait out a database outage.
    assert done["status"] == "succeeded"
    assert read_counter(TASK_RETRIES) == {}
