from __future__ import annotations

import logging
import uuid
from datetime import datetime

import httpx
from celery import shared_task, signals
from django.conf import settings
from django.db import OperationalError
from django.utils import timezone

from jobs.errors import RateLimited, Transient
from ratelimit.retry import Deferred, PlumbTask, backoff_delay
from webhooks import deliver, schedule
from webhooks.deliver import MalformedDeliveryMessage

log = logging.getLogger(__name__)

# A delivery whose host is full comes back after 0.25 s, then 0.5, 1, 2 ... (jittered),
# never later than one request timeout: by then every slot has turned over.
DEFER_BASE_SECONDS = 0.25


class WebhookTask(PlumbTask):
    max_attempts_setting = "WEBHOOK_MAX_ATTEMPTS"
    backoff_base_setting = "WEBHOOK_BACKOFF_BASE_SECONDS"
    backoff_max_setting = "WEBHOOK_BACKOFF_MAX_SECONDS"
    backoff_jitter_setting = "WEBHOOK_BACKOFF_JITTER"
    # A receiver's own failures count against its host's breaker (not a pool timeout).
    downstream_failures = (Transient,)

    def downstream_host(self, args, kwargs):
        """The destination host: while it is failing, its deliveries are parked, not tried."""
        delivery_id, _ = deliver.parse_message(args, kwargs)
        url = deliver.pending_url(delivery_id)
        # A finished or deleted delivery is skipped by the run itself, without a breaker.
        return None if url is None else httpx.URL(url).host

    def apply_async(
        self, args=None, kwargs=None, task_id=None, countdown=None, eta=None, **options
    ):
        """A delayed publish (a retry, a deferral) waits in Redis, not in a worker."""
        delay = countdown
        if eta is not None:
            delay = (eta - (timezone.now() if eta.tzinfo else datetime.now())).total_seconds()
        if delay is not None and delay > 0:
            task_id = task_id or str(uuid.uuid4())
            schedule.publish_later(
                self.name,
                args=args,
                kwargs=kwargs,
                task_id=task_id,
                retries=options.get("retries", 0),
                delay=delay,
            )
            return self.AsyncResult(task_id)
        return super().apply_async(args, kwargs, task_id=task_id, **options)

    def defer(self, delivery_id: str, deferrals: int) -> float:
        """Try again shortly without using an attempt: same task id, same retry count."""
        delay = backoff_delay(
            deferrals + 1, base=DEFER_BASE_SECONDS, cap=settings.WEBHOOK_TIMEOUT_SECONDS
        )
        self.apply_async(
            args=[delivery_id],
            kwargs={"deferrals": deferrals + 1},
            task_id=self.request.id,
            retries=self.request.retries,
            countdown=delay,
        )
        return delay

    def before_retry(self, exc, countdown, *, args, kwargs):
        try:
            deliver.mark_retrying(args[0], delay=countdown or 0)
        except OperationalError:
            # The retry must still be published when the database is what failed.
            log.warning("webhook.retry_not_recorded", extra={"delivery_id": args[0]})

    def before_park(self, reason, delay, *, args, kwargs):
        deliver.mark_retrying(args[0], delay=delay)

    def after_final_failure(self, exc, *, args, kwargs):
        if isinstance(exc, MalformedDeliveryMessage):
            log.error("webhook.malformed_message", extra={"error": str(exc)})
            return
        attempts = self.request.retries + 1
        deliver.mark_failed(str(args[0]), error=f"gave up after {attempts} attempt(s): {exc}")


@shared_task(
    base=WebhookTask,
    bind=True,
    name="webhooks.deliver",
    queue=settings.WEBHOOK_QUEUE,
    # Database trouble (a pool timeout) is as transient as a receiver's 503.
    autoretry_for=(Transient, OperationalError),
)
def deliver_webhook(self, *args, **kwargs) -> None:
    delivery_id, deferrals = deliver.parse_message(args, kwargs)
    try:
        deliver.run_delivery(delivery_id)
    except RateLimited:
        delay = self.defer(delivery_id, deferrals)
        log.info(
            "webhook.deferred",
            extra={"delivery_id": delivery_id, "delay_seconds": round(delay, 3)},
        )
        # Neither a completion nor a verdict on the destination: the copy sent for later is
        # the delivery now.
        raise Deferred("destination host busy") from None


# --- The webhooks worker's own machinery ---------------------------------------------

_promoter: schedule.Promoter | None = None


@signals.worker_ready.connect
def start_promoter(sender=None, **kwargs):
    """Each webhooks worker moves due retries into the queue (webhooks.schedule)."""
    global _promoter
    queues = {queue.name for queue in getattr(sender.task_consumer, "queues", [])}
    if settings.WEBHOOK_QUEUE in queues and _promoter is None:
        _promoter = schedule.Promoter()
        _promoter.start()


@signals.worker_shutdown.connect
def stop_promoter(**kwargs):
    global _promoter
    if _promoter is not None:
        _promoter.stop()
        _promoter = None
