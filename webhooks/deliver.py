"""Delivering a finished audit to its callback URL: the plain functions behind the task.

Deliveries follow the Standard Webhooks specification: `webhook-id` (the
delivery's id, the same on every attempt), `webhook-timestamp` and
`webhook-signature` (`v1,` + base64 HMAC-SHA256 of "id.timestamp.body" with the
`whsec_` secret), signed with the `standardwebhooks` package receivers verify with.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import logging
import uuid
from datetime import UTC, datetime, timedelta

import httpx
from django.conf import settings
from django.db import close_old_connections
from django.db.models import F
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from audits.api.serializers import AuditSerializer
from audits.fetch import build_client
from audits.models import Audit
from audits.targets import TargetNotAllowed
from jobs.errors import MalformedTaskMessage, Permanent, Transient
from ratelimit.headers import parse_retry_after
from webhooks.hostslots import host_slot
from webhooks.models import Delivery

log = logging.getLogger(__name__)

SECRET_PREFIX = "whsec_"
# The spec recommends 24 to 64 random bytes; fewer than 16 is too easy to guess.
SECRET_MIN_BYTES, SECRET_MAX_BYTES = 16, 64
# A receiver answering these is busy or down, not refusing the delivery.
RETRYABLE_CLIENT_STATUSES = {408, 429}
ERROR_BODY_BYTES = 512
EVENT_TYPE = "audit.finished"


class DeliveryFailed(Exception):
    def __init__(self, message: str, *, status_code: int | None = None, retry_after=None):
        super().__init__(message)
        self.status_code = status_code
        self.retry_after = retry_after


class TransientDeliveryError(DeliveryFailed, Transient):
    """Worth another attempt later: a timeout, a refused connection, a 5xx, a 408 or 429."""


class PermanentDeliveryError(DeliveryFailed, Permanent):
    """Another attempt cannot help: any other 4xx, or a forbidden address."""


class Outcome(enum.Enum):
    DELIVERED = "delivered"
    GONE = "gone"  # finished already (a duplicate message) or deleted
    HOST_BUSY = "host_busy"  # the destination's slots are all taken: defer, no attempt used


# --- Secrets and signatures ----------------------------------------------------


def validate_secret(secret: str) -> str:
    """A Standard Webhooks secret: `whsec_` + base64 of 16 to 64 bytes. Raises ValueError."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"Must start with '{SECRET_PREFIX}' (the Standard Webhooks form).")
    try:
        raw = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"Must be '{SECRET_PREFIX}' followed by base64.") from None
    if not SECRET_MIN_BYTES <= len(raw) <= SECRET_MAX_BYTES:
        raise ValueError(
            f"Must encode {SECRET_MIN_BYTES} to {SECRET_MAX_BYTES} bytes, not {len(raw)}."
        )
    return secret


def signed_headers(
    *, secret: str, webhook_id: str, body: str, at: datetime | None = None
) -> dict[str, str]:
    at = at or datetime.now(UTC)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(webhook_id, at, body),
    }


def payload_for(audit: Audit) -> dict:
    return {
        "type": EVENT_TYPE,
        "timestamp": (audit.finished_at or timezone.now()).isoformat(),
        "data": AuditSerializer(audit).data,
    }


# --- Creating and enqueueing -----------------------------------------------------


def create_delivery(audit_id) -> tuple[Delivery | None, bool]:
    """The finished audit's delivery, created if new: (delivery, created); (None, False)
    when the audit has no callback URL."""
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
        defaults={"url": audit.callback_url, "task_id": str(uuid.uuid4())},
    )


