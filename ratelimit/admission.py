"""Admission before an outbound call: go now, or wait until T.

Admission reads the newest observation of exactly the bucket the call will
spend (admission key and resource), so a row about another bucket (the App
JWT's, graphql's) can neither clear nor extend this one's backoff. The outbound
sender (`outbound.client.OutboundClient`) sleeps a short wait inline, spaced by
INLINE_WAITS through the one delay function (`jobs.policy.delay`); a longer one
(over RATELIMIT_INLINE_MAX_WAIT_SECONDS) it raises as `jobs.errors.RateLimited`,
which the job runtime turns into a deferral at T plus jitter that does not
consume an attempt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from jobs.policy import RetryPolicy
from ratelimit.observations import SECONDARY_RESOURCE, from_hot, latest

# Inline retries of one call before it is handed to the queue instead.
MAX_INLINE_RETRIES = 3
INLINE_WAIT_BASE_SECONDS = 0.5
# Inline waits: 0.5 s, 1 s, 2 s, 4 s, jittered, so callers that hit the same limit
# together do not come back together; a wait somebody named is slept in full plus jitter.
INLINE_WAITS = RetryPolicy(
    max_attempts=lambda: MAX_INLINE_RETRIES + 1,
    backoff_base=lambda: INLINE_WAIT_BASE_SECONDS,
    backoff_max=lambda: INLINE_WAIT_BASE_SECONDS * 2**MAX_INLINE_RETRIES,
    counts_as_job=False,
)


@dataclass(frozen=True)
class Admission:
    key: str
    resource: str
    until: float | None = None  # epoch seconds; None: go now

    @property
    def go(self) -> bool:
        return self.until is None

    def wait_seconds(self, now: float | None = None) -> float:
        if self.until is None:
            return 0.0
        return max(0.0, self.until - (time.time() if now is None else now))


def admit(key: str, resource: str, *, now: float | None = None) -> Admission:
    """Go, or wait until the later of this bucket's reset/block and its key's secondary block.

    GitHub's secondary limits hold for a credential across REST and GraphQL, so
    they are kept as one more bucket of the key (`secondary`) that every call
    with that key also asks about.
    """
    now = time.time() if now is None else now
    buckets = [resource]
    if not key.startswith("host:") and resource != SECONDARY_RESOURCE:
        buckets.append(SECONDARY_RESOURCE)
    waits = []
    for bucket in buckets:
        observation = latest(key, bucket)
        if observation is not None and (until := observation.wait_until(now)) is not None:
            waits.append(until)
    return Admission(key=key, resource=resource, until=max(waits) if waits else None)


def reads_one_bucket(key: str, resource: str) -> bool:
    """Admission of (key, resource) reads that bucket alone: a plain host's, or the
    secondary bucket itself (GitHub's credentials also read their `secondary`)."""
    return key.startswith("host:") or resource == SECONDARY_RESOURCE


def admit_read(key: str, resource: str, raw: list | None, *, now: float) -> Admission:
    """`admit` for a bucket read alone (`reads_one_bucket`), from its hot hash as read
    together with the call's slot (outbound.hostslots.try_acquire); a hash Redis does not
    hold (raw None, or its first field None) is asked of `admit`, which reads the database."""
    if raw is None or raw[0] is None:
        return admit(key, resource, now=now)
    observation = from_hot(key, resource, raw)
    until = None if observation is None else observation.wait_until(now)
    return Admission(key=key, resource=resource, until=until)
