"""Reading what downstreams say about when to come back."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

# x-ratelimit-reset is an epoch timestamp at GitHub and most APIs, but a number of
# seconds at some others. No real delta is this large (about 31 years), and no
# epoch this small is in the future, so the value itself tells them apart.
EPOCH_THRESHOLD = 1_000_000_000
# The farthest a response may put a time (Retry-After, a reset): any value beyond it,
# however absurd (400 digits, a year-9999 date, an epoch of 1e300), reads as this far,
# so every time stays a number a datetime, Redis and PostgreSQL can hold. A wait this
# long is never waited anyway (RATELIMIT_MAX_WAIT_SECONDS); the time is only reported.
FARTHEST_SECONDS = 100 * 365 * 24 * 3600
# Counts (limit, remaining, used) fit a PostgreSQL integer.
LARGEST_COUNT = 2**31 - 1
# More digits than any real value has: read as "beyond FARTHEST_SECONDS" without
# converting them (Python refuses to convert more than 4,300 digits to an int).
MAX_DIGITS = 15


def _seconds_ahead(seconds: float) -> float:
    """`seconds` clamped to [0, FARTHEST_SECONDS] (NaN reads as 0)."""
    if seconds != seconds or seconds <= 0:
        return 0.0
    return min(seconds, float(FARTHEST_SECONDS))


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP-date.

    Never shortened; a date in the past means "now" (0), anything farther than
    FARTHEST_SECONDS reads as that far. Returns None when the header is absent or
    unreadable (a negative number, "inf"), so the caller falls back to its own backoff.
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if text.isascii() and text.isdigit():
        return _seconds_ahead(float(FARTHEST_SECONDS) if len(text) > MAX_DIGITS else float(text))
    try:
        when = parsedate_to_datetime(text)
        stamp = when.timestamp() if when is not None else None
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if stamp is None:
        return None
    current = time.time() if now is None else now
    return _seconds_ahead(stamp - current)


@dataclass(frozen=True)
class LimitHeaders:
    """What one response said about its bucket. Every field may be absent."""

    limit: int | None = None
    remaining: int | None = None
    used: int | None = None
    reset_at: float | None = None  # epoch seconds
    resource: str | None = None
    retry_after: float | None = None  # seconds from `now`
    policy: str | None = None

    @property
    def is_empty(self) -> bool:
        return all(
            value is None for value in (self.limit, self.remaining, self.reset_at, self.retry_after)
        )


def _number(value: str | None) -> float | None:
    """A number (400 digits read as infinity, clamped by the caller), or None when absent
    or unreadable (NaN included)."""
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return None if math.isnan(number) else number


def _int(value: str | None) -> int | None:
    number = _number(value)
    if number is None:
        return None
    return int(max(-LARGEST_COUNT, min(LARGEST_COUNT, number)))


def _delta_reset(value: str | None, now: float) -> float | None:
    number = _number(value)
    return None if number is None else now + _seconds_ahead(number)


def _reset_at(value: str | None, now: float) -> float | None:
    number = _number(value)
    if number is None:
        return None
    if number >= EPOCH_THRESHOLD:
        return now + _seconds_ahead(number - now) if number > now else number
    return now + _seconds_ahead(number)


# IETF draft fields. Older drafts: `RateLimit: limit=100, remaining=50, reset=30`
# (or separate RateLimit-Limit/-Remaining/-Reset); newer ones:
# `RateLimit: "default";r=50;t=30` with `RateLimit-Policy: "default";q=100;w=60`.
_PARAM = re.compile(r"(?:^|[;,\s])([a-z]+)\s*=\s*\"?([0-9]+)\"?", re.IGNORECASE)
_POLICY_NAME = re.compile(r'^\s*"?([A-Za-z0-9_.-]+)"?\s*(?:;|$)')


def _structured_params(value: str | None) -> dict[str, str]:
    if not value:
        return {}
    first_item = value.split(",")[0] if re.search(r";\s*[rt]\s*=", value) else value
    return {name.lower(): number for name, number in _PARAM.findall(first_item)}


def parse_limit_headers(headers: Mapping[str, str], *, now: float | None = None) -> LimitHeaders:
    """The bucket state a response reports, from GitHub-style, IETF or Retry-After fields.

    `headers` is any case-insensitive mapping (httpx2.Headers). GitHub's
    `x-ratelimit-*` fields win over the IETF ones when both are present.
    """
    current = time.time() if now is None else now
    limit = _int(headers.get("x-ratelimit-limit"))
    remaining = _int(headers.get("x-ratelimit-remaining"))
    used = _int(headers.get("x-ratelimit-used"))
    reset_at = _reset_at(headers.get("x-ratelimit-reset"), current)
    resource = (headers.get("x-ratelimit-resource") or "").strip() or None

    ietf = _structured_params(headers.get("ratelimit"))
    policy_field = headers.get("ratelimit-policy")
    policy = _structured_params(policy_field)
    if limit is None:
        limit = _int(ietf.get("limit") or policy.get("q") or headers.get("ratelimit-limit"))
        if limit is None and policy_field:
            # Old drafts: `RateLimit-Policy: 100;w=60` (the quota comes first, unnamed).
            limit = _int(policy_field.split(";")[0].split(",")[0])
    if remaining is None:
        remaining = _int(
            ietf.get("remaining") or ietf.get("r") or headers.get("ratelimit-remaining")
        )
    if reset_at is None:
        # IETF reset is always delta-seconds.
        reset_at = _delta_reset(
            ietf.get("reset") or ietf.get("t") or headers.get("ratelimit-reset"), current
        )
    policy_name = None
    if (
        policy_field
        and (match := _POLICY_NAME.match(policy_field))
        and not match.group(1).isdigit()
    ):
        policy_name = match.group(1)

    return LimitHeaders(
        limit=limit,
        remaining=remaining,
        used=used,
        reset_at=reset_at,
        resource=resource,
        retry_after=parse_retry_after(headers.get("retry-after"), now=current),
        policy=policy_name,
    )
