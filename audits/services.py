"""Submitting and running audits: the plain functions behind the API and the tasks."""

from __future__ import annotations

import logging
import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from audits.analysis import audit_result
from audits.fetch import PermanentFetchError, fetch_page
from audits.models import Audit, Page
from audits.targets import NormalizedURL

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


def submit_audit(target: NormalizedURL) -> Audit:
    """Create the page (if new) and a queued audit, and enqueue it once committed.

    The row is written first and the message published on commit, so a worker
    never receives an id it cannot see yet; a row whose publish failed stays
    `queued` with its task id, for the reconciler to re-enqueue.
    """
    with transaction.atomic():
        page = get_or_create_page(target)
        audit = Audit.objects.create(page=page, task_id=str(uuid.uuid4()))
        transaction.on_commit(lambda: enqueue_audit(audit))
    return audit


def enqueue_audit(audit: Audit) -> None:
    from audits.tasks import run_audit

    run_audit.apply_async(args=[str(audit.id)], task_id=audit.task_id, queue=settings.AUDIT_QUEUE)
    log.info("audit.enqueued", extra={"audit_id": str(audit.id), "trigger": audit.trigger})


def claim_audit(audit_id: str) -> Audit | None:
    """Mark the audit running for this attempt; None if it is finished or gone.

    A `running` audit can be claimed again: that is a redelivery after a
    worker died mid-audit, and the audit must run to completion once more.
    """
    try:
        claimed = (
            Audit.objects.filter(id=audit_id)
            .exclude(status__in=Audit.FINISHED)
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
    """Run one attempt of an audit. Transient fetch errors propagate for the task to retry."""
    audit = claim_audit(audit_id)
    if audit is None:
        return None
    try:
        fetched = fetch_page(
            audit.page.url,
            timeout=settings.AUDIT_FETCH_TIMEOUT_SECONDS,
            max_bytes=settings.AUDIT_MAX_PAGE_BYTES,
            user_agent=settings.AUDIT_USER_AGENT,
            allow_private=settings.AUDIT_ALLOW_PRIVATE_TARGETS,
        )
    except PermanentFetchError as exc:
        finish_audit(audit_id, status=Audit.Status.FAILED, error=str(exc))
        return audit
    finish_audit(audit_id, status=Audit.Status.SUCCEEDED, result=audit_result(fetched))
    return audit


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
    return bool(updated)


def mark_retrying(audit_id: str, error: str) -> None:
    Audit.objects.filter(id=audit_id, status=Audit.Status.RUNNING).update(
        status=Audit.Status.RETRYING, error=error
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
