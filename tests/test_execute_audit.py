"""The audit's plain function: called directly, against the database and a local site."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from audits import linkcheck, services, submission
from audits.models import AUDIT_JOB, Audit
from jobs.errors import RateLimited, Transient
from outbound.client import admission_key_for_url
from outbound.urls import normalize_url
from ratelimit.observations import Kind, Observation, record

pytestmark = pytest.mark.django_db


def make_audit(url: str) -> Audit:
    page = submission.get_or_create_page(normalize_url(url))
    return Audit.objects.create(page=page, task_id="t-1")


def test_a_finished_audit_stores_its_result(site, redis_client):
    audit = make_audit(f"{site.base_url}/redirect")
    (queued,) = services.execute_audit(str(audit.id))
    audit.refresh_from_db()
    # The page links out: the audit waits for its link check, run here directly.
    assert audit.status == Audit.Status.CHECKING_LINKS
    (check,) = audit.link_checks.all()
    linkcheck.run_shared_check(queued.shared_link_id, queued.task_id)
    audit.refresh_from_db()
    assert audit.status == Audit.Status.SUCCEEDED
    assert audit.result["links"] == [{"url": check.url, "status": "ok", "status_code": 200}]
    assert audit.attempts == 1
    assert audit.attempt_started_at and audit.finished_at
    assert audit.result["final_url"] == f"{site.base_url}/"


def test_a_transient_error_leaves_the_audit_for_the_retry(site):
    audit = make_audit(f"{site.base_url}/flaky?key=direct&fail=5")
    with pytest.raises(Transient, match="answered 500"):
        services.execute_audit(str(audit.id))
    audit.refresh_from_db()
    assert audit.status == Audit.Status.RUNNING
    AUDIT_JOB.wait(audit.id, seconds=30, attempt_spent=True, error="attempt 1 failed")
    audit.refresh_from_db()
    assert audit.status == Audit.Status.RETRYING
    # The wait lives in Redis; the row says when it is due, for the reconciler.
    assert audit.next_attempt_at > timezone.now() + timedelta(seconds=25)


def test_a_permanent_error_fails_the_audit_with_the_reason(site, settings):
    settings.AUDIT_ALLOW_PRIVATE_TARGETS = False
    audit = make_audit(f"{site.base_url}/")
    services.execute_audit(str(audit.id))
    audit.refresh_from_db()
    assert audit.status == Audit.Status.FAILED
    assert "loopback" in audit.error


def test_a_finished_audit_is_not_run_again(site):
    audit = make_audit(f"{site.base_url}/noindex")
    services.execute_audit(str(audit.id))
    hits = site.hits["/noindex"]
    assert services.execute_audit(str(audit.id)) == []
    assert site.hits["/noindex"] == hits
    audit.refresh_from_db()
    assert audit.attempts == 1


def test_an_unknown_or_malformed_audit_id_is_skipped():
    assert services.execute_audit("6f1f5b8e-0000-4000-8000-000000000000") == []
    assert services.execute_audit("not-a-uuid") == []


def test_a_host_known_to_be_rate_limited_is_not_fetched_and_the_attempt_is_given_back(
    site, redis_client
):
    now = time.time()
    key = admission_key_for_url(site.base_url)
    record(Observation(key, "default", now, Kind.SECONDARY, 429, blocked_until=now + 120))
    audit = make_audit(f"{site.base_url}/noindex")
    with pytest.raises(RateLimited) as limited:
        services.execute_audit(str(audit.id))
    assert limited.value.retry_at == pytest.approx(now + 120)
    assert site.hits["/noindex"] == 0
    AUDIT_JOB.wait(
        audit.id, seconds=120, attempt_spent=False, error=f"rate limited: {limited.value}"
    )
    audit.refresh_from_db()
    assert (audit.status, audit.attempts) == (Audit.Status.RETRYING, 0)
