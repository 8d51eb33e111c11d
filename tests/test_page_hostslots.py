"""Page fetches hold per-host slots across every worker, and a busy host waits outside its thread."""

from __future__ import annotations

import pytest
from django.conf import settings

from audits import submission
from audits.models import Audit
from outbound.urls import normalize_url
from tests.fake_github import LinkedPage
from tests.workers import wait_for

pytestmark = pytest.mark.slow


def unfinished(audits: list[Audit]) -> int:
    return (
        Audit.objects.filter(id__in=[a.id for a in audits])
        .exclude(status__in=Audit.FINISHED)
        .count()
    )


def test_a_slow_hosts_backlog_neither_exceeds_its_slots_nor_holds_up_other_hosts(
    start_worker, redis_client, http_server
):
    slow = http_server(LinkedPage(delay=2.0))  # every page answers after two seconds
    fast = http_server(LinkedPage(delay=0))
    # make run's audits worker: one process of 32 threads.
    worker = start_worker(
        "audits",
        pool=settings.AUDITS_WORKER_POOL,
        concurrency=settings.AUDITS_WORKER_CONCURRENCY,
        env={
            "DELAYED_POLL_INTERVAL_SECONDS": "0.2",
            "PAGE_FETCH_PER_HOST_CONCURRENCY": "8",
            "PAGE_FETCH_WARMUP_RATE": "2",  # both hosts start cold, slowly
        },
    )
    slow_audits = [
        submission.submit_audit(normalize_url(f"{slow.url}/page/{n}")) for n in range(64)
    ]
    fast_audits = [
        submission.submit_audit(normalize_url(f"{fast.url}/page/{n}")) for n in range(10)
    ]
    wait_for(
        lambda: unfinished(fast_audits) == 0, timeout=60,
        message="the fast host's audits", show=[worker],
    )  # fmt: skip
    # Behind the slow host's queue, the fast audits would have waited for a thread
    # until at least 32 slow pages (two seconds each, 32 at a time) were done; beside
    # it, they finish while the slow host answers 8 every two seconds.
    assert unfinished(slow_audits) >= 40, worker.output()
    wait_for(
        lambda: unfinished(slow_audits) == 0, timeout=120,
        message="the slow host's audits", show=[worker],
    )  # fmt: skip
    assert Audit.objects.filter(status=Audit.Status.SUCCEEDED).count() == 74
    assert slow.max_in_flight == 8
    assert len(slow.arrivals) == 64  # a busy host defers the audit before any request
