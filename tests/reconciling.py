"""Running the reconciler (jobs.reconcile) from a test, against the test Redis."""

from __future__ import annotations

from datetime import datetime

import redis
from django.conf import settings
from django.utils import timezone

from jobs import reconcile


def reconciled_now(
    now: datetime | None = None, *, overdue_after: float = 0.0, redis_lost: bool = False
) -> reconcile.Reconciled:
    """One tick at `now`: with a Redis that kept its mark, or (`redis_lost`) one that came
    back empty after a mark was left."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        reconcile.write_mark(client, at=timezone.now())
        if redis_lost:
            client.delete(reconcile.MARK_KEY)
        return reconcile.reconcile(client=client, now=now, overdue_after=overdue_after)
    finally:
        client.close()
