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
- a distinct link's check in flight (its SharedLink claimed) with audits `checking_links`
  waiting on it (only after Redis lost data: otherwise a stale claim is taken over by the
  next audit listing the link, and the link-check deadline finishes the audits waiting).

A duplicate is harmless: `claim_audit` skips a finished audit, and a check whose link's
claim names another task (or none: its outcome is recorded) does nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from audits.models import Audit, LinkCheck, SharedLink
from audits.tasks import check_shared_link, run_audit
from jobs.reconcile import BATCH, OwedWork, Window, publish_owed


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
    return True


@dataclass(frozen=True)
class OwedLinkCheck:
    shared_link_id: int
    task_id: str
    due_at: datetime | None


def owed_link_checks(window: Window) -> Iterable[OwedLinkCheck]:
    """A distinct link's check in flight (its SharedLink claimed by `check_task_id`) that
    audits are waiting on. Only after Redis lost data: otherwise a claim older than
    `linkcheck.claim_seconds()` is taken over by the next audit listing the link, and the
    link-check deadline finishes the audits waiting."""
    if not window.redis_lost:
        return
    waiting = LinkCheck.objects.filter(
        link_id=OuterRef("pk"),
        status__in=LinkCheck.UNFINISHED,
        audit__status=Audit.Status.CHECKING_LINKS,
    )
    # Its message or wait written since the loss: the claim, a broken answer being
    # confirmed, or a rate-limit wait (recorded on the checks waiting, as retry_at).
    recent_wait = Exists(waiting.filter(window.since("retry_at")))
    rows = (
        SharedLink.objects.filter(Exists(waiting), checking_since__isnull=False)
        .exclude(check_task_id="")
        .filter(window.since("checking_since", "suspect_since") | Q(recent_wait))
        .order_by("checking_since")
    )
    recheck = timedelta(seconds=settings.LINKCHECK_BROKEN_RECHECK_SECONDS)
    for link_id, task_id, suspect_since in rows.values_list("id", "check_task_id", "suspect_since")[
        : window.limit
    ].iterator(chunk_size=BATCH):
        due_at = suspect_since + recheck if suspect_since is not None else None
        yield OwedLinkCheck(link_id, task_id, due_at)


def republish_link_check(check: OwedLinkCheck) -> bool:
    # Under the claim's own task id: only the task its claim names records an outcome.
    return publish_owed(
        check_shared_link.name, args=[check.shared_link_id], task_id=check.task_id,
        queue=settings.AUDIT_QUEUE, due_at=check.due_at,
    )  # fmt: skip


SOURCES = (
    OwedWork("audits", owed_audits, republish_audit),
    OwedWork("link_checks", owed_link_checks, republish_link_check),
)
