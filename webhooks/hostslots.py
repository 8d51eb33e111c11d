"""Deliveries in flight per destination host, across every webhooks worker.

A Redis sorted set per host holds one member per delivery in flight, scored
by when its slot expires. Taking a slot first drops the expired members, so a
slot held by a worker that was SIGKILLed frees itself after `slot_ttl()`
instead of leaking forever. A slot is never waited for: a delivery that finds
its host full is deferred (webhooks.tasks) and its worker thread moves on.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

from django.conf import settings

from config.redis import redis_client

# TIME is read inside the script so workers with skewed clocks agree.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
  redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])) + 1)
  return 1
end
return 0
"""


def slot_key(host: str) -> str:
    return f"webhooks:host-slots:{host}"


def slot_ttl() -> float:
    """Longer than any live attempt holds a slot: the request timeout, twice, plus slack."""
    return 2 * settings.WEBHOOK_TIMEOUT_SECONDS + 5


def try_acquire(host: str, *, limit: int, ttl: float) -> str | None:
    """A slot's token, or None when `limit` deliveries to `host` are already in flight."""
    token = uuid.uuid4().hex
    client = redis_client()
    acquired = client.eval(_ACQUIRE, 1, slot_key(host), limit, ttl, token)
    return token if acquired else None


def release(host: str, token: str) -> None:
    redis_client().zrem(slot_key(host), token)


@contextlib.contextmanager
def host_slot(host: str) -> Iterator[bool]:
    """True inside the block when a slot for `host` was taken (always, with no limit set)."""
    limit = settings.WEBHOOK_PER_HOST_CONCURRENCY
    if not limit:
        yield True
        return
    token = try_acquire(host, limit=limit, ttl=slot_ttl())
    try:
        yield token is not None
    finally:
        if token is not None:
            release(host, token)
