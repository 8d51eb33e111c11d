"""What the audits app owes, for the one reconciler (jobs.reconcile).

An audit row is committed before its message is published, and the message may die
with Redis: a web process that dies in between, a publish that fails because Redis
is down, or a Redis that comes back empty or behind. The rows say what is owed:

- an audit `queued` (since it was accepted or last published again);
- an audit `retrying`: its wait (a held retry, or a delayed-store entry: a backoff, a
  breaker park, a rate-limit deferral) is due at `next_attempt_at`;
- an audit `running` long past its attempt's start: longer than any hard time limit,
  so its worker died and its message went with a Redis that restarted (after Redis
  lost data, every running audit is given a copy due when its hard time limit ends:
  its worker may have died with Redis);
- a link check unfinished while its audit is `checking_links` (only after Redis lost
  data: otherwise the audit's link-check deadline finishes the audit sooner).

A duplicate is harmless: `claim_audit` skips a finished audit, and a check finds its
row finished.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from audits.models import Audit, LinkCheck
from audits.tasks import check_link, run_audit
from jobs.reconcile import BATCH, OwedWork, Window, publish_owed
from observability.metrics import record_requeued


@dataclass(frozen=True)
class OwedAudit:
    id: str
    task_id: str
    attempts: int
    due_at: datetime | None


def owed_audits(window: Window) -> Iterable[OwedAudit]:
    queued, retrying = Q(status=Audit.Status.QUEUED), Q(status=Audit.Status.RETRYING)
    running = Q(status=Audit.Status.RUNNING)
    if window.redis_lost:
        owed = (
            queued & window.since("created_at", "requeued_at")
            | retrying & window.since("next_attempt_at", "requeued_at")
            | running & window.since("started_at", "requeued_at")
        )
    else:
        owed = (
            queued & window.overdue("created_at", republished="requeued_at")
            | running & window.overdue("started_at", republished="requeued_at")
            | retrying & window.overdue("next_attempt_at", republished="requeued_at")
        )
    # A running attempt whose message Redis lost still finishes if its worker lives; its
    # copy waits out the hard time limit, then finds the audit finished (or runs it).
    attempt_limit = timedelta(seconds=run_audit.time_limit)
    rows = Audit.objects.filter(owed).order_by("created_at")
    for audit_id, task_id, attempts, status, next_attempt_at, started_at in rows.values_list(
        "id", "task_id", "attempts", "status", "next_attempt_at", "started_at"
    )[: window.limit].iterator(chunk_size=BATCH):
        due_at = None
        if status == Audit.Status.RETRYING:
            due_at = next_attempt_at
        elif status == Audit.Status.RUNNING and window.redis_lost and started_at is not None:
            due_at = started_at + attempt_limit
        yield OwedAudit(str(audit_id), task_id, attempts, due_at)


def republish_audit(audit: OwedAudit) -> bool:
    if not publish_owed(
        run_audit.name, args=[audit.id], task_id=audit.task_id, queue=settings.AUDIT_QUEUE,
        due_at=audit.due_at, retries=audit.attempts,
    ):  # fmt: skip
        return False
    Audit.objects.filter(id=audit.id).update(requeued_at=timezone.now())
    record_requeued(1)
    return True


@dataclass(frozen=True)
class OwedLinkCheck:
    id: int
    task_id: str
    due_at: datetime | None


def owed_link_checks(window: Window) -> Iterable[OwedLinkCheck]:
    if not window.redis_lost:
        return
    rows = LinkCheck.objects.filter(
        window.since("created_at", "retry_at"),
        audit__status=Audit.Status.CHECKING_LINKS,
        status__in=LinkCheck.UNFINISHED,
    )
    for check_id, task_id, retry_at in rows.values_list("id", "task_id", "retry_at")[
        : window.limit
    ].iterator(chunk_size=BATCH):
        yield OwedLinkCheck(check_id, task_id, retry_at)


def republish_link_check(check: OwedLinkCheck) -> bool:
    return publish_owed(
        check_link.name, args=[check.id], task_id=check.task_id, queue=settings.AUDIT_QUEUE,
        due_at=check.due_at,
    )  # fmt: skip


SOURCES = (
    OwedWork("audits", owed_audits, republish_audit),
    OwedWork("link_checks", owed_link_checks, republish_link_check),
)
