"""Delivering an audit's events to callback URLs: the plain functions behind the task.

`audit.finished` goes to the submission's callback URL, signed with its secret;
`audit.changed` to the page callback, signed with the page's secret, when the
finished audit found changes. The signing, the POST and the destination host's
slots are the webhook integration's (`outbound.integrations.webhook`); this module
keeps the deliveries' rows: creating, claiming and recording each attempt.
"""

from __future__ import annotations

import enum
import json
import logging
import uuid
from datetime import timedelta

from django.db import close_old_connections
from django.db.models import F
from django.utils import timezone

from audits.api.serializers import AuditSerializer
from audits.models import Audit
from jobs.errors import MalformedTaskMessage, Permanent, Transient
from outbound.integrations import webhook
from webhooks.models import Delivery

log = logging.getLogger(__name__)


class Outcome(enum.Enum):
    DELIVERED = "delivered"
    GONE = "gone"  # finished already (a duplicate message) or deleted


# --- The payload ------------------------------------------------------------------


def payload_for(audit: Audit, event: str = Delivery.Event.FINISHED) -> dict:
    return {
        "type": event,
        "timestamp": (audit.finished_at or timezone.now()).isoformat(),
        "data": AuditSerializer(audit).data,
    }


def signing_secret(delivery: Delivery) -> str | None:
    """The secret the delivery is signed with; None when an `audit.changed` delivery's page
    callback was changed or removed since: the old address is owed nothing any more."""
    if delivery.event == Delivery.Event.CHANGED:
        page = delivery.audit.page
        return page.callback_secret if page.callback_url == delivery.url else None
    return delivery.audit.callback_secret


# --- Creating --------------------------------------------------------------------


def create_delivery(audit_id) -> tuple[Delivery | None, bool]:
    """The finished audit's `audit.finished` delivery, created if new: (delivery, created);
    (None, False) when the audit has no callback URL."""
    audit = (
        Audit.objects.filter(id=audit_id)
        .exclude(callback_url="")
        .only("id", "callback_url")
        .first()
    )
    if audit is None:
        return None, False
    return Delivery.objects.get_or_create(
        audit_id=audit.id,
        event=Delivery.Event.FINISHED,
        defaults={"url": audit.callback_url, "task_id": str(uuid.uuid4())},
    )


def create_change_delivery(audit_id) -> tuple[Delivery | None, bool]:
    """The `audit.changed` delivery of an audit that found changes, to its page's callback,
    created if new; (None, False) when nothing changed or the page has no callback."""
    audit = (
        Audit.objects.filter(id=audit_id, status=Audit.Status.SUCCEEDED)
        .exclude(changes=[])
        .exclude(changes__isnull=True)
        .exclude(page__callback_url="")
        .filter(page__removed_at=None)
        .values("id", "page__callback_url")
        .first()
    )
    if audit is None:
        return None, False
    return Delivery.objects.get_or_create(
        audit_id=audit["id"],
        event=Delivery.Event.CHANGED,
        defaults={"url": audit["page__callback_url"], "task_id": str(uuid.uuid4())},
    )


def reset_failed(delivery: Delivery, *, task_id: str) -> bool:
    """A failed delivery becomes pending again under a new task id; False if it is not failed."""
    return bool(
        Delivery.objects.filter(id=delivery.id, status=Delivery.Status.FAILED).update(
            status=Delivery.Status.PENDING,
            task_id=task_id,
            next_attempt_at=None,
            updated_at=timezone.now(),
        )
    )


# --- One attempt -----------------------------------------------------------------


def pending_url(delivery_id: str) -> str | None:
    """Where an unfinished delivery goes; None once it is finished or deleted."""
    return (
        Delivery.objects.filter(id=delivery_id)
        .exclude(status__in=Delivery.FINISHED)
        .values_list("url", flat=True)
        .first()
    )


def run_delivery(delivery_id: str) -> Outcome:
    """One attempt, if a slot for the destination host is free.

    A full host raises RateLimited before the attempt is claimed (no attempt
    used); a failed attempt raises Transient or Permanent.
    """
    target = pending_url(delivery_id)
    if target is None:
        log.info(
            "webhook.skipped", extra={"delivery_id": delivery_id, "reason": "finished or gone"}
        )
        return Outcome.GONE
    with webhook.host_slot(target):
        return attempt_delivery(delivery_id)


def claim_delivery(delivery_id: str) -> Delivery | None:
    """Count an attempt; None if the delivery finished meanwhile (a duplicate message).

    `delivering` can be claimed again: a worker died mid-attempt and the
    message came back.
    """
    claimed = (
        Delivery.objects.filter(id=delivery_id)
        .exclude(status__in=Delivery.FINISHED)
        # updated_at by hand (update() skips auto_now): when this attempt began, which
        # the reconciler reads for a delivery whose worker and message were both lost.
        .update(
            status=Delivery.Status.DELIVERING,
            attempts=F("attempts") + 1,
            next_attempt_at=None,
            updated_at=timezone.now(),
        )
    )
    if not claimed:
        return None
    return Delivery.objects.select_related("audit__page").get(id=delivery_id)


def attempt_delivery(delivery_id: str) -> Outcome:
    delivery = claim_delivery(delivery_id)
    if delivery is None:
        return Outcome.GONE
    secret = signing_secret(delivery)
    if secret is None:
        mark_failed(delivery_id, error="the page callback was changed or removed before delivery")
        return Outcome.GONE
    body = json.dumps(payload_for(delivery.audit, delivery.event), separators=(",", ":"))
    headers = webhook.signed_headers(secret=secret, webhook_id=delivery.webhook_id, body=body)
    # Give a pooled database connection back for the request: a slow receiver
    # must not hold one of the few connections every other thread needs.
    close_old_connections()
    try:
        status_code = webhook.post(delivery.url, body=body, headers=headers)
    except (Transient, Permanent) as exc:
        record_failure(delivery_id, status_code=exc.status_code, error=str(exc))
        raise
    Delivery.objects.filter(id=delivery_id).update(
        status=Delivery.Status.DELIVERED,
        delivered_at=timezone.now(),
        last_status_code=status_code,
        last_error="",
    )
    log.info(
        "webhook.delivered",
        extra={
            "delivery_id": delivery_id,
            "event": delivery.event,
            "attempt": delivery.attempts,
            "status": status_code,
        },
    )
    return Outcome.DELIVERED


# --- Recording what happened -------------------------------------------------------


def record_failure(delivery_id: str, *, status_code: int | None, error: str) -> None:
    Delivery.objects.filter(id=delivery_id).update(
        last_status_code=status_code, last_error=error[:2000]
    )


def mark_retrying(delivery_id: str, *, delay: float) -> None:
    Delivery.objects.filter(id=delivery_id).exclude(status__in=Delivery.FINISHED).update(
        status=Delivery.Status.RETRYING, next_attempt_at=timezone.now() + timedelta(seconds=delay)
    )


def mark_failed(delivery_id: str, *, error: str) -> None:
    updated = (
        Delivery.objects.filter(id=delivery_id)
        .exclude(status__in=Delivery.FINISHED)
        .update(status=Delivery.Status.FAILED, last_error=error[:2000], next_attempt_at=None)
    )
    if updated:
        log.warning("webhook.failed", extra={"delivery_id": delivery_id, "error": error})


def parse_delivery_id(value) -> str:
    """The delivery id a task message names, or MalformedTaskMessage."""
    if not isinstance(value, str):
        raise MalformedTaskMessage(f"not a delivery id: {value!r:.100}")
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise MalformedTaskMessage(f"not a delivery id: {value!r:.100}") from None
