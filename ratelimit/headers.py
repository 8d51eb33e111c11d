"""Reading what downstreams say about when to come back."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

# x-ratelimit-reset is an epoch timestamp at GitHub and most APIs, but a number of
# seconds at some others. No real delta is this large (about 31 years), and no
# epoch this small is in the future, so the value itself tells them apart.
EPOCH_THRESHOLD = 1_000_000_000


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP-date.

    Never truncated; a date in the past means "now" (0). Returns None when the
    header is absent or unreadable, so the caller falls back to its own backoff.
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


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


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(float(value.strip()))
    except ValueError:
        return None


def _reset_at(value: str | None, now: float) -> float | None:
    number = _int(value)
    if number is None:
        return None
    return float(number) if number >= EPOCH_THRESHOLD else now + max(0, number)


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

    `headers` is any case-insensitive mapping (httpx.Headers). GitHub's
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
        delta = _int(ietf.get("reset") or ietf.get("t") or headers.get("ratelimit-reset"))
        reset_at = current + max(0, delta) if delta is not None else None
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
