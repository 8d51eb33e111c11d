"""Running audits: the plain functions behind the audit task.

They change rows and return what must happen next; they never publish a message
(audits.tasks does, and audits.submission for a new audit), so the task module sits
above them and nothing imports it back.
"""

from __future__ import annotations

import logging
import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from audits.analysis import audit_result
from audits.linkcheck import QueuedCheck, start_link_checks
from audits.models import AUDIT_JOB, Audit
from jobs.errors import Permanent, WaitTooLong
from outbound.integrations.page import fetch_page

log = logging.getLogger(__name__)


def claim_audit(audit_id: str, *, attempt: int | None = None) -> str | None:
    """Begin the audit's attempt (AUDIT_JOB.claim) and return its page's URL; None if it
    is finished, gone, or checking its links (a redelivery leaves that be)."""
    try:
        claimed = AUDIT_JOB.claim(audit_id, attempt=attempt, error="")
    except ValidationError:
        log.error("audit.malformed_id", extra={"audit_id": audit_id})
        return None
    if not claimed:
        log.info("audit.skipped", extra={"audit_id": audit_id, "reason": "finished or missing"})
        return None
    return Audit.objects.filter(id=audit_id).values_list("page__url", flat=True).get()


def execute_audit(
    audit_id: str, *, resume: dict | None = None, attempt: int | None = None
) -> list[QueuedCheck]:
    """Run one attempt of an audit; return the link checks to enqueue.

    Transient fetch errors propagate for the task to retry, and so does RateLimited
    (the page's host asked us to wait, or a redirect's target host is busy), for the
    task to defer; `resume` is where a deferred run's redirects had got to. A page with external
    links moves on to `checking_links`; the last check (or the deadline sweep)
    finishes the audit.
    """
    url = claim_audit(audit_id, attempt=attempt)
    if url is None:
        return []
    try:
        fetched = fetch_page(
            url,
            timeout=settings.AUDIT_FETCH_TIMEOUT_SECONDS,
            max_bytes=settings.AUDIT_MAX_PAGE_BYTES,
            user_agent=settings.AUDIT_USER_AGENT,
            allow_private=settings.AUDIT_ALLOW_PRIVATE_TARGETS,
            resume=resume,
        )
    except Permanent as exc:
        Audit.objects.finish(audit_id, status=Audit.Status.FAILED, error=str(exc))
        return []
    # The robots.txt call site: the page's host's robots.txt (audits.findings.RobotsTxt:
    # status, body) for the robots-txt and is-crawlable findings. None until the
    # robots.txt store is wired in: robots-txt is then not applicable.
    result = audit_result(fetched, robots=None)
    started, queued = start_link_checks(audit_id, result)
    if not started:
        Audit.objects.finish(audit_id, status=Audit.Status.SUCCEEDED, result=result)
    return queued


def end_rate_limited(audit_id: str, error: WaitTooLong) -> None:
    """The page's host asked for a longer wait than RATELIMIT_MAX_WAIT_SECONDS: the audit
    fails now, saying it was rate limited and until when, instead of waiting in the
    backlog. Failed, not succeeded: there is no page to report, and a failed audit can be
    submitted again (or replayed) once that time has passed."""
    Audit.objects.finish(audit_id, status=Audit.Status.FAILED, error=str(error))


def reset_failed_audit(audit_id: str) -> Audit | None:
    """Make a failed audit queued again with a new task id (a dead-letter replay).

    None if the audit is gone or not failed: a replay never re-runs a finished
    success or an audit that is still alive.
    """
    with transaction.atomic():
        requeued = AUDIT_JOB.requeue(
            audit_id, task_id=str(uuid.uuid4()), from_status=Audit.Status.FAILED,
            error="", result=None, finished_at=None,
        )  # fmt: skip
        if not requeued:
            return None
        return Audit.objects.get(id=audit_id)
