"""One job model (jobs.lifecycle): every kind of job claims, waits, finishes and is owed by
the same rules, declared once; its deadline budget derives every bound (jobs.deadlines).

The one test that runs a worker asks for the module's shared audits worker."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from audits import linkcheck, submission
from audits.models import AUDIT_JOB, LINK_CHECK_JOB, Audit, LinkCheck, SharedLink
from audits.tasks import check_shared_link, run_audit
from jobs.deadlines import Deadline, deadline_problems
from outbound.urls import normalize_url
from tests.broker import queued
from tests.reconciling import reconciled_now
from tests.webhook_helpers import finished_audit_with_callback
from tests.workers import module_worker, wait_for
from webhooks import deliver
from webhooks.models import DELIVERY_JOB, Delivery
from webhooks.tasks import deliver_webhook

pytestmark = pytest.mark.both_databases

audits_worker = module_worker("audits")


def queued_audit(url: str = "https://example.org/") -> Audit:
    page = submission.get_or_create_page(normalize_url(url))
    return Audit.objects.create(page=page, task_id=str(uuid.uuid4()))


def test_a_deadline_derives_every_bound_from_the_work():
    deadline = Deadline(work=10)
    assert (deadline.soft, deadline.hard, deadline.lease) == (40, 70, 100)
    assert deadline.dead_after == deadline.lease


def test_each_task_takes_its_limits_from_its_job_s_deadline():
    for task, job in ((run_audit, AUDIT_JOB), (check_shared_link, LINK_CHECK_JOB),
                      (deliver_webhook, DELIVERY_JOB)):  # fmt: skip
        assert task.deadline is job.deadline
        assert (task.soft_time_limit, task.time_limit) == (job.deadline.soft, job.deadline.hard)


def test_a_lease_past_the_visibility_timeout_is_named():
    # The fetch's 10 s, a large page's 4 s wait for a tree builder, its 3 s and 1.5 s for
    # the child's kill and its answer (audits.treebuild.ANSWER_SECONDS).
    (problem,) = deadline_problems([run_audit], {"audits": 108})
    assert problem.startswith("audits.run_audit: soft 48.5 s < hard 78.5 s < lease 108.5 s")
    assert deadline_problems([run_audit], {"audits": 108.5}) == []


@pytest.mark.django_db
def test_a_claim_counts_one_attempt_and_a_finished_job_claims_nothing():
    audit = queued_audit()
    assert AUDIT_JOB.claim(audit.id)
    audit.refresh_from_db()
    assert (audit.status, audit.attempts) == ("running", 1)
    assert audit.attempt_started_at is not None
    # Redelivered after its worker died: claimed again.
    assert AUDIT_JOB.claim(audit.id)
    assert AUDIT_JOB.finish(audit.id, Audit.Status.SUCCEEDED)
    assert not AUDIT_JOB.finish(audit.id, Audit.Status.FAILED)
    assert not AUDIT_JOB.claim(audit.id)
    assert Audit.objects.get(id=audit.id).status == "succeeded"


@pytest.mark.django_db
def test_a_claim_returns_what_its_attempt_needs_from_its_own_statement(
    django_assert_max_num_queries,
):
    audit = queued_audit("https://example.org/claimed")
    with django_assert_max_num_queries(1) as queries:
        claimed = AUDIT_JOB.claim(
            audit.id, attempt=3, error="", returning=("page__url", "page_id", "trigger")
        )
    assert claimed == ("https://example.org/claimed", audit.page_id, "submitted")
    assert len(queries.captured_queries) == 1
    audit.refresh_from_db()
    assert (audit.status, audit.attempts) == ("running", 3)  # at least the attempt given
    assert AUDIT_JOB.finish(audit.id, Audit.Status.FAILED, returning=("callback_url",)) == ("",)
    assert AUDIT_JOB.claim(audit.id, returning=("page_id",)) is False


@pytest.mark.django_db
def test_a_success_finishes_in_three_statements_and_a_failure_in_one(
    django_assert_max_num_queries,
):
    audit = queued_audit("https://example.org/finished")
    AUDIT_JOB.claim(audit.id)
    with django_assert_max_num_queries(10) as queries:
        assert Audit.objects.finish(audit.id, status=Audit.Status.SUCCEEDED, result={"a": 1})
    # Its row with its page locked, the previous success, the update (its page's failing
    # checks written too: a first success), and the transaction's own.
    statements = [
        q["sql"] for q in queries.captured_queries if q["sql"].startswith(("SELECT", "UPDATE"))
    ]
    assert len(statements) == 4, statements
    failed = queued_audit("https://example.org/failed")
    AUDIT_JOB.claim(failed.id)
    with django_assert_max_num_queries(10) as queries:
        assert Audit.objects.finish(failed.id, status=Audit.Status.FAILED, error="gone")
    statements = [
        q["sql"] for q in queries.captured_queries if q["sql"].startswith(("SELECT", "UPDATE"))
    ]
    assert len(statements) == 1, statements


@pytest.mark.django_db
def test_an_audit_checking_its_links_rests_and_is_never_claimed_or_owed():
    audit = queued_audit()
    Audit.objects.filter(id=audit.id).update(
        status=Audit.Status.CHECKING_LINKS, published_at=timezone.now() - timedelta(hours=1)
    )
    assert not AUDIT_JOB.claim(audit.id)
    assert reconciled_now(overdue_after=60).republished == {}


@pytest.mark.django_db
def test_a_wait_that_spends_no_attempt_gives_back_the_one_its_claim_counted():
    audit = queued_audit()
    AUDIT_JOB.claim(audit.id)
    AUDIT_JOB.wait(audit.id, seconds=30, attempt_spent=False, error="rate limited")
    audit.refresh_from_db()
    assert (audit.status, audit.attempts, audit.error) == ("retrying", 0, "rate limited")
    assert audit.next_attempt_at > timezone.now() + timedelta(seconds=25)
    AUDIT_JOB.claim(audit.id)
    AUDIT_JOB.wait(audit.id, seconds=30, attempt_spent=True)
    assert Audit.objects.get(id=audit.id).attempts == 1


@pytest.mark.django_db
def test_a_link_check_runs_only_under_the_task_its_claim_names():
    audit = queued_audit()
    link = SharedLink.objects.create(url="https://x.test/")
    LinkCheck.objects.create(audit=audit, url=link.url, link=link)
    (claimed,) = linkcheck.claim_stale_links(str(audit.id))
    assert not LINK_CHECK_JOB.claim(link.id, task_id="another-task")
    assert LINK_CHECK_JOB.claim(link.id, task_id=claimed.task_id)
    # A second audit listing the link while its check is in flight only waits on it.
    second = queued_audit("https://example.org/second")
    LinkCheck.objects.create(audit=second, url=link.url, link=link)
    assert linkcheck.claim_stale_links(str(second.id)) == []


@pytest.mark.django_db
def test_a_replay_requeues_under_a_new_task_id_keeping_the_attempts_it_had(redis_client):
    delivery, _ = deliver.create_delivery(finished_audit_with_callback("https://r.test/").id)
    DELIVERY_JOB.claim(delivery.id)
    deliver.mark_failed(str(delivery.id), error="gave up")
    assert deliver.reset_failed(delivery, task_id="replayed")
    delivery.refresh_from_db()
    assert (delivery.status, delivery.task_id, delivery.attempts) == ("pending", "replayed", 1)
    assert not deliver.reset_failed(delivery, task_id="again")  # not failed any more


@pytest.mark.django_db
def test_every_kind_is_owed_by_the_same_rule(redis_client):
    """A job of each kind whose message was lost with Redis intact (a worker SIGKILLed
    between taking it and recording it unacked) is published again once overdue."""
    long_ago = timezone.now() - timedelta(seconds=900)
    audit = queued_audit()
    link = SharedLink.objects.create(url="https://x.test/")
    LinkCheck.objects.create(audit=audit, url=link.url, link=link)
    (check,) = linkcheck.claim_stale_links(str(audit.id))
    Audit.objects.filter(id=audit.id).update(status=Audit.Status.CHECKING_LINKS)
    delivery, _ = deliver.create_delivery(finished_audit_with_callback("https://r.test/").id)
    for model in (Audit, SharedLink, Delivery):
        model.objects.update(published_at=long_ago)

    assert reconciled_now(overdue_after=600).republished == {
        "link_checks": 1,
        "webhook_deliveries": 1,
    }
    assert [m.id for m in queued(redis_client, "audits")] == [check.task_id]
    assert [m.id for m in queued(redis_client, "webhooks")] == [delivery.task_id]
    # Published again: not owed again before RECONCILE_AFTER_SECONDS.
    assert reconciled_now(overdue_after=600).republished == {}


@pytest.mark.slow
def test_a_link_check_whose_message_was_lost_is_published_again_and_its_audit_finishes(
    site, audits_worker, redis_client, settings
):
    settings.AUDIT_LINKCHECK_DEADLINE_SECONDS = 600  # the deadline must not finish it first
    audit = queued_audit(f"{site.base_url}/noindex")
    link = SharedLink.objects.create(url=f"{site.base_url}/")
    LinkCheck.objects.create(audit=audit, url=link.url, link=link)
    Audit.objects.filter(id=audit.id).update(status=Audit.Status.CHECKING_LINKS, result={})
    linkcheck.claim_stale_links(str(audit.id))  # claimed, and its message never published
    SharedLink.objects.update(published_at=timezone.now() - timedelta(seconds=120))

    assert reconciled_now(overdue_after=60).republished == {"link_checks": 1}
    wait_for(
        lambda: Audit.objects.get(id=audit.id).status == "succeeded",
        timeout=30,
        message="the audit, once its link's check was published again",
    )
    assert Audit.objects.get(id=audit.id).result["links"][0]["status"] == "ok"
    assert SharedLink.objects.get(id=link.id).check_status == "idle"
