"""An audit accepted but left without a message is published again and runs once."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from audits import submission
from audits.models import Audit
from audits.reconcile import requeue_stuck_audits
from audits.tasks import enqueue_audit
from outbound.urls import normalize_url
from tests.workers import wait_for


def accepted_without_a_message(url: str, *, age_seconds: float) -> Audit:
    """A committed row whose publish never happened (the web process died in between)."""
    page = submission.get_or_create_page(normalize_url(url))
    audit = Audit.objects.create(page=page, task_id=str(uuid.uuid4()))
    Audit.objects.filter(id=audit.id).update(
        created_at=timezone.now() - timedelta(seconds=age_seconds)
    )
    return audit


@pytest.mark.slow
def test_a_stuck_queued_audit_is_requeued_and_runs(site, start_worker, redis_client):
    audit = accepted_without_a_message(f"{site.base_url}/noindex", age_seconds=120)
    assert redis_client.llen("audits") == 0

    assert requeue_stuck_audits(enqueue=enqueue_audit, older_than_seconds=60) == 1
    start_worker("audits")
    wait_for(
        lambda: Audit.objects.get(id=audit.id).status == "succeeded",
        timeout=30,
        message="the audit",
    )
    audit = Audit.objects.get(id=audit.id)
    assert audit.attempts == 1 and audit.requeued_at is not None
    assert site.hits["/noindex"] == 1


@pytest.mark.django_db
def test_recent_and_recently_requeued_audits_are_left_alone(redis_client):
    fresh = accepted_without_a_message("https://example.org/fresh", age_seconds=5)
    stuck = accepted_without_a_message("https://example.org/stuck", age_seconds=120)

    assert requeue_stuck_audits(enqueue=enqueue_audit, older_than_seconds=60) == 1
    assert Audit.objects.get(id=fresh.id).requeued_at is None
    # The next run within the threshold does not publish it a second time.
    assert requeue_stuck_audits(enqueue=enqueue_audit, older_than_seconds=60) == 0
    assert redis_client.llen("audits") == 1
    assert Audit.objects.get(id=stuck.id).requeued_at is not None


@pytest.mark.django_db
def test_an_attempt_running_far_past_its_time_limit_is_requeued(redis_client):
    audit = accepted_without_a_message("https://example.org/orphan", age_seconds=900)
    Audit.objects.filter(id=audit.id).update(
        status=Audit.Status.RUNNING, started_at=timezone.now() - timedelta(seconds=800)
    )
    live = accepted_without_a_message("https://example.org/live", age_seconds=900)
    Audit.objects.filter(id=live.id).update(status=Audit.Status.RUNNING, started_at=timezone.now())

    assert requeue_stuck_audits(enqueue=enqueue_audit, older_than_seconds=600) == 1
    assert Audit.objects.get(id=audit.id).requeued_at is not None
    assert Audit.objects.get(id=live.id).requeued_at is None
