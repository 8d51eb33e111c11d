"""Real workers count attempts, retries, completions and queue wait, and log each task.

The two tests that count a worker's audits share one audits worker (two slots, fast retries,
JSON logs). The attempt-limit test needs a limit of its own; the sampler and housekeeping
tests watch what a fresh worker does by itself, so each starts its own."""

from __future__ import annotations

import json

import pytest

from audits import linkcheck
from audits.models import Audit
from jobs import sweeps
from observability.collector import exposition
from observability.series import stats
from tests.submitting import submit
from tests.test_metrics import scrape
from tests.workers import module_worker, wait_for

pytestmark = pytest.mark.slow

TASK = (("task", "audits.run_audit"),)

counting_worker = module_worker(
    "audits", concurrency=2, env={"RETRY_BACKOFF_BASE_SECONDS": "0.2", "LOG_FORMAT": "json"}
)


def finished(audit: Audit, worker, timeout: float = 40) -> Audit:
    wait_for(
        lambda: Audit.objects.get(id=audit.id).is_finished, timeout=timeout,
        message=f"audit {audit.id} to finish", show=[worker],
    )  # fmt: skip
    return Audit.objects.get(id=audit.id)


def json_events(worker) -> list[dict]:
    return [json.loads(line) for line in worker.lines if line.startswith("{")]


def test_a_flaky_audit_counts_its_attempts_retries_and_one_completion(site, counting_worker):
    worker = counting_worker
    audit = finished(submit(f"{site.base_url}/flaky?key=metrics&fail=2"), worker)
    assert audit.status == "succeeded" and audit.attempts == 3

    # The postrun signal records the completion just after the row is finished.
    wait_for(
        lambda: scrape().get(("plumb_task_completions_total", TASK)) == 1,
        timeout=10, message="the completion to be counted",
    )  # fmt: skip
    samples = scrape()
    assert samples[("plumb_task_attempts_total", TASK)] == 3
    assert samples[("plumb_task_first_attempts_total", TASK)] == 1
    assert samples[("plumb_task_retries_total", (("reason", "error"), *TASK))] == 2
    assert ("plumb_task_failures_total", TASK) not in samples
    downstream = "plumb_downstream_requests_total"
    assert (
        samples[(downstream, (("key_class", "host"), ("outcome", "ok"), ("status_class", "2xx")))]
        == 1
    )
    assert (
        samples[
            (
                downstream,
                (("key_class", "host"), ("outcome", "transient_status"), ("status_class", "5xx")),
            )
        ]
        == 2
    )
    assert samples[("plumb_queue_wait_seconds_count", TASK)] == 3
    assert samples[("plumb_audit_duration_seconds_count", (("outcome", "retried"),))] == 2
    assert samples[("plumb_audit_duration_seconds_count", (("outcome", "succeeded"),))] == 1

    hour = stats("1h")["totals"]
    assert (hour["completions"], hour["retry_attempts"], hour["first_attempts"]) == (1, 2, 1)
    # The page's three attempts, and its host's robots.txt read once for the findings.
    assert (hour["downstream_requests"], hour["unique_jobs"], hour["amplification"]) == (4, 1, 4.0)

    events = json_events(worker)
    started = [e for e in events if e["event"] == "task.started"]
    assert [e["attempt"] for e in started] == [1, 2, 3]
    assert {e["task_id"] for e in started} == {audit.task_id}
    assert all(e["queue_wait_seconds"] is not None for e in started)
    retries = [e for e in events if e["event"] == "task.retry"]
    assert len(retries) == 2 and all(e["delay_seconds"] > 0 and e["reason"] for e in retries)
    # Queue wait counts from when a retry became due, not from when it was published:
    # the retry delays (at least 0.75 + 1.5 s) are not in it.
    delays = sum(e["delay_seconds"] for e in retries)
    assert samples[("plumb_queue_wait_seconds_sum", TASK)] < delays / 2
    assert [e["state"] for e in events if e["event"] == "task.finished"] == [
        "RETRY", "RETRY", "SUCCESS",
    ]  # fmt: skip


