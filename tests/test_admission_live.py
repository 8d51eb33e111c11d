"""Admission under concurrent submissions and in a fail-fast outage, over real HTTP,
with real Redis and a real `celery worker`: the module's shared audits worker (two slots,
retries 1.5-2.5 s after a failure), which the one test that needs a worker asks for."""

from __future__ import annotations

import threading
import time

import httpx2
import pytest

from audits import submission
from audits.admission import admission_counts
from audits.models import Audit
from jobs.backlog import backlog_snapshot
from tests.workers import module_worker

pytestmark = pytest.mark.slow

WORKER_SLOTS = 2
two_slot_worker = module_worker(
    "audits", concurrency=WORKER_SLOTS, env={"RETRY_BACKOFF_BASE_SECONDS": "2"}
)


def burst(live_server, urls_per_client: list[list[str]]) -> list[int]:
    """Each client (one connection, one request at a time) posts its URLs; all start together."""
    statuses: list[int] = []
    start = threading.Barrier(len(urls_per_client))

    def client(urls):
        with httpx2.Client(base_url=live_server.url, timeout=30) as http:
            start.wait()
            for url in urls:
                statuses.append(http.post("/api/audits", json={"url": url}).status_code)

    threads = [threading.Thread(target=client, args=(urls,)) for urls in urls_per_client]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(statuses) <= {202, 503}, statuses
    return statuses


def test_concurrent_submissions_overshoot_the_cap_by_at_most_the_handlers_minus_one(
    live_server, settings, monkeypatch, redis_client
):
    max_depth, handlers = 5, 4
    settings.AUDIT_QUEUE_MAX_DEPTH = max_depth
    settings.AUDIT_SUBMIT_BURST = 1000
    # Every client here is 127.0.0.1, and this is the cap's test: no share binds.
    settings.AUDIT_CLIENT_MAX_SHARE = 100
    # Widen the window between the admission check and the enqueue (on commit), so
    # the worst case is likely: every handler checks before any has enqueued.
    submit_audit = submission.submit_audit

    def slow_submit(target, **options):
        time.sleep(0.3)
        return submit_audit(target, **options)

    monkeypatch.setattr(submission, "submit_audit", slow_submit)
    urls = [[f"https://example.org/{c}/{n}" for n in range(10)] for c in range(handlers)]

    admitted = burst(live_server, urls).count(202)

    # With no worker, nothing leaves the queue: everything admitted is waiting.
    assert redis_client.llen(settings.AUDIT_QUEUE) == admitted == Audit.objects.count()
    assert max_depth <= admitted <= max_depth + handlers - 1


def test_a_fail_fast_outage_admits_no_more_than_the_cap_plus_the_bounded_overshoot(
    live_server, site, two_slot_worker, settings, caplog
):
    max_depth, handlers, worker_slots = 6, 4, WORKER_SLOTS
    settings.AUDIT_QUEUE_MAX_DEPTH = max_depth
    settings.AUDIT_SUBMIT_BURST = 1000
    # Every client here is 127.0.0.1, and this is the cap's test: no share binds.
    settings.AUDIT_CLIENT_MAX_SHARE = 100
    caplog.set_level("INFO", logger="observability.metrics")
    # Every attempt fails at once (500), then waits 1.5-2.5 s, 3-5 s, 6-10 s, 12-20 s:
    # no audit is finished for good while this test submits (the worker's 2 s backoff base).

    def failing(name: str) -> str:
        return f"{site.base_url}/flaky?key={name}&fail=1000"

    # Fill the queue to the cap, one submission at a time.
    admitted = burst(live_server, [[failing(f"fill-{n}") for n in range(max_depth + 4)]]).count(202)
    assert backlog_snapshot(settings.AUDIT_QUEUE).backlog >= max_depth - worker_slots
    # Then a burst from several clients at once.
    urls = [[failing(f"burst-{c}-{n}") for n in range(10)] for c in range(handlers)]
    admitted += burst(live_server, urls).count(202)

    assert not Audit.objects.filter(status__in=Audit.FINISHED).exists()  # the premise held
    # Running attempts are not backlog, so each worker slot lets one more in; a message
    # the worker has popped off the list but not yet recorded in `unacked` is in
    # neither place (one per worker, for a moment); the check-then-act window adds at
    # most handlers - 1.
    assert admitted <= max_depth + worker_slots + 1 + handlers - 1
    assert Audit.objects.count() == admitted
    # The audits were in backoff, held by the worker, and the lists nearly empty: a
    # count of waiting messages alone would have admitted these refusals.
    refusals = [r for r in caplog.records if r.getMessage() == "admission.refused"]
    assert any(r.waiting < max_depth for r in refusals)
    counts = admission_counts()
    assert counts["refused_backlog"] == len(refusals)
    assert counts["refused_backlog_in_backoff"] == len([r for r in refusals if r.retrying]) > 0
