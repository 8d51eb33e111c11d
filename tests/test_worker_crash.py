"""A worker that dies mid-audit loses no audit."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from audits.models import Audit, Page
from audits.tasks import run_audit
from jobs.models import DeadLetter
from outbound.urls import normalize_url
from tests.reconciling import reconciled_now
from tests.submitting import submit
from tests.test_metrics import scrape
from tests.workers import wait_for

pytestmark = pytest.mark.slow

# Short enough for a test, long enough that a live worker is never redelivered to.
FAST_REDELIVERY = {"AUDITS_VISIBILITY_TIMEOUT_SECONDS": "5"}


def status_of(audit: Audit) -> str:
    return Audit.objects.get(id=audit.id).status


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_sigkilled_worker_loses_no_audit(pool, site, start_worker, redis_client):
    doomed = start_worker("audits", pool=pool, env=FAST_REDELIVERY)
    audit = submit(f"{site.base_url}/slow?delay=3")
    # Kill only once the request has reached the site: `running` is set just before the
    # fetch, and on a loaded machine a kill right after it can land before the request.
    wait_for(lambda: site.hits["/slow"] == 1, timeout=15, message="the audit's request")
    assert status_of(audit) == "running"
    # Held under the audits queue's own unacked keys, not kombu's shared default.
    assert redis_client.hlen("unacked:audits") == 1
    assert redis_client.hlen("unacked") == 0

    # `running` is recorded ~0.1 s before the request leaves: kill mid-fetch, not before it.
    wait_for(lambda: site.hits["/slow"] == 1, timeout=15, message="the fetch to start")
    doomed.kill()  # main process and pool child at once, as if the host died
    assert status_of(audit) == "running"

    survivor = start_worker("audits", pool=pool, env=FAST_REDELIVERY)
    wait_for(
        lambda: status_of(audit) == "succeeded", timeout=40, message="the audit to be redelivered"
    )
    finished = Audit.objects.get(id=audit.id)
    assert finished.attempts == 2, survivor.output()
    assert finished.result["status_code"] == 200
    assert site.hits["/slow"] == 2


def test_a_killed_pool_process_puts_its_audit_back_at_once(site, start_worker):
    worker = start_worker(
        "audits"
    )  # default visibility timeout: only the worker-lost path can help
    audit = submit(f"{site.base_url}/slow?delay=2")
    wait_for(lambda: status_of(audit) == "running", timeout=15, message="the audit to start")

    (child,) = worker.children()
    os.kill(child, signal.SIGKILL)

    wait_for(lambda: status_of(audit) == "succeeded", timeout=30, message="the audit to run again")
    assert Audit.objects.get(id=audit.id).attempts == 2, worker.output()


def test_an_audit_killed_by_its_hard_time_limit_is_dead_lettered_not_run_again(site, start_worker):
    worker = start_worker("audits")
    target = normalize_url(f"{site.base_url}/slow?delay=6")
    page = Page.objects.create(url=target.url, domain=target.domain)
    audit = Audit.objects.create(page=page, task_id=str(uuid.uuid4()))
    # Limits shorter than the fetch (the defaults are a minute and more), and the third attempt.
    run_audit.apply_async(
        args=[str(audit.id)], task_id=audit.task_id, soft_time_limit=2, time_limit=3, retries=2
    )
    wait_for(lambda: site.hits["/slow"] == 1, timeout=15, message="the fetch to start")
    # Stuck where no signal reaches it (as in C code): the soft limit cannot interrupt it,
    # and the hard limit kills it.
    (child,) = worker.children()
    os.kill(child, signal.SIGSTOP)

    wait_for(
        lambda: status_of(audit) == "failed", timeout=30, message="the audit to fail", show=[worker]
    )
    failed = Audit.objects.get(id=audit.id)
    assert "gave up after 3 attempt(s)" in failed.error and "TimeLimitExceeded" in failed.error
    letter = DeadLetter.objects.get(task_id=audit.task_id)
    assert letter.task_name == "audits.run_audit" and letter.queue == "audits"
    assert letter.attempts == 3 and letter.args == [str(audit.id)]
    assert "TimeLimitExceeded" in letter.exception
    assert scrape()[("plumb_task_dead_letters_total", (("task", "audits.run_audit"),))] == 1
    # Finished, so the reconciler leaves it alone however old it gets.
    assert reconciled_now().republished == {}
    # Run again, it would be at once: requeued as its pool process died, or retried through
    # the delayed store (0.25 s poll). A second is past both; the reconciler's path is
    # checked just above, and the visibility timeout's (minutes) is beyond any test.
    time.sleep(1)
    assert site.hits["/slow"] == 1, worker.output()


def test_under_threads_an_audit_past_its_time_limit_is_dead_lettered_not_run_again(
    site, start_worker
):
    # Celery enforces time limits only in prefork; the runtime's watchdog does it here.
    worker = start_worker("audits", pool="threads", concurrency=4)
    target = normalize_url(f"{site.base_url}/slow?delay=4")
    page = Page.objects.create(url=target.url, domain=target.domain)
    audit = Audit.objects.create(page=page, task_id=str(uuid.uuid4()))
    run_audit.apply_async(
        args=[str(audit.id)], task_id=audit.task_id, soft_time_limit=1, time_limit=2, retries=2
    )
    wait_for(
        lambda: status_of(audit) == "failed", timeout=30, message="the audit to fail", show=[worker]
    )
    failed = Audit.objects.get(id=audit.id)
    assert "gave up after 3 attempt(s)" in failed.error and "TimeLimitExceeded" in failed.error
    letter = DeadLetter.objects.get(task_id=audit.task_id)
    assert letter.attempts == 3 and "TimeLimitExceeded" in letter.exception
    assert "task.time_limit" in worker.output()
    # The worker goes on: its threads take the next audit.
    after = submit(f"{site.base_url}/")
    wait_for(lambda: status_of(after) == "succeeded", timeout=30, message="the next audit")
    assert site.hits["/slow"] == 1, worker.output()
