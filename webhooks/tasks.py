"""Delivering audits' events to callback URLs: the task, and where it is published.

`audits` announces a finish inside its transaction (audits.signals.audit_finished); the
delivery rows (`audit.finished` to the submission's callback, `audit.changed` to the
page's) are created here, in that transaction, and their messages published on commit. Every wait of a delivery
(a retry, a busy destination, an open breaker) goes to the delayed store, never into
a worker as an ETA message: a webhooks worker holds only the deliveries it runs.
"""

from __future__ import annotations

import logging
import uuid

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.dispatch import receiver

from audits.signals import audit_finished
from jobs.policy import RetryPolicy
from jobs.task import PlumbTask
from outbound.urls import origin_key_or_none
from webhooks import deliver
from webhooks.models import DELIVERY_JOB, Delivery

log = logging.getLogger(__name__)

WEBHOOK_POLICY = RetryPolicy(
    max_attempts=lambda: settings.WEBHOOK_MAX_ATTEMPTS,
    backoff_base=lambda: settings.WEBHOOK_BACKOFF_BASE_SECONDS,
    backoff_max=lambda: settings.WEBHOOK_BACKOFF_MAX_SECONDS,
    # A busy destination: back after 0.25 s, then 0.5, 1, 2 ... (jittered), never later
    # than one request timeout, by when every slot has turned over. However many turns
    # a burst to one host takes, they spend no attempt (jobs.task); no cap applies: a
    # receiver's 429 is a failed attempt (Transient), never a timed deferral.
    defer_base=0.25,
    defer_max=lambda: settings.WEBHOOK_TIMEOUT_SECONDS,
    countdowns_held=False,
    # Database or Redis trouble (a pool timeout, a failover) is retried by default
    # (INFRASTRUCTURE_UNAVAILABLE), and it is not the receiver's failure: only
    # `Transient` counts against its breaker.
)


class WebhookTask(PlumbTask):
    policy = WEBHOOK_POLICY
    job = DELIVERY_JOB

    def downstream_host(self, args, kwargs):
        """The destination's origin: while it is failing, its deliveries are parked, not
        tried; a receiver on another port of the same host is another origin."""
        url = deliver.pending_url(deliver.parse_delivery_id(args[0]))
        # A finished or deleted delivery is skipped by the run itself, without a breaker.
        return None if url is None else origin_key_or_none(url)

    def after_final_failure(self, exc, *, args, kwargs):
        attempts = self.request.retries + 1
        deliver.mark_failed(str(args[0]), error=f"gave up after {attempts} attempt(s): {exc}")


@shared_task(
    base=WebhookTask,
    bind=True,
    name="webhooks.deliver",
    queue=settings.WEBHOOK_QUEUE,
)
def deliver_webhook(self, delivery_id: str) -> None:
    # A destination whose slots are all busy raises RateLimited: the runtime defers it.
    deliver.run_delivery(deliver.parse_delivery_id(delivery_id), hold_flight=self.hold_flight)


# --- Publishing --------------------------------------------------------------------


@receiver(audit_finished, dispatch_uid="webhooks.schedule_delivery")
def schedule_delivery(sender=None, audit_id=None, **kwargs) -> Delivery | None:
    """Create the finished audit's `audit.finished` delivery and publish it on commit;
    nothing without a callback URL. One per audit (unique with its event): a second call
    changes nothing."""
    if not kwargs.get("callback", True):
        return None
    return _schedule(deliver.create_delivery, audit_id)


@receiver(audit_finished, dispatch_uid="webhooks.schedule_change_delivery")
def schedule_change_delivery(sender=None, audit_id=None, **kwargs) -> Delivery | None:
    """The same for `audit.changed` to the page callback, when the audit found changes,
    whatever started it (a submission or the nightly re-audit)."""
    if not kwargs.get("changed", True) or not kwargs.get("page_callback", True):
        return None
    return _schedule(deliver.create_change_delivery, audit_id)


def _schedule(create, audit_id) -> Delivery | None:
    with transaction.atomic():
        delivery, created = create(audit_id)
        if created:
            transaction.on_commit(lambda: enqueue_delivery(delivery))
    return delivery


def enqueue_delivery(delivery: Delivery) -> None:
    deliver_webhook.apply_async(
        args=[str(delivery.id)], task_id=delivery.task_id, queue=settings.WEBHOOK_QUEUE
    )
    log.info("webhook.enqueued", extra={"delivery_id": str(delivery.id), "event": delivery.event})


def redeliver(delivery: Delivery) -> bool:
    """Replay a failed delivery: a fresh budget of attempts, the same webhook-id."""
    task_id = str(uuid.uuid4())
    with transaction.atomic():
        if not deliver.reset_failed(delivery, task_id=task_id):
            return False
        delivery.task_id = task_id
        transaction.on_commit(lambda: enqueue_delivery(delivery))
    log.info("webhook.redelivery", extra={"delivery_id": str(delivery.id)})
    return True
