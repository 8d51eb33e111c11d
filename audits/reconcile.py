"""Audits accepted but never run: the row committed, its message lost.

The row is written before the message is published (on commit), so a web process
that dies in between, a publish that fails because Redis is down, or a Redis that
restarts without persistence leaves an audit `queued` with no message anywhere.
"Queued" means "about to run", so one queued for longer than
AUDIT_REQUEUE_AFTER_SECONDS is published again with its own task id. So is one
still `running` that long after its attempt started: longer than any attempt's hard
time limit, so its worker died and its message went with a Redis that restarted. If its message
was only slow, not lost, the second delivery finds it finished or claims it once:
the claim in `claim_audit` makes the duplicate harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from audits.models import Audit
from observability.metrics import record_requeued

log = logging.getLogger(__name__)

BATCH = 500


def requeue_stuck_audits(
    *, enqueue: Callable[[Audit], bool], older_than_seconds: float | None = None
) -> int:
    """Publish again (`enqueue`, which says whether the broker took it) every audit queued
    longer than the threshold; returns how many."""
    threshold = older_than_seconds
    if threshold is None:
        threshold = settings.AUDIT_REQUEUE_AFTER_SECONDS
    cutoff = timezone.now() - timedelta(seconds=threshold)
    stuck = (
        Audit.objects.filter(
            Q(status=Audit.Status.QUEUED, created_at__lt=cutoff)
            | Q(status=Audit.Status.RUNNING, started_at__lt=cutoff)
        )
        .filter(Q(requeued_at__isnull=True) | Q(requeued_at__lt=cutoff))
        .order_by("created_at")[:BATCH]
    )
    requeued = 0
    for audit in stuck:
        if not enqueue(audit):
            break  # the broker is still down: the next run tries again
        Audit.objects.filter(id=audit.id).update(requeued_at=timezone.now())
        requeued += 1
    if requeued:
        log.warning(
            "audit.requeued_stuck", extra={"count": requeued, "older_than_seconds": threshold}
        )
        record_requeued(requeued)
    return requeued
