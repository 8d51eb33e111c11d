"""Delivering an audit's events to callback URLs: the plain functions behind the task.

`audit.finished` goes to the submission's callback URL, signed with its secret;
`audit.changed` to the page callback, signed with the page's secret, when the
finished audit found changes. The signing and the POST (holding one of the receiver's
slots for the exchange only) are the webhook integration's
(`outbound.integrations.webhook`); this module keeps the deliveries' rows: creating,
claiming and recording each attempt.
"""

from __future__ import annotations

import enum
import json
import logging
import uuid
from collections.abc import Callable

from django.conf import settings
from django.db import close_old_connections, transaction
from django.utils import timezone

from audits.api.serializers import AuditSerializer
from audits.models import Audit
from audits.summary import abridged_changes, abridged_result
from jobs.errors import MalformedTaskMessage, Permanent, RateLimited, Transient
from outbound.hostslots import call_lease
from outbound.integrations import webhook
from webhooks.models import DELIVERY_JOB, Delivery

log = logging.getLogger(__name__)


class Outcome(enum.Enum):
    DELIVERED = "delivered"
    GONE = "gone"  # finished already (a duplicate message) or deleted


# --- The payload ------------------------------------------------------------------


class AuditPayloadSerializer(AuditSerializer):
    """The audit as its events carry it: as the API shows it, less the submission's
    callback URL. `audit.changed` goes to the page's owner, who may not be the
    submitter, and a callback URL can hold credentials (user, password, a token)."""

    class Meta(AuditSerializer.Meta):
        fields = [name for name in AuditSerializer.Meta.fields if name != "callback_url"]
        read_only_fields = fields


def payload_for(audit: Audit, event: str = Delivery.Event.FINISHED) -> dict:
    """The event's body. Its size is bounded whatever the page: link lists are cut to
    WEBHOOK_MAX_LINKS (summary.abridged_result), and `data.links.self` is the full audit."""
    data = AuditPayloadSerializer(audit).data
    data["result"] = abridged_result(data["result"], settings.WEBHOOK_MAX_LINKS)
    data["changes"] = abridged_changes(data["changes"], settings.WEBHOOK_MAX_LINKS)
    return {
        "type": event,
        "timestamp": (audit.finished_at or timezone.now()).isoformat(),
        "data": data,
    }


def signing_secret(delivery: Delivery) -> str | None:
    """The secret the delivery is signed with; None when an `audit.changed` delivery's page
    callback was changed or removed since: the old address is owed nothing any more."""
    if delivery.event == Delivery.Event.CHANGED:
        page = delivery.audit.page
        return page.callback_secret if page.callback_url == delivery.url else None
    # Dropped once its delivery succeeded (attempt_delivery): nothing is owed any more.
    return delivery.audit.callback_secret or None


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
    """A failed delivery becomes pending again under a new task id, with a fresh budget of
    attempts; False if it is not failed."""
    return DELIVERY_JOB.requeue(delivery.id, task_id=task_id, from_status=Delivery.Status.FAILED)


# --- One attempt -----------------------------------------------------------------


def pending_url(delivery_id: str) -> str | None:
    """Where an unfinished delivery goes; None once it is finished or deleted."""
    return DELIVERY_JOB.unfinished(delivery_id).values_list("url", flat=True).first()


def run_delivery(
    delivery_id: str, *, hold_flight: Callable[[float], bool] | None = None
) -> Outcome:
    """One attempt. The runtime runs one copy of a delivery at a time (its in-flight key,
    jobs.task); `hold_flight` keeps that key for the POST's whole exchange (the task's
    `hold_flight`), so a copy the broker hands on mid-request waits for it.

    A receiver whose slots are all busy raises RateLimited, and the attempt it had
    claimed is given back (`attempt_delivery`); a failed attempt raises Transient or
    Permanent.
    """
    if pending_url(delivery_id) is None:
        log.info(
            "webhook.skipped", extra={"delivery_id": delivery_id, "reason": "finished or gone"}
        )
        return Outcome.GONE
    return attempt_delivery(delivery_id, hold_flight=hold_flight)


def claim_delivery(delivery_id: str) -> Delivery | None:
    """Begin an attempt (DELIVERY_JOB.claim); None if the delivery finished meanwhile (a
    duplicate message).

    `delivering` can be claimed again: a worker died mid-attempt and the
    message came back (only once its attempt lease is free: `attempt_lease`).
    """
    if not DELIVERY_JOB.claim(delivery_id):
        return None
    return Delivery.objects.select_related("audit__page").get(id=delivery_id)


def attempt_delivery(
    delivery_id: str, *, hold_flight: Callable[[float], bool] | None = None
) -> Outcome:
    delivery = claim_delivery(delivery_id)
    if delivery is None:
        return Outcome.GONE
    secret = signing_secret(delivery)
    if secret is None:
        changed = delivery.event == Delivery.Event.CHANGED
        mark_failed(
            delivery_id,
            error="the page callback was changed or removed before delivery"
            if changed
            else "the submission's callback secret was dropped (its delivery had succeeded)",
        )
        return Outcome.GONE
    body = json.dumps(payload_for(delivery.audit, delivery.event), separators=(",", ":"))
    headers = webhook.signed_headers(secret=secret, webhook_id=delivery.webhook_id, body=body)
    # Give a pooled database connection back for the request: a slow receiver
    # must not hold one of the few connections every other thread needs.
    close_old_connections()
    # The whole exchange, slot slack included, from now: the claim and payload came first.
    if hold_flight is not None and not hold_flight(call_lease(DELIVERY_JOB.deadline.work)):
        raise Transient(
            "the attempt's in-flight key lapsed before its request (the database was slow)"
        )
    try:
        status_code = webhook.post(delivery.url, body=body, headers=headers)
    except RateLimited:
        # Every slot of the receiver was busy: no request was made, so no attempt was.
        give_back_attempt(delivery_id)
        raise
    except (Transient, Permanent) as exc:
        record_failure(delivery_id, status_code=exc.status_code, error=str(exc))
        raise
    with transaction.atomic():
        DELIVERY_JOB.finish(
            delivery_id,
            Delivery.Status.DELIVERED,
            delivered_at=timezone.now(),
            last_status_code=status_code,
            last_error="",
        )
        if delivery.event == Delivery.Event.FINISHED:
            # The submission's one delivery is done: its secret is not kept a moment longer.
            # (A failed delivery keeps it, encrypted, for a replay from the admin.)
            Audit.objects.filter(id=delivery.audit_id).update(callback_secret="")
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


def give_back_attempt(delivery_id: str) -> None:
    """Uncount the attempt `claim_delivery` counted: its POST was never sent. (Its wait's
    due time is written as it waits, jobs.task's `before_wait`.)"""
    DELIVERY_JOB.wait(delivery_id, seconds=0, attempt_spent=False)


def record_failure(delivery_id: str, *, status_code: int | None, error: str) -> None:
    Delivery.objects.filter(id=delivery_id).update(
        last_status_code=status_code, last_error=error[:2000]
    )


def mark_failed(delivery_id: str, *, error: str) -> None:
    if DELIVERY_JOB.finish(delivery_id, Delivery.Status.FAILED, last_error=error[:2000]):
        log.warning("webhook.failed", extra={"delivery_id": delivery_id, "error": error})


def parse_delivery_id(value) -> str:
    """The delivery id a task message names, or MalformedTaskMessage."""
    if not isinstance(value, str):
        raise MalformedTaskMessage(f"not a delivery id: {value!r:.100}")
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise MalformedTaskMessage(f"not a delivery id: {value!r:.100}") from None
