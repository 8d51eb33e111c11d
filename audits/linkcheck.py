"""Checking an audited page's outbound links, each link in its own task.

The audit fetches its page, then creates one `LinkCheck` row per external link
and waits in `checking_links`. Each check task finishes its own row with a
conditional update and then counts the audit's unfinished rows: whoever sees
none left finishes the audit (once: `Audit.objects.finish` is conditional too). A
periodic sweep finishes audits whose AUDIT_LINKCHECK_DEADLINE_SECONDS has passed,
reporting the checks that had not finished (rate-limited ones with their retry time).

Each check calls `outbound.integrations.links` (the GET or GitHub's API, the
per-host slots, admission); this module keeps the rows and the audit's join.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audits.models import Audit, LinkCheck
from outbound.integrations.github import GitHubClient, GitHubCredentials
from outbound.integrations.links import LinkOutcome, check_url

log = logging.getLogger(__name__)

# --- The audit's side --------------------------------------------------------


@dataclass(frozen=True)
class QueuedCheck:
    """A link check to publish: its row and the task id stored on it."""

    link_check_id: int
    task_id: str


def start_link_checks(audit_id: str, result: dict) -> tuple[bool, list[QueuedCheck]]:
    """Move the audit to `checking_links` with one queued check per external link.

    Returns whether it moved (False: nothing to check, the caller finishes the audit)
    and the checks to publish, committed. Links over AUDIT_MAX_LINK_CHECKS are
    recorded as skipped.
    """
    links = result.get("external_links") or []
    if not links:
        return False, []
    cap = settings.AUDIT_MAX_LINK_CHECKS
    rows = [
        LinkCheck(audit_id=audit_id, url=url, task_id=str(uuid.uuid4())) for url in links[:cap]
    ] + [
        LinkCheck(
            audit_id=audit_id,
            url=url,
            status=LinkCheck.Status.SKIPPED,
            detail=f"over the limit of {cap} checked links per page",
            finished_at=timezone.now(),
        )
        for url in links[cap:]
    ]
    with transaction.atomic():
        moved = Audit.objects.filter(id=audit_id, status=Audit.Status.RUNNING).update(
            status=Audit.Status.CHECKING_LINKS,
            result=result,
            link_checks_deadline=timezone.now()
            + timedelta(seconds=settings.AUDIT_LINKCHECK_DEADLINE_SECONDS),
        )
        if not moved:
            return True, []  # finished or taken over meanwhile: nothing more to do here
        # A redelivered audit finds its rows already there and enqueues the unfinished ones again.
        LinkCheck.objects.bulk_create(rows, ignore_conflicts=True)
        queued = [
            QueuedCheck(link_check_id, task_id)
            for link_check_id, task_id in LinkCheck.objects.filter(
                audit_id=audit_id, status=LinkCheck.Status.QUEUED
            ).values_list("id", "task_id")
        ]
    if not queued:
        finish_link_checks(audit_id)
    log.info("audit.checking_links", extra={"audit_id": audit_id, "links": len(links)})
    return True, queued


def run_link_check(link_check_id: int) -> LinkCheck | None:
    """One attempt at one link; RateLimited and Transient propagate to the task."""
    check = LinkCheck.objects.select_related("audit").filter(id=link_check_id).first()
    if check is None or check.is_finished:
        return None
    if check.audit.status != Audit.Status.CHECKING_LINKS:
        return None  # the audit finished without it (deadline): nobody reads this any more
    credentials = GitHubCredentials.from_settings()
    github = GitHubClient(credentials) if credentials else None
    try:
        outcome = check_url(check.url, github=github)
    finally:
        if github is not None:
            github.close()
    record_outcome(link_check_id, outcome)
    finish_audit_if_checked(str(check.audit_id))
    return check


def record_outcome(link_check_id: int, outcome: LinkOutcome) -> bool:
    updated = LinkCheck.objects.filter(id=link_check_id, status__in=LinkCheck.UNFINISHED).update(
        status=outcome.status,
        status_code=outcome.status_code,
        final_url=outcome.final_url,
        github=outcome.github,
        detail=outcome.detail,
        retry_at=None,
        finished_at=timezone.now(),
    )
    return bool(updated)


def mark_waiting(link_check_id: int, *, why: str, seconds: float) -> None:
    """A rate limit holds the check back: pending, with when it will try again."""
    LinkCheck.objects.filter(id=link_check_id, status__in=LinkCheck.UNFINISHED).update(
        status=LinkCheck.Status.RATE_LIMITED_PENDING,
        retry_at=timezone.now() + timedelta(seconds=seconds),
        detail=why,
    )


def give_up(link_check_id: int, error: str) -> None:
    """No attempt left: the link is reported broken with the last error."""
    record_outcome(link_check_id, LinkOutcome(LinkCheck.Status.BROKEN, detail=error))
    audit_id = LinkCheck.objects.filter(id=link_check_id).values_list("audit_id", flat=True).first()
    if audit_id is not None:
        finish_audit_if_checked(str(audit_id))


def finish_audit_if_checked(audit_id: str) -> bool:
    """Finish the audit when none of its checks is left. Runs after each check's own
    update has committed, so of two checks finishing together at least the later
    one sees zero left."""
    if LinkCheck.objects.filter(audit_id=audit_id, status__in=LinkCheck.UNFINISHED).exists():
        return False
    return finish_link_checks(audit_id)


def finish_link_checks(audit_id: str, *, deadline_passed: bool = False) -> bool:
    audit = Audit.objects.filter(id=audit_id, status=Audit.Status.CHECKING_LINKS).first()
    if audit is None:
        return False
    checks = list(audit.link_checks.order_by("url"))
    unfinished = [check for check in checks if not check.is_finished]
    result = {
        **(audit.result or {}),
        "links": [check.as_result() for check in checks],
        "link_check": {
            "total": len(checks),
            "unfinished": len(unfinished),
            "rate_limited_pending": sum(
                check.status == LinkCheck.Status.RATE_LIMITED_PENDING for check in unfinished
            ),
            "deadline_passed": deadline_passed,
        },
    }
    return Audit.objects.finish(audit_id, status=Audit.Status.SUCCEEDED, result=result)


def finish_overdue_link_checks(*, now: datetime | None = None) -> int:
    """Finish every audit whose link-check deadline has passed (the periodic sweep)."""
    now = now or timezone.now()
    overdue = Audit.objects.filter(
        status=Audit.Status.CHECKING_LINKS, link_checks_deadline__lte=now
    ).values_list("id", flat=True)[:500]
    finished = sum(finish_link_checks(str(audit_id), deadline_passed=True) for audit_id in overdue)
    if finished:
        log.info("audit.link_check_deadline", extra={"audits": finished})
    return finished
