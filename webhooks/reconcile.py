"""What the webhooks app owes, for the one reconciler (jobs.reconcile).

A delivery's message, and every wait of it (a retry's backoff, a busy destination, an
open breaker: all in the delayed store), live in Redis; the row says it is owed:

- `pending`: created (or replayed, or published again: `updated_at`), never attempted;
- `retrying`: due at `next_attempt_at` (written before every wait, jobs.task's
  `before_wait`);
- `delivering` long after its attempt began (`updated_at`): its worker died and its
  message went with Redis (after Redis lost data, each is given a copy due when its
  message would have come back to another worker).

A duplicate is harmless: `claim_delivery` skips a finished delivery, and a receiver
gets the same `webhook-id` on every attempt.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from jobs.reconcile import BATCH, OwedWork, Window, publish_owed
from webhooks.models import Delivery
from webhooks.tasks import deliver_webhook


@dataclass(frozen=True)
class OwedDelivery:
    id: str
    task_id: str
    attempts: int
    status: str
    due_at: datetime | None


def owed_deliveries(window: Window) -> Iterable[OwedDelivery]:
    pending, retrying = Q(status=Delivery.Status.PENDING), Q(status=Delivery.Status.RETRYING)
    delivering = Q(status=Delivery.Status.DELIVERING)
    if window.redis_lost:
        owed = (
            pending & window.since("created_at", "updated_at")
            | retrying & window.since("next_attempt_at", "updated_at")
            | delivering & window.since("updated_at")
        )
    else:
        owed = (
            pending & window.overdue("updated_at")
            | delivering & window.overdue("updated_at")
            | retrying & window.overdue("next_attempt_at")
        )
    # An attempt in flight whose message Redis lost still ends if its worker lives; its
    # copy waits until the message would have come back (the queue's visibility timeout).
    in_flight = timedelta(seconds=settings.QUEUE_VISIBILITY_TIMEOUTS[settings.WEBHOOK_QUEUE])
    rows = Delivery.objects.filter(owed).order_by("created_at")
    for delivery_id, task_id, attempts, status, next_attempt_at, updated_at in rows.values_list(
        "id", "task_id", "attempts", "status", "next_attempt_at", "updated_at"
    )[: window.limit].iterator(chunk_size=BATCH):
        due_at = None
        if status == Delivery.Status.RETRYING:
            due_at = next_attempt_at
        elif status == Delivery.Status.DELIVERING and window.redis_lost:
            due_at = updated_at + in_flight
        yield OwedDelivery(str(delivery_id), task_id, attempts, status, due_at)


def republish_delivery(delivery: OwedDelivery) -> bool:
    if not publish_owed(
        deliver_webhook.name, args=[delivery.id], task_id=delivery.task_id,
        queue=settings.WEBHOOK_QUEUE, due_at=delivery.due_at, retries=delivery.attempts,
    ):  # fmt: skip
        return False
    now = timezone.now()
    # Published again now: not overdue again before RECONCILE_AFTER_SECONDS from now.
    fields = {"updated_at": now}
    if delivery.status == Delivery.Status.RETRYING:
        fields["next_attempt_at"] = now if delivery.due_at is None else max(now, delivery.due_at)
    Delivery.objects.filter(id=delivery.id, status=delivery.status).update(**fields)
    return True


SOURCES = (OwedWork("webhook_deliveries", owed_deliveries, republish_delivery),)
