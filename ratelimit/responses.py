"""What a response says about the bucket it spent: a primary or secondary limit, or nothing.

`classify` tells rate-limit answers apart (primary exhaustion, secondary limits,
GraphQL's RATE_LIMITED) from ordinary ones; `observe` classifies a response and
records what it says about its bucket, so admission (`ratelimit.admission`) holds
every worker's next call to that bucket.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx2

from jobs.policy import RETRY, delay
from ratelimit.admission import INLINE_WAITS
from ratelimit.headers import LimitHeaders, parse_limit_headers
from ratelimit.observations import SECONDARY_RESOURCE, Kind, Observation, record

RATE_LIMIT_STATUSES = {403, 429}
TOO_MANY_REQUESTS = 429
SERVICE_UNAVAILABLE = 503
# The only answers of a plain host (not GitHub) that hold its other callers.
HOST_BLOCKING_STATUSES = frozenset({TOO_MANY_REQUESTS, SERVICE_UNAVAILABLE})
# GitHub's documented advice when a secondary limit comes without Retry-After.
SECONDARY_DEFAULT_WAIT_SECONDS = 60.0
SECONDARY_MESSAGES = ("secondary rate limit", "abuse detection")


@dataclass(frozen=True)
class Verdict:
    """How one response spoke about its bucket."""

    kind: str
    limits: LimitHeaders
    blocked_until: float | None = None  # set for secondary limits and bare 429s

    @property
    def limited(self) -> bool:
        return self.kind != Kind.OK


def _body_json(response: httpx2.Response) -> dict | None:
    try:
        body = json.loads(response.content)
    except httpx2.ResponseNotRead:
        return None  # a streamed body is the caller's to read
    except (ValueError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


def _graphql_rate_limited(body: dict | None) -> bool:
    errors = (body or {}).get("errors") or []
    return any(isinstance(e, dict) and e.get("type") == "RATE_LIMITED" for e in errors)


def classify(
    response: httpx2.Response, *, now: float, inline_step: int = 1, plain_host: bool = False
) -> Verdict:
    """Primary exhaustion, a secondary limit, another rate limit, or an ordinary answer.

    - secondary: 403/429 with Retry-After, or GitHub's secondary-limit message
      (then 60 s if no Retry-After came with it);
    - primary: 403/429 with `remaining` 0 (wait until the reset), or a GraphQL
      200 whose errors say RATE_LIMITED with `remaining` 0;
    - rate_limited: a 429 or RATE_LIMITED saying nothing about when: the inline
      wait number `inline_step` (INLINE_WAITS), recorded so other workers wait too;
    - a 503 with Retry-After is an ordinary answer (the caller retries it after that
      wait) whose Retry-After also holds every other call to the bucket.

    Only those answers block a bucket: any other status's Retry-After (a 200, a 301, a
    500) is no block. On a `plain_host` (not GitHub) only a 429 or a 503 speaks of a
    limit: a 403 is a refusal, and a body saying RATE_LIMITED is only content.
    """
    limits = parse_limit_headers(response.headers, now=now)
    body = _body_json(response)
    status = response.status_code
    exhausted = limits.remaining is not None and limits.remaining <= 0
    limit_statuses = {TOO_MANY_REQUESTS} if plain_host else RATE_LIMIT_STATUSES
    if status in limit_statuses:
        message = str((body or {}).get("message", "")).lower()
        if limits.retry_after is not None:
            return Verdict(Kind.SECONDARY, limits, now + limits.retry_after)
        if any(text in message for text in SECONDARY_MESSAGES):
            return Verdict(Kind.SECONDARY, limits, now + SECONDARY_DEFAULT_WAIT_SECONDS)
        if exhausted and limits.reset_at is not None:
            return Verdict(Kind.PRIMARY, limits)
        if status == TOO_MANY_REQUESTS:
            return Verdict(
                Kind.RATE_LIMITED, limits, now + delay(INLINE_WAITS, RETRY, step=inline_step)
            )
        return Verdict(Kind.OK, limits)  # a plain 403: forbidden, not a rate limit
    if status == SERVICE_UNAVAILABLE and limits.retry_after is not None:
        return Verdict(Kind.OK, limits, now + limits.retry_after)
    if not plain_host and _graphql_rate_limited(body):
        if exhausted and limits.reset_at is not None:
            return Verdict(Kind.PRIMARY, limits)
        return Verdict(
            Kind.RATE_LIMITED, limits, now + delay(INLINE_WAITS, RETRY, step=inline_step)
        )
    return Verdict(Kind.OK, limits)


def observe(response: httpx2.Response, *, key: str, resource: str, inline_step: int = 1) -> Verdict:
    """Classify `response` and record what it says about (key, resource)."""
    now = time.time()
    plain_host = key.startswith("host:")
    verdict = classify(response, now=now, inline_step=inline_step, plain_host=plain_host)
    if verdict.limits.is_empty and not verdict.limited and verdict.blocked_until is None:
        return verdict
    if plain_host and response.status_code not in HOST_BLOCKING_STATUSES:
        # A plain host's other answers block nobody, whatever their headers say: not
        # a Retry-After, and not a `remaining: 0` with a far reset either (its next call
        # is refused with a 429 if the host meant it, and that one blocks).
        return verdict
    # A plain host's bucket is the one admission asks about; GitHub names its own,
    # and its secondary limits hold for the whole credential.
    if not plain_host:
        if verdict.kind == Kind.SECONDARY:
            resource = SECONDARY_RESOURCE
        elif verdict.limits.resource:
            resource = verdict.limits.resource
    record(
        Observation.from_headers(
            key,
            resource,
            verdict.limits,
            kind=verdict.kind,
            status_code=response.status_code,
            observed_at=now,
            blocked_until=verdict.blocked_until,
        )
    )
    return verdict
