"""Admission before an outbound call: go now, or wait until T.

Admission reads the newest observation of exactly the bucket the call will
spend (admission key and resource), so a row about another bucket (the App
JWT's, graphql's) can neither clear nor extend this one's backoff. A short
wait is slept inline on a jittered ladder; a longer one (over
RATELIMIT_INLINE_MAX_WAIT_SECONDS) is raised as `RateLimited`, which tasks hand
to `ratelimit.retry.defer`: a delayed retry at T plus jitter that does not
consume an attempt.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from jobs.errors import RateLimited  # noqa: F401 (interim, until the outbound merge)
from ratelimit.observations import SECONDARY_RESOURCE, latest

# The inline ladder: 0.5 s, 1 s, 2 s, ... each scaled by a factor in [0.5, 1.5],
# so callers that hit the same limit together do not come back together.
INLINE_LADDER_BASE_SECONDS = 0.5
INLINE_JITTER_LOW, INLINE_JITTER_HIGH = 0.5, 1.5
# Inline retries of one call before it is handed to the queue instead.
MAX_INLINE_RETRIES = 3


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


def inline_delay(step: int, *, at_least: float = 0.0, rng: random.Random | None = None) -> float:
    """Seconds to sleep before inline retry number `step` (0 for the first).

    Never less than `at_least` (a Retry-After or a reset is obeyed in full); the
    jitter is added on top of it, never taken off.
    """
    rng = rng or random
    rung = (
        INLINE_LADDER_BASE_SECONDS * (2**step) * rng.uniform(INLINE_JITTER_LOW, INLINE_JITTER_HIGH)
    )
    if at_least <= 0:
        return rung
    return at_least + rng.uniform(0, rung)
