"""Submitting and running audits: the plain functions behind the API and the tasks."""

from __future__ import annotations

import logging
import uuid
from functools import partial

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from audits import backlog
from audits.analysis import audit_result
from audits.linkcheck import start_link_checks
from audits.models import Audit, Page
from jobs.errors import Permanent
from outbound.integrations.page import fetch_page
from outbound.urls import NormalizedURL
from webhooks.deliver import schedule_delivery

log = logging.getLogger(__name__)


def get_or_create_page(target: NormalizedURL, *, reaudit_nightly: bool | None = None) -> Page:
    page, _ = Page.objects.get_or_create(
        url=target.url,
        defaults={
            "domain": target.domain,
            "reaudit_nightly": settings.REAUDIT_NEW_PAGES
            if reaudit_nightly is None
            else reaudit_nightly,
        },
    )
    return page


def submit_audit(
    target: NormalizedURL, *, callback_url: str = "", callback_secret: str = ""
) -> Audit:
    """Create the page (if new) and a queued audit, and enqueue it once committed.

    The row is written first and the message published on commit, so a worker
    never receives an id it cannot see yet; a row whose publish failed stays
    `queued` with its task id, for the reconciler to re-enqueue. With a
    callback URL the finished audit is POSTed there (webhooks app).
    """
    with transaction.atomic():
        page = get_or_create_page(target)
        audit, _ = create_and_enqueue_audit(
            page,
            trigger=Audit.Trigger.SUBMITTED,
            callback_url=callback_url,
            callback_secret=callback_secret,
        )
    return audit


def create_and_enqueue_audit(
    page: Page,
    *,
    trigger: str,
    idempotency_key: str | None = None,
    callback_url: str = "",
    callback_secret: str = "",
) -> tuple[Audit, bool]:
    """Create a queued audit of `page` and enqueue it on commit; (audit, created).

    With an `idempotency_key` a second call creates nothing and enqueues nothing:
    the unique constraint turns the second insert into a lookup of the first
    audit, even when two callers race.
    """
    try:
        with transaction.atomic():
            audit = Audit.objects.create(
                page=page,
                trigger=trigger,
                idempotency_key=idempotency_key,
                task_id=str(uuid.uuid4()),
                callback_url=callback_url,
                callback_secret=callback_secret,
            )
    except IntegrityError:
        if idempotency_key is None:
            raise
        return Audit.objects.get(idempotency_key=idempotency_key), False
    transaction.on_commit(lambda: enqueue_audit(audit))
    return audit, True


def enqueue_audit(audit: Audit) -> bool:
    """Publish the audit's message; False (logged) if the broker cannot take it now.

    Runs after the row is committed, so a failure here must not fail the request that
    created it: the audit is accepted, and the reconciler (audits.reconcile) publishes
    it again once the broker is back.
    """
    from audits.tasks import run_audit

    try:
        run_audit.apply_async(
            args=[str(audit.id)], task_id=audit.task_id, queue=settings.AUDIT_QUEUE
        )
    except (OperationalError, RedisError, OSError) as exc:
        log.error(
            "audit.enqueue_failed",
            extra={"audit_id": str(audit.id), "error": f"{exc.__class__.__name__}: {exc}"},
        )
        return False
    log.info("audit.enqueued", extra={"audit_id": str(audit.id), "trigger": audit.trigger})
    return True


def claim_audit(audit_id: str) -> Audit | None:
    """Mark the audit running for this attempt; None if it is finished or gone.

    A `running` audit can be claimed again: that is a redelivery after a
    worker died mid-audit, and the audit must run to completion once more.
    """
    try:
        claimed = (
            Audit.objects.filter(id=audit_id)
            # An audit checking its links has fetched its page: a redelivery leaves it be.
            .exclude(status__in=(*Audit.FINISHED, Audit.Status.CHECKING_LINKS))
            .update(
                status=Audit.Status.RUNNING,
                attempts=F("attempts") + 1,
                started_at=timezone.now(),
                error="",
            )
        )
    except ValidationError:
        log.error("audit.malformed_id", extra={"audit_id": audit_id})
        return None
    if not claimed:
        log.info("audit.skipped", extra={"audit_id": audit_id, "reason": "finished or missing"})
        return None
    return Audit.objects.select_related("page").get(id=audit_id)


def execute_audit(audit_id: str) -> Audit | None:
    """Run one attempt of an audit. Transient fetch errors propagate for the task to retry,
    and so does RateLimited (the page's host asked us to wait), for the task to defer.

    A page with external links moves on to `checking_links`; the last check (or the
    deadline sweep) finishes the audit.
    """
    # From here its held message is a running attempt, not owed a slot; registered
    # before the claim, so whoever sees the audit `running` sees it registered too.
    backlog.note_started(audit_id)
    try:
        audit = claim_audit(audit_id)
        if audit is not None:
            _run_attempt(audit)
    finally:
        # Before a retry is published too: from then on its new message is what counts.
        backlog.note_stopped(audit_id)
    return audit


def _run_attempt(audit: Audit) -> None:
    audit_id = str(audit.id)
    try:
        fetched = fetch_page(
            audit.page.url,
            timeout=settings.AUDIT_FETCH_TIMEOUT_SECONDS,
            max_bytes=settings.AUDIT_MAX_PAGE_BYTES,
            user_agent=settings.AUDIT_USER_AGENT,
            allow_private=settings.AUDIT_ALLOW_PRIVATE_TARGETS,
        )
    except Permanent as exc:
        finish_audit(audit_id, status=Audit.Status.FAILED, error=str(exc))
        return
    result = audit_result(fetched)
    if not start_link_checks(audit, result):
        finish_audit(audit_id, status=Audit.Status.SUCCEEDED, result=result)


def finish_audit(
    audit_id: str, *, status: str, result: dict | None = None, error: str = ""
) -> bool:
    """Record the outcome once: a second finisher (a duplicate delivery) changes nothing."""
    updated = (
        Audit.objects.filter(id=audit_id)
        .exclude(status__in=Audit.FINISHED)
        .update(status=status, result=result, error=error, finished_at=timezone.now())
    )
    if updated:
        log.info("audit.finished", extra={"audit_id": audit_id, "status": status, "error": error})
        # Only a committed finish is delivered to the audit's callback URL, if it has one.
        transaction.on_commit(partial(schedule_delivery, audit_id))
    return bool(updated)


def mark_retrying(audit_id: str, error: str) -> None:
    Audit.objects.filter(id=audit_id, status=Audit.Status.RUNNING).update(
        status=Audit.Status.RETRYING, error=error
    )


def mark_deferred(audit_id: str, error: str) -> None:
    """Waiting for a rate limit: retrying, and the attempt this run counted is given back."""
    Audit.objects.filter(id=audit_id, status=Audit.Status.RUNNING).update(
        status=Audit.Status.RETRYING, error=error, attempts=F("attempts") - 1
    )


def requeue_audit(audit_id: str) -> Audit | None:
    """Run a failed audit again (a dead-letter replay): queued, a new task id, enqueued on commit.

    None if the audit is gone or not failed: a replay never re-runs a
    finished success or an audit that is still alive.
    """
    with transaction.atomic():
        requeued = Audit.objects.filter(id=audit_id, status=Audit.Status.FAILED).update(
            status=Audit.Status.QUEUED,
            task_id=str(uuid.uuid4()),
            error="",
            result=None,
            started_at=None,
            finished_at=None,
        )
        if not requeued:
            return None
        audit = Audit.objects.get(id=audit_id)
        transaction.on_commit(lambda: enqueue_audit(audit))
    return audit
