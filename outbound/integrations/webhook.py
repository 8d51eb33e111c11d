"""Webhook receivers: the Standard Webhooks secret and signature, the POST and its slots.

Deliveries follow the Standard Webhooks specification: `webhook-id` (the
delivery's id, the same on every attempt), `webhook-timestamp` and
`webhook-signature` (`v1,` + base64 HMAC-SHA256 of "id.timestamp.body" with the
`whsec_` secret), signed with the `standardwebhooks` package receivers verify with.

A receiver's answer is classified like any other downstream's: 2xx is
delivered; 408, 425, 429 and 5xx raise Transient with the receiver's
Retry-After; any other 4xx (and a forbidden address) raises Permanent. A
receiver's 429 is an ordinary failed attempt, not a rate-limit observation: the
POST goes through the one sender without admission.

The POST holds one of its receiver's slots (WEBHOOK_PER_HOST_CONCURRENCY per origin)
through that sender, like every other outbound call: only around the exchange, never
across the delivery's database work or its payload build.
"""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime

import httpx2
from django.conf import settings
from standardwebhooks.webhooks import Webhook

from jobs.errors import Permanent, Transient
from outbound import hostslots
from outbound.client import OutboundClient, shared_client
from outbound.guard import TargetNotAllowed
from outbound.statuses import unwanted_answer

SECRET_PREFIX = "whsec_"
# The spec recommends 24 to 64 random bytes; fewer than 16 is too easy to guess.
SECRET_MIN_BYTES, SECRET_MAX_BYTES = 16, 64
ERROR_BODY_BYTES = 512


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


# --- The receiver's slots ---------------------------------------------------------


def delivery_slots() -> hostslots.SlotLimit:
    """WEBHOOK_PER_HOST_CONCURRENCY POSTs in flight per receiver origin (0: no limit), in
    a pool of their own: a receiver's slots are not shared with page fetches or link
    checks of the same origin (each pool answers to its own setting). Never waited for
    inline: a full receiver raises RateLimited at once (no retry time), so the delivery
    is deferred and its worker thread moves on. A lease outlives the exchange, whose
    whole deadline is WEBHOOK_TIMEOUT_SECONDS (outbound.bounded), by a few seconds."""
    return hostslots.SlotLimit(
        "webhooks",
        concurrency=settings.WEBHOOK_PER_HOST_CONCURRENCY,
        lease=hostslots.call_lease(settings.WEBHOOK_TIMEOUT_SECONDS),
        wait_inline=False,
    )


# --- The POST ----------------------------------------------------------------------


def post(url: str, *, body: str, headers: dict[str, str]) -> int:
    """POST the body; the 2xx status it was answered with, or Transient/Permanent saying why not.

    Raises RateLimited, before any request, when every slot of the receiver is busy.
    """
    # WEBHOOK_TIMEOUT_SECONDS is the whole exchange's deadline (outbound.bounded), and
    # no more of an answer than its excerpt is ever decoded.
    outbound = OutboundClient(
        shared_client(timeout=settings.WEBHOOK_TIMEOUT_SECONDS, max_body_bytes=ERROR_BODY_BYTES),
        slots=delivery_slots(),
        rate_limits=False,
    )
    request = outbound.http.build_request(
        "POST", url, content=body.encode(), headers={**headers, "Content-Type": "application/json"}
    )
    try:
        response = outbound.send(request, stream=True)
        try:
            # A 2xx is delivered whatever its body says: only a failure keeps an excerpt.
            excerpt = "" if 200 <= response.status_code < 300 else _excerpt(response)
        finally:
            response.close()
    except TargetNotAllowed as exc:
        raise Permanent(str(exc)) from None
    except httpx2.HTTPError as exc:
        raise Transient(f"{exc.__class__.__name__}: {exc}") from None
    status = response.status_code
    if 200 <= status < 300:
        return status
    # A refusal ends the delivery; anything else (a redirect or an informational answer
    # this POST does not follow included) is worth another attempt.
    raise unwanted_answer(f"HTTP {status}" + (f": {excerpt}" if excerpt else ""), response)


def _excerpt(response: httpx2.Response) -> str:
    """The start of the receiver's answer, kept with a failure."""
    excerpt = b""
    try:
        for chunk in response.iter_bytes():
            excerpt += chunk
            if len(excerpt) >= ERROR_BODY_BYTES:
                break
    except httpx2.DecodingError:
        return "(a body Plumb does not decode)"
    return excerpt[:ERROR_BODY_BYTES].decode("utf-8", "replace").strip()
