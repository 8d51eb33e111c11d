"""What the backlog counts, against real Redis and real `celery worker` processes.

Every kind of wait an audit can be in is owed a worker slot and counted: a short retry
countdown, a long retry, a breaker park, a rate-limit deferral, a busy host. Work
scheduled hours ahead on the `reaudit` queue is not.

The tests that need no setting of their own share one audits worker (one slot, retries
1.5-2.5 s after a failure); the one that leaves an audit running when it ends comes last
of them, so the harness ends that worker before the next test. The others start their
own: a retry backoff, concurrency or pool of their own, or the `reaudit` queue.
"""

from __future__ import annotations

import time

import pytest
from django.conf import settings

from audits.models import Audit
from audits.tasks import run_audit
from jobs import delayed
from jobs.backlog import BacklogSnapshot
from jobs.backlog import backlog_snapshot as queue_snapshot
from jobs.breakers import FAILURE, Breaker
from outbound.urls import origin_key
from tests.fake_github import LinkedPage
from tests.submitting import submit
from tests.workers import module_worker, reaudit_as_make_run, wait_for

pytestmark = pytest.mark.slow

one_slot_worker = module_worker("audits", env={"RETRY_BACKOFF_BASE_SECONDS": "2"})


def backlog_snapshot() -> BacklogSnapshot:
    return queue_snapshot(settings.AUDIT_QUEUE)


def stored_waits() -> list[str]:
    return sorted(entry.wait for entry, _due in delayed.entries(settings.AUDIT_QUEUE))


def status_of(audit: Audit) -> str:
    return Audit.objects.get(id=audit.id).status


def snapshot_becomes(expected: BacklogSnapshot, *, timeout: float = 20) -> None:
    seen = []

    def matches():
        seen.append(backlog_snapshot())
        return seen[-1] == expected

    try:
        wait_for(matches, timeout=timeout, interval=0.05, message=f"backlog {expected}")
    except AssertionError:
        raise AssertionError(f"last snapshots: {seen[-5:]}") from None


def test_it_counts_an_audit_in_retry_backoff(site, start_worker, redis_client):
    # The first retry waits 7.5-12.5 s: long enough to look at it inside its backoff.
    start_worker("audits", env={"RETRY_BACKOFF_BASE_SECONDS": "10"})
    audit = submit(f"{site.base_url}/flaky?key=backoff&fail=100")

    wait_for(lambda: status_of(audit) == "retrying", timeout=20, message="the first failure")
    snapshot_becomes(BacklogSnapshot(waiting=0, retrying=1, running=0))
    # The worker holds the retry's ETA message: the queue's list does not see it.
    assert redis_client.llen(settings.AUDIT_QUEUE) == 0
    assert backlog_snapshot().backlog == 1


def test_work_scheduled_hours_ahead_on_the_reaudit_queue_is_not_counted(start_worker, redis_client):
    start_worker("reaudit", **reaudit_as_make_run())
    three_hours = 3 * 3600
    run_audit.apply_async(
        args=["6f1f5b8e-0000-4000-8000-000000000000"],
        queue=settings.REAUDIT_QUEUE,
        countdown=three_hours,
    )
    # The reaudit worker takes it off its list and holds it until its ETA.
    wait_for(
        lambda: redis_client.hlen("unacked:reaudit") == 1,
        timeout=20,
        message="the reaudit worker to hold the placement",
    )
    # Run at once instead of at its ETA, or handed back to a list, it would show within
    # the worker's receipt of it (no timer between): half a second after is past that.
    time.sleep(0.5)
    assert backlog_snapshot() == BacklogSnapshot(waiting=0, retrying=0, running=0)


def test_a_retry_queued_behind_waiting_work_is_counted_once(site, start_worker):
    # One slot, busy: the failed audit's retry is published behind the waiting
    # audits and stays on the list, past its due time, until the slot frees. It is
    # owed one slot and counted once, as waiting (a registry of audits in backoff
    # would count it a second time here).
    start_worker("audits", concurrency=1, env={"RETRY_BACKOFF_BASE_SECONDS": "0.2"})
    first = submit(f"{site.base_url}/slow?delay=2")
    wait_for(lambda: status_of(first) == "running", timeout=20, message="the first audit")
    failing = submit(f"{site.base_url}/flaky?key=behind&fail=1")
    behind = [submit(f"{site.base_url}/slow?delay=3&n={n}") for n in range(2)]

    wait_for(lambda: status_of(behind[0]) == "running", timeout=20, message="the next audit")
    assert status_of(failing) == "retrying"
    snapshot_becomes(BacklogSnapshot(waiting=2, retrying=0, running=1))


