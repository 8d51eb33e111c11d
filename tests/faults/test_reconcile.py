"""The one reconciler (jobs.reconcile): what PostgreSQL says is owed and Redis lost is
published again, once, and at its own due time."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from audits import submission
from audits.models import AUDIT_JOB, Audit, LinkCheck, SharedLink
from jobs import delayed, lifecycle, reconcile
from jobs import task as task_module
from jobs.models import ReconcileMark
from outbound.urls import normalize_url
from tests.broker import queued
from tests.reconciling import reconciled_now
from tests.test_metrics import scrape
from tests.webhook_helpers import finished_audit_with_callback
from tests.workers import wait_for
from webhooks import deliver
from webhooks.models import DELIVERY_JOB, Delivery


def accepted_without_a_message(url: str, *, age_seconds: float) -> Audit:
    """A committed row whose publish never happened (the web process died in between)."""
    page = submission.get_or_create_page(normalize_url(url))
    audit = Audit.objects.create(page=page, task_id=str(uuid.uuid4()))
    created = timezone.now() - timedelta(seconds=age_seconds)
    Audit.objects.filter(id=audit.id).update(created_at=created, published_at=created)
    return Audit.objects.get(id=audit.id)


def published_again(audit: Audit) -> bool:
    """The reconciler published its message again since the row was made."""
    return Audit.objects.get(id=audit.id).published_at > audit.published_at


def retrying(audit: Audit, *, due_in: float) -> Audit:
    Audit.objects.filter(id=audit.id).update(
        status=Audit.Status.RETRYING, attempts=2,
        next_attempt_at=timezone.now() + timedelta(seconds=due_in),
    )  # fmt: skip
    return Audit.objects.get(id=audit.id)


# --- One lost message, Redis otherwise intact: found by age -----------------------------


@pytest.mark.slow
def test_a_stuck_queued_audit_is_requeued_and_runs(site, start_worker, redis_client):
    audit = accepted_without_a_message(f"{site.base_url}/noindex", age_seconds=120)
    assert redis_client.llen("audits") == 0

    assert reconciled_now(overdue_after=60).republished == {"audits": 1}
    start_worker("audits")
    wait_for(
        lambda: Audit.objects.get(id=audit.id).status == "succeeded",
        timeout=30,
        message="the audit",
    )
    assert published_again(audit)
    assert Audit.objects.get(id=audit.id).attempts == 1
    assert site.hits["/noindex"] == 1


@pytest.mark.django_db
def test_recent_and_recently_requeued_audits_are_left_alone(redis_client):
    fresh = accepted_without_a_message("https://example.org/fresh", age_seconds=5)
    stuck = accepted_without_a_message("https://example.org/stuck", age_seconds=120)

    assert reconciled_now(overdue_after=60).republished == {"audits": 1}
    assert not published_again(fresh)
    # The next run within the threshold does not publish it a second time.
    assert reconciled_now(overdue_after=60).republished == {}
    assert redis_client.llen("audits") == 1
    assert published_again(stuck)


@pytest.mark.django_db
def test_an_attempt_running_far_past_its_deadline_is_requeued(redis_client):
    # Dead after its deadline's lease (100 s by default), then owed RECONCILE_AFTER_SECONDS.
    dead_after = AUDIT_JOB.deadline.dead_after
    audit = accepted_without_a_message("https://example.org/orphan", age_seconds=900)
    Audit.objects.filter(id=audit.id).update(
        status=Audit.Status.RUNNING,
        attempt_started_at=timezone.now() - timedelta(seconds=600 + dead_after + 5),
    )
    live = accepted_without_a_message("https://example.org/live", age_seconds=900)
    Audit.objects.filter(id=live.id).update(
        status=Audit.Status.RUNNING,
        attempt_started_at=timezone.now() - timedelta(seconds=600 + dead_after - 30),
    )

    assert reconciled_now(overdue_after=600).republished == {"audits": 1}
    assert published_again(audit)
    assert not published_again(live)


@pytest.mark.django_db
def test_a_wait_long_past_due_is_published_again_at_once_keeping_its_attempts(redis_client):
    overdue = retrying(accepted_without_a_message("https://example.org/a", age_seconds=900),
                       due_in=-700)  # fmt: skip
    retrying(accepted_without_a_message("https://example.org/b", age_seconds=900), due_in=-5)

    assert reconciled_now(overdue_after=600).republished == {"audits": 1}
    (message,) = queued(redis_client, "audits")
    assert message.id == overdue.task_id
    # The attempts its row counted: a recovered audit does not get a fresh budget.
    assert redis_client.lrange("audits", 0, -1)[0].count(b'"retries": 2') == 1


# --- A copy of a job that was not lost ------------------------------------------------------


@pytest.mark.slow
def test_a_copy_of_an_audit_in_flight_waits_for_it_and_never_runs_it_twice(
    site, start_worker, redis_client, transactional_db
):
    # After a Redis restart that kept its data, the reconciler cannot tell which messages
    # survived and publishes every recent row again: a copy that met its original in
    # flight claimed the running row again, counted a second attempt and fetched the page
    # a second time (bench/outages.py, redis-20s-kept: 14 of 60 audits).
    worker = start_worker("audits", concurrency=2, pool="threads")
    audit = submission.submit_audit(normalize_url(f"{site.base_url}/slow?delay=3"))
    wait_for(lambda: site.hits["/slow"] == 1, timeout=30, message="the audit's fetch")
    row = Audit.objects.get(id=audit.id)
    assert reconcile.publish_owed(
        AUDIT_JOB.task, args=[str(audit.id)], task_id=row.task_id, queue=AUDIT_JOB.queue,
        retries=row.attempts,
    )  # fmt: skip

    def settled() -> bool:
        # The copy ran after the original and found it finished, or ran beside it.
        done = Audit.objects.get(id=audit.id).status == "succeeded"
        return done and ("audit.skipped" in worker.output() or site.hits["/slow"] > 1)

    wait_for(settled, timeout=60, message="the audit and its copy")
    assert (Audit.objects.get(id=audit.id).attempts, site.hits["/slow"]) == (1, 1)
    assert "task.duplicate_in_flight" in worker.output()


@pytest.mark.slow
def test_an_in_flight_key_no_live_run_holds_is_taken_over(
    site, start_worker, redis_client, transactional_db
):
    # A run that ended while Redis was away could not delete its key; its copy waited out
    # the whole lapse (bench/outages.py, redis-20s-kept: the last success 95 s after the
    # return). A key that old, its row not in an attempt, has no live run behind it.
    audit = submission.submit_audit(normalize_url(f"{site.base_url}/noindex?stale=key"))
    task_id = Audit.objects.get(id=audit.id).task_id
    lapse = min(AUDIT_JOB.deadline.lease, settings.QUEUE_VISIBILITY_TIMEOUTS[AUDIT_JOB.queue])
    age = task_module.STALE_FLIGHT_SECONDS + 1
    redis_client.set(task_module.in_flight_key(task_id), "a run gone", px=int((lapse - age) * 1000))

    start_worker("audits")
    wait_for(lambda: Audit.objects.get(id=audit.id).status == "succeeded", timeout=30,
             message="the audit, well before the key lapses")  # fmt: skip
    assert Audit.objects.get(id=audit.id).attempts == 1


# --- Redis came back empty, or behind ----------------------------------------------------


@pytest.mark.django_db
def test_a_first_tick_on_a_new_redis_publishes_nothing_and_leaves_its_mark(redis_client):
    accepted_without_a_message("https://example.org/new", age_seconds=5)
    client = redis_client

    result = reconcile.reconcile(client=client)

    assert (result.redis_lost, result.republished) == (False, {})
    assert client.get(reconcile.MARK_KEY) is not None and ReconcileMark.objects.exists()
    assert reconcile.reconcile(client=client).redis_lost is False


@pytest.mark.django_db
def test_after_redis_came_back_empty_everything_owed_goes_back_each_at_its_due_time(
    redis_client,
):
    queued_audit = accepted_without_a_message("https://example.org/q", age_seconds=1)
    waiting = retrying(accepted_without_a_message("https://example.org/w", age_seconds=1),
                       due_in=300)  # fmt: skip
    in_flight = accepted_without_a_message("https://example.org/r", age_seconds=1)
    Audit.objects.filter(id=in_flight.id).update(status=Audit.Status.RUNNING,
                                                 attempt_started_at=timezone.now(), attempts=1)  # fmt: skip
    done = accepted_without_a_message("https://example.org/done", age_seconds=1)
    Audit.objects.filter(id=done.id).update(status=Audit.Status.SUCCEEDED)
    checking = accepted_without_a_message("https://example.org/c", age_seconds=1)
    Audit.objects.filter(id=checking.id).update(status=Audit.Status.CHECKING_LINKS)
    # The audit waits on one distinct link whose check (claimed as "check-1") is in flight.
    link = SharedLink.objects.create(
        url="https://x.test/", check_status=SharedLink.CheckStatus.QUEUED, task_id="check-1"
    )
    LinkCheck.objects.create(audit=checking, url=link.url, link=link)
    pending, _ = deliver.create_delivery(
        finished_audit_with_callback("https://r.test/", number=1).id
    )
    backing_off, _ = deliver.create_delivery(
        finished_audit_with_callback("https://r.test/", number=2).id
    )
    DELIVERY_JOB.wait(backing_off.id, seconds=120, attempt_spent=True)
    Delivery.objects.filter(id=backing_off.id).update(attempts=3)

    result = reconciled_now(redis_lost=True)

    assert result.redis_lost
    assert result.republished == {"audits": 3, "link_checks": 1, "webhook_deliveries": 2}
    # Counted per source, as the dashboard and the runbook read it.
    assert {
        dict(labels)["source"]: value
        for (name, labels), value in scrape().items()
        if name == "plumb_jobs_republished_total"
    } == {"audits": 3, "link_checks": 1, "webhook_deliveries": 2}
    # Owed now: in their queues at once.
    assert {m.id for m in queued(redis_client, "audits")} == {queued_audit.task_id, "check-1"}
    assert [m.id for m in queued(redis_client, "webhooks")] == [pending.task_id]
    # Owed later: back in the delayed store, due when they were, with their attempts.
    stored = {entry.task_id: (entry, due) for entry, due in
              delayed.entries("audits") + delayed.entries("webhooks")}  # fmt: skip
    assert set(stored) == {waiting.task_id, backing_off.task_id, in_flight.task_id}
    # One running may have lost its worker with Redis: a copy once its attempt is surely over.
    entry, due = stored[in_flight.task_id]
    started = Audit.objects.get(id=in_flight.id).attempt_started_at.timestamp()
    assert entry.retries == 1
    assert due == pytest.approx(started + AUDIT_JOB.deadline.dead_after, abs=2)
    entry, due = stored[waiting.task_id]
    assert entry.retries == 2 and due == pytest.approx(waiting.next_attempt_at.timestamp(), abs=2)
    entry, due = stored[backing_off.task_id]
    assert entry.retries == 3
    assert due == pytest.approx(Delivery.objects.get(id=backing_off.id).next_attempt_at.timestamp(),
                                abs=2)  # fmt: skip
    # The mark is back: the next tick finds nothing lost and nothing overdue.
    assert reconcile.reconcile(client=redis_client, overdue_after=600).republished == {}


@pytest.mark.django_db
def test_after_a_failover_only_what_was_written_since_the_replica_s_mark_goes_back(redis_client):
    old = accepted_without_a_message("https://example.org/old", age_seconds=600)
    recent = accepted_without_a_message("https://example.org/recent", age_seconds=5)
    reconcile.write_mark(redis_client, at=timezone.now())
    # The replica holds a mark from two minutes ago, left by another server.
    redis_client.set(reconcile.MARK_KEY, reconcile.json.dumps(
        {"server": "the-old-primary", "at": (timezone.now() - timedelta(seconds=120)).timestamp()}
    ))  # fmt: skip

    result = reconcile.reconcile(client=redis_client)

    assert result.redis_lost and result.republished == {"audits": 1}
    assert [m.id for m in queued(redis_client, "audits")] == [recent.task_id]
    assert not published_again(old)


@pytest.mark.django_db
def test_after_a_loss_one_tick_publishes_everything_owed_by_age_a_batch_a_tick(
    redis_client, monkeypatch
):
    monkeypatch.setattr(lifecycle, "BATCH", 2)
    for n in range(5):
        accepted_without_a_message(f"https://example.org/{n}", age_seconds=900)

    # Redis forgot: the tick is not done until all five are out (its mark says so).
    assert reconciled_now(redis_lost=True).republished == {"audits": 5}
    redis_client.delete("audits")
    Audit.objects.update(published_at=timezone.now() - timedelta(seconds=900))
    # Lost one by one, Redis intact: two a tick, each tick going on from the last.
    counts = [reconciled_now(overdue_after=600).republished.get("audits", 0) for _ in range(4)]
    assert counts == [2, 2, 1, 0]
    assert len(queued(redis_client, "audits")) == 5


@pytest.mark.django_db
def test_one_worker_a_tick_does_the_work(redis_client, settings):
    settings.RECONCILE_INTERVAL_SECONDS = 0.3
    assert reconcile.tick(redis_client) is not None
    # Another worker's thread, in the same interval: the lock says it is done.
    assert reconcile.tick(redis_client) is None
    # The next interval: a tick again.
    wait_for(lambda: reconcile.tick(redis_client) is not None, timeout=5, message="a next tick")
