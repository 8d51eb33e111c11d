"""Politeness, shared by every worker through Redis: how many calls at once, how often.

Link checks: at most LINKCHECK_PER_HOST_CONCURRENCY requests in flight to one
host, and at most LINKCHECK_PER_HOST_RATE requests per second to it (spaced
evenly, no burst). GitHub API calls: one at a time per credential, as GitHub
asks of integrations to stay clear of its secondary limits. A slot is a lease in
a sorted set that expires on its own, so a worker killed mid-request frees its
slot after the lease instead of never.
"""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from django.conf import settings

from config.redis import redis_client
from ratelimit.admission import RateLimited

# Polled while all slots are taken: nobody announces a release.
BUSY_POLL_SECONDS = 0.05
POLITENESS_RESOURCE = "politeness"

# Returns {1, 0} when the slot is taken, {0, wait_ms} otherwise. Both limits are
# checked and the slot taken in one step, so two workers cannot both take the last one.
ACQUIRE_SCRIPT = """
local inflight, next_key = KEYS[1], KEYS[2]
local now = tonumber(ARGV[1])
local token, limit = ARGV[2], tonumber(ARGV[3])
local lease, interval = tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', inflight, '-inf', now)
if redis.call('ZCARD', inflight) >= limit then
  return {0, -1}
end
local next_at = tonumber(redis.call('GET', next_key) or '0')
if next_at > now then
  return {0, math.ceil((next_at - now) * 1000)}
end
redis.call('SET', next_key, tostring(math.max(now, next_at) + interval), 'PX', math.ceil(interval * 1000) + 1000)
redis.call('ZADD', inflight, now + lease, token)
redis.call('PEXPIRE', inflight, math.ceil(lease * 1000) + 1000)
return {1, 0}
"""


@dataclass(frozen=True)
class Politeness:
    concurrency: int
    rate: float | None = None  # requests per second; None: no spacing
    per_admission_key: bool = False  # one set of slots per credential, not per host

    @classmethod
    def for_link_checks(cls) -> Politeness:
        return cls(settings.LINKCHECK_PER_HOST_CONCURRENCY, settings.LINKCHECK_PER_HOST_RATE)


GITHUB_SERIAL = Politeness(concurrency=1, per_admission_key=True)


def _keys(host: str) -> list[str]:
    return [f"politeness:inflight:{host}", f"politeness:next:{host}"]


def try_acquire(
    host: str, token: str, *, politeness: Politeness, lease: float, now: float | None = None
) -> float | None:
    """Take a slot for `host`: None if taken, else seconds worth waiting before trying again."""
    now = time.time() if now is None else now
    interval = 1.0 / politeness.rate if politeness.rate else 0.0
    taken, wait_ms = redis_client().eval(
        ACQUIRE_SCRIPT,
        2,
        *_keys(host),
        repr(now),
        token,
        politeness.concurrency,
        repr(lease),
        repr(interval),
    )
    if taken:
        return None
    return BUSY_POLL_SECONDS * random.uniform(0.5, 1.5) if wait_ms < 0 else wait_ms / 1000


def release(host: str, token: str) -> None:
    redis_client().zrem(_keys(host)[0], token)


@contextlib.contextmanager
def polite_slot(
    host: str, *, politeness: Politeness, admission_key: str, lease: float, max_wait: float
) -> Iterator[None]:
    """Hold one of `host`'s slots for the block; wait for one at most `max_wait` seconds.

    A host that stays busy longer raises `RateLimited`, so the task is deferred
    briefly instead of holding a worker while another slow call to the host runs.
    """
    token = uuid.uuid4().hex
    deadline = time.monotonic() + max_wait
    while (wait := try_acquire(host, token, politeness=politeness, lease=lease)) is not None:
        if time.monotonic() + wait > deadline:
            raise RateLimited(
                admission_key,
                POLITENESS_RESOURCE,
                time.time() + max(wait, 1.0),
                reason=f"{host} is busy with {politeness.concurrency} call(s) in flight",
            )
        time.sleep(wait)
    try:
        yield
    finally:
        release(host, token)