def reset_failed(delivery: Delivery, *, task_id: str) -> bool:
    """A failed delivery becomes pending again under a new task id; False if it is not failed."""
    return bool(
        Delivery.objects.filter(id=delivery.id, status=Delivery.Status.FAILED).update(
            status=Delivery.Status.PENDING, task_id=task_id, next_attempt_at=None
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
    """One attempt, if a slot for the destination host is free. Failures raise DeliveryFailed."""
    target = pending_url(delivery_id)
    if target is None:
        log.info(
            "webhook.skipped", extra={"delivery_id": delivery_id, "reason": "finished or gone"}
        )
        return Outcome.GONE
    with host_slot(httpx.URL(target).host) as acquired:
        if not acquired:
            return Outcome.HOST_BUSY
        return attempt_delivery(delivery_id)


def claim_delivery(delivery_id: str) -> Delivery | None:
    """Count an attempt; None if the delivery finished meanwhile (a duplicate message).

    `delivering` can be claimed again: a worker died mid-attempt and the
    message came back.
    """
    claimed = (
        Delivery.objects.filter(id=delivery_id)
        .exclude(status__in=Delivery.FINISHED)
        .update(status=Delivery.Status.DELIVERING, attempts=F("attempts") + 1, next_attempt_at=None)
    )
    if not claimed:
        return None
    return Delivery.objects.select_related("audit__page").get(id=delivery_id)


def attempt_delivery(delivery_id: str) -> Outcome:
    delivery = claim_delivery(delivery_id)
    if delivery is None:
        return Outcome.GONE
    body = json.dumps(payload_for(delivery.audit), separators=(",", ":"))
    headers = signed_headers(
        secret=delivery.audit.callback_secret, webhook_id=delivery.webhook_id, body=body
    )
    # Give a pooled database connection back for the request: a slow receiver
    # must not hold one of the few connections every other thread needs.
    close_old_connections()
    try:
        status_code, retry_after, excerpt = post(delivery.url, body=body, headers=headers)
    except DeliveryFailed as exc:
        record_failure(delivery_id, status_code=None, error=str(exc))
        raise
    if 200 <= status_code < 300:
        Delivery.objects.filter(id=delivery_id).update(
            status=Delivery.Status.DELIVERED,
            delivered_at=timezone.now(),
            last_status_code=status_code,
            last_error="",
        )
        log.info(
            "webhook.delivered",
            extra={"delivery_id": delivery_id, "attempt": delivery.attempts, "status": status_code},
        )
        return Outcome.DELIVERED
    error = f"HTTP {status_code}" + (f": {excerpt}" if excerpt else "")
    record_failure(delivery_id, status_code=status_code, error=error)
    if 400 <= status_code < 500 and status_code not in RETRYABLE_CLIENT_STATUSES:
        raise PermanentDeliveryError(error, status_code=status_code)
    raise TransientDeliveryError(error, status_code=status_code, retry_after=retry_after)


def post(url: str, *, body: str, headers: dict[str, str]) -> tuple[int, float | None, str]:
    """POST the body; returns (status, Retry-After seconds, start of the answer)."""
    try:
        with _client().stream(
            "POST",
            url,
            content=body.encode(),
            headers={**headers, "Content-Type": "application/json"},
        ) as response:
            excerpt = b""
            for chunk in response.iter_bytes():
                excerpt += chunk
                if len(excerpt) >= ERROR_BODY_BYTES:
                    break
    except TargetNotAllowed as exc:
        raise PermanentDeliveryError(str(exc)) from None
    except httpx.HTTPError as exc:
        raise TransientDeliveryError(f"{exc.__class__.__name__}: {exc}") from None
    return (
        response.status_code,
        parse_retry_after(response.headers.get("retry-after")),
        excerpt[:ERROR_BODY_BYTES].decode("utf-8", "replace").strip(),
    )


_clients: dict[tuple, httpx.Client] = {}


def _client() -> httpx.Client:
    """One client per process (and settings), so deliveries to a host reuse connections."""
    key = (
        settings.WEBHOOK_TIMEOUT_SECONDS,
        settings.AUDIT_USER_AGENT,
        settings.AUDIT_ALLOW_PRIVATE_TARGETS,
    )
    if key not in _clients:
        _clients[key] = build_client(
            timeout=settings.WEBHOOK_TIMEOUT_SECONDS,
            user_agent=settings.AUDIT_USER_AGENT,
            allow_private=settings.AUDIT_ALLOW_PRIVATE_TARGETS,
        )
    return _clients[key]


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