def test_a_due_retry_moves_from_retrying_to_running_without_being_counted_twice(
    site, one_slot_worker
):
    audit = submit(f"{site.base_url}/flaky?key=due&fail=1&delay=3")

    snapshot_becomes(BacklogSnapshot(waiting=0, retrying=1, running=0))
    # The retry comes due (1.5-2.5 s), is picked up and runs for 3 s: counted as
    # running, and no longer as backlog.
    snapshot_becomes(BacklogSnapshot(waiting=0, retrying=0, running=1))
    wait_for(lambda: status_of(audit) == "succeeded", timeout=20, message="the retry to succeed")
    snapshot_becomes(BacklogSnapshot(waiting=0, retrying=0, running=0))
    assert Audit.objects.get(id=audit.id).attempts == 2


def test_it_counts_a_retry_too_long_to_hold_as_a_countdown(site, one_slot_worker, redis_client):
    audit = submit(f"{site.base_url}/busy?key=long&fail=5&retry_after=900")

    wait_for(lambda: stored_waits() == ["retry"], timeout=20, message="the stored retry")
    snapshot_becomes(BacklogSnapshot(waiting=0, retrying=1, running=0))
    assert status_of(audit) == "retrying"
    # Nothing of it in the broker: the worker holds no ETA message for it.
    assert redis_client.hlen("unacked:audits") == 0


def test_it_counts_audits_parked_by_an_open_breaker(site, one_slot_worker, settings, redis_client):
    settings.BREAKER_MIN_CALLS, settings.BREAKER_OPEN_SECONDS = 2, 600
    breaker = Breaker("audits.run_audit", origin_key(site.base_url))
    for _ in range(2):
        breaker.record(breaker.acquire(), FAILURE)
    audits = [submit(f"{site.base_url}/noindex?n={n}") for n in range(2)]

    wait_for(lambda: stored_waits() == ["park", "park"], timeout=20, message="two parks")
    snapshot_becomes(BacklogSnapshot(waiting=0, retrying=2, running=0))
    assert [status_of(audit) for audit in audits] == ["retrying", "retrying"]
    assert site.hits["/noindex"] == 0


def test_it_counts_audits_deferred_by_a_rate_limit_of_fifteen_minutes(
    site, one_slot_worker, client, redis_client
):
    # The first answer says 429, Retry-After: 900; admission then holds the host's others.
    audits = [
        submit(f"{site.base_url}/busy?key=limited&fail=3&status=429&retry_after=900&n={n}")
        for n in range(3)
    ]

    wait_for(lambda: len(stored_waits()) == 3, timeout=20, message="three stored waits")
    assert stored_waits() == ["deferral"] * 3
    snapshot_becomes(BacklogSnapshot(waiting=0, retrying=3, running=0))
    assert [status_of(audit) for audit in audits] == ["retrying"] * 3
    body = client.get("/api/queue").json()
    assert (body["backlog"], body["retrying"]) == (3, 3)
    # Each waits the whole 15 minutes (plus jitter), on Redis's clock.
    now = time.time()
    assert all(due - now > 890 for _entry, due in delayed.entries(settings.AUDIT_QUEUE))


def test_a_running_audit_is_not_counted_and_a_waiting_one_is(site, one_slot_worker):
    # Last of the shared worker's tests: it ends with an audit running and one waiting.
    running = submit(f"{site.base_url}/slow?delay=4")
    wait_for(lambda: status_of(running) == "running", timeout=20, message="the audit to start")
    submit(f"{site.base_url}/slow?delay=0")

    snapshot_becomes(BacklogSnapshot(waiting=1, retrying=0, running=1))
    assert backlog_snapshot().backlog == 1


def test_it_counts_a_link_check_waiting_for_a_busy_host(start_worker, redis_client, http_server):
    slow = http_server(LinkedPage(delay=3.0))
    page = http_server(LinkedPage([f"{slow.url}/target/{n}" for n in range(2)]))
    start_worker(
        "audits",
        concurrency=2,
        env={"LINKCHECK_PER_HOST_CONCURRENCY": "1", "RATELIMIT_INLINE_MAX_WAIT_SECONDS": "0"},
    )
    audit = submit(f"{page.url}/")
    # One check holds the host's only slot for 3 s; the other waits in the store.
    wait_for(lambda: stored_waits() == ["deferral"], timeout=20, message="the busy host")
    snapshot_becomes(BacklogSnapshot(waiting=0, retrying=1, running=1))
    wait_for(lambda: status_of(audit) == "succeeded", timeout=60, message="both checks to finish")
    snapshot_becomes(BacklogSnapshot(waiting=0, retrying=0, running=0))


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_the_running_count_is_exact_under_each_pool(pool, site, start_worker):
    start_worker("audits", concurrency=2, pool=pool)
    slow = [submit(f"{site.base_url}/slow?delay=4&n={n}") for n in range(3)]
    # Two run, one waits for a slot: counted as running and as waiting, never as both.
    snapshot_becomes(BacklogSnapshot(waiting=1, retrying=0, running=2))
    for audit in slow:
        wait_for(lambda a=audit: status_of(a) == "succeeded", timeout=30, message="success")
    snapshot_becomes(BacklogSnapshot(waiting=0, retrying=0, running=0))