def test_ten_audits_of_pages_without_links_are_ten_jobs_ten_requests_and_one_robots_txt(
    site, counting_worker, admin_client
):
    worker = counting_worker
    audits = [submit(f"{site.base_url}/noindex?n={n}") for n in range(10)]
    for audit in audits:
        assert finished(audit, worker).status == "succeeded"
    wait_for(
        lambda: scrape().get(("plumb_task_completions_total", TASK)) == 10,
        timeout=10, message="ten completions",
    )  # fmt: skip

    # One request a page, and the host's robots.txt read once for all ten (the robots-txt
    # and is-crawlable findings: once per host per ROBOTS_FRESH_SECONDS).
    assert site.hits["/robots.txt"] == 1
    # /api/stats (and the dashboard, which draws the same numbers).
    totals = admin_client.get("/api/stats").json()["totals"]
    assert (totals["unique_jobs"], totals["downstream_requests"]) == (10, 11)
    assert (totals["completions"], totals["amplification"]) == (10, 1.1)
    dashboard = admin_client.get("/dashboard/").content.decode()
    assert '<b data-total="amplification">1.1×</b>' in dashboard
    assert '<b data-total="completions">10</b>' in dashboard
    # The README's PromQL: downstream requests over first attempts (one per job).
    samples = scrape()
    requests = sum(
        v for (name, _), v in samples.items() if name == "plumb_downstream_requests_total"
    )
    first_attempts = sum(
        v for (name, _), v in samples.items() if name == "plumb_task_first_attempts_total"
    )
    assert (requests, first_attempts) == (11, 10)
    assert round(requests / first_attempts, 2) == 1.10


def test_an_audit_out_of_attempts_counts_a_failure_not_a_completion(site, start_worker):
    # A worker of its own: the shared one's attempt limit (5) would not fail the audit at 2.
    worker = start_worker(
        "audits", env={"RETRY_BACKOFF_BASE_SECONDS": "0.1", "AUDIT_MAX_ATTEMPTS": "2"}
    )
    audit = finished(submit(f"{site.base_url}/flaky?key=doomed&fail=100"), worker)
    assert audit.status == "failed"
    wait_for(
        lambda: scrape().get(("plumb_task_failures_total", TASK)) == 1,
        timeout=10, message="the failure to be counted",
    )  # fmt: skip
    samples = scrape()
    assert samples[("plumb_task_attempts_total", TASK)] == 2
    assert samples[("plumb_task_retries_total", (("reason", "error"), *TASK))] == 1
    assert ("plumb_task_completions_total", TASK) not in samples
    assert stats("1h")["totals"]["failures"] == 1


def test_a_worker_samples_the_backlog_once_a_minute(site, start_worker, redis_client):
    start_worker("audits")
    # The sampler takes the minute's sample as the worker becomes ready.
    wait_for(
        lambda: any(v is not None for v in stats("1h")["series"]["backlog"]["waiting"]),
        timeout=15, message="a backlog sample",
    )  # fmt: skip
    assert b"plumb_queue_backlog" in exposition()


def product_totals() -> dict:
    return stats("1h")["totals"]


def test_housekeeping_is_not_counted_and_an_idle_stack_shows_no_jobs(start_worker, redis_client):
    worker = start_worker("audits")
    # The periodic sweeps run (their lock taken), with nothing to do.
    wait_for(
        lambda: redis_client.exists(f"{sweeps.LOCK_PREFIX}{linkcheck.DEADLINE_SWEEP.name}"),
        timeout=20, message="the link-check deadline sweep runs", show=[worker],
    )  # fmt: skip
    totals = product_totals()
    assert (totals["completions"], totals["unique_jobs"], totals["first_attempts"]) == (0, 0, 0)
    samples = scrape()
    assert not [key for key in samples if key[0] == "plumb_task_attempts_total"]
