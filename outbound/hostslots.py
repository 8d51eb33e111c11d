"""Slots per origin (or per credential), shared by every worker through Redis, on Redis's clock.

An origin is scheme, host and port, spelled by `outbound.urls.origin_key`: one port of a
host that is down, or one spelling of a host, takes nothing from another's slots or
slow start. The limits below say "per host" in their setting names; each is per origin.

A limit says how many calls may be in flight at once (`concurrency`, 0: any
number) and how often one may start (`rate` per second, spaced evenly, no burst;
None: no spacing). Each pool keeps its own slots:

- page fetches: PAGE_FETCH_PER_HOST_CONCURRENCY per host, never waited for inline (an
  audit whose host is full is deferred to the delayed store and its thread moves on),
  and PAGE_FETCH_WARMUP_RATE starts a second to a host that has not answered lately;
- link checks: LINKCHECK_PER_HOST_CONCURRENCY and LINKCHECK_PER_HOST_RATE per host;
- GitHub: one call at a time per credential (GitHub's advice against secondary limits);
- webhook deliveries: WEBHOOK_PER_HOST_CONCURRENCY per destination host.

A slot is a lease in a sorted set that expires on its own, so a worker killed
mid-request frees its slot after the lease instead of never. The time is read
inside the script (Redis TIME): workers whose clocks disagree still agree on
who holds a slot and when the next call may start.
"""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from config.redis import REDIS_NOW_LUA, lua, redis_client
from jobs.errors import RateLimited

# The resource a RateLimited for busy slots names (beside the key it waits on).
SLOTS_RESOURCE = "slots"
# Polled while all slots are taken: nobody announces a release.
BUSY_POLL_SECONDS = 0.05
# The least a caller that gave up waiting is told to stay away.
MIN_RETRY_SECONDS = 1.0
# A host that answered within this long starts at full speed (SlotLimit.warmup_rate).
ANSWERED_SECONDS = 60

# Returns {1, 0, now_ms} when the slot is taken, {0, -1, now_ms} when all are busy,
# {0, wait_ms, now_ms} when the next start is spaced later, {0, -2, now_ms} when a host
# that has not answered lately is slow-started (untimed like a busy host: whoever waits
# on it backs off, since nobody knows when it will answer). Both limits are checked
# and the slot taken in one step, so two workers cannot both take the last one.
#
# With a fourth key, the call's rate-limit bucket (ratelimit.observations' hot hash, a
# bucket admission reads alone) and the caller's clock (ARGV[6], the clock observations
# are written in): its FIELDS follow the three values, read in the same round trip, and
# a bucket that is closed now takes no slot ({0, -3, now_ms, ...}): a host that blocked
# us is refused before a slot is taken, as when admission was read on its own first.
# A bucket Redis does not hold takes the slot; the caller reads the database then.
ACQUIRE = lua(
    REDIS_NOW_LUA
    + """
local inflight, next_key, answered_key, bucket = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, limit = ARGV[1], tonumber(ARGV[2])
local lease, interval = tonumber(ARGV[3]), tonumber(ARGV[4])
local warmup_interval = tonumber(ARGV[5])
local now = redis_now()
local now_ms = math.floor(now * 1000)
local word = {}
if bucket then
  word = redis.call('HMGET', bucket, 'observed_at', 'kind', 'status_code', 'limit',
                    'remaining', 'used', 'reset_at', 'blocked_until')
  local observed = tonumber(word[1] or '')
  if observed and observed ~= 0 then
    local caller_now = tonumber(ARGV[6])
    local blocked = tonumber(word[8] or '')
    local remaining, reset = tonumber(word[5] or ''), tonumber(word[7] or '')
    if (blocked and blocked > caller_now)
       or (remaining and remaining <= 0 and reset and reset > caller_now) then
      return {0, -3, now_ms, unpack(word)}
    end
  end
end
local warming = false
if interval == 0 and warmup_interval > 0 and redis.call('EXISTS', answered_key) == 0 then
  interval, warming = warmup_interval, true
end
redis.call('ZREMRANGEBYSCORE', inflight, '-inf', now)
if limit > 0 and redis.call('ZCARD', inflight) >= limit then
  return {0, -1, now_ms, unpack(word)}
end
if interval > 0 then
  local next_at = tonumber(redis.call('GET', next_key) or '0')
  if next_at > now then
    if warming then return {0, -2, now_ms, unpack(word)} end
    return {0, math.ceil((next_at - now) * 1000), now_ms, unpack(word)}
  end
  redis.call('SET', next_key, string.format('%.6f', now + interval),
             'PX', math.ceil(interval * 1000) + 1000)
end
redis.call('ZADD', inflight, now + lease, token)
redis.call('PEXPIRE', inflight, math.ceil(lease * 1000) + 1000)
return {1, 0, now_ms, unpack(word)}
"""
)


# A call's slot outlives the call's whole deadline (outbound.bounded) by this much, so a
# live call never loses its slot to clock skew, and a killed one frees it soon after.
CALL_SLOT_SLACK_SECONDS = 5.0


def call_lease(deadline_seconds: float) -> float:
    """The lease of a slot held for one outbound call whose whole deadline is given."""
    return deadline_seconds + CALL_SLOT_SLACK_SECONDS


@dataclass(frozen=True)
class SlotLimit:
    pool: str  # "pages", "links", "github", "webhooks": each pool keeps its own slots
    concurrency: int  # calls in flight at once; 0: any number
    lease: float  # seconds a slot is held at most (longer than any live call)
    rate: float | None = None  # calls started per second; None: no spacing
    per_credential: bool = False  # slots per admission key, not per host
    # Calls started per second to a host that has not answered lately (ANSWERED_SECONDS):
    # a slow start, so a host that is down meets a few calls before its breaker hears of
    # them, not a burst. None: no slow start.
    warmup_rate: float | None = None
    # False: a caller finding every slot busy raises RateLimited at once (retry_at None,
    # unless the rate spaces it), so its job is deferred instead of polling in its thread.
    wait_inline: bool = True
    # Slower rates for some names ((name, rate) pairs): a host whose robots.txt asks for a
    # Crawl-delay (outbound.integrations.robots). Never faster than `rate`.
    name_rates: tuple[tuple[str, float], ...] = ()

    @property
    def limits_anything(self) -> bool:
        return self.concurrency > 0 or bool(self.rate) or bool(self.name_rates)

    def rate_for(self, name: str) -> float | None:
        for slower_name, rate in self.name_rates:
            if slower_name == name:
                return min(rate, self.rate) if self.rate else rate
        return self.rate


@dataclass(frozen=True)
class Attempt:
    taken: bool
    # Not taken: seconds worth waiting; None when every slot is busy or the host is slow-started.
    wait: float | None
    now: float  # Redis's clock, epoch seconds
    warming: bool = False  # not taken because the host has not answered lately
    # Asked with a bucket: its hot hash's fields as HMGET gives them, and whether the
    # bucket being closed is why no slot was taken.
    bucket: list | None = None
    bucket_closed: bool = False


def _keys(limit: SlotLimit, name: str) -> list[str]:
    prefix = f"hostslots:{limit.pool}:{name}"
    return [f"{prefix}:inflight", f"{prefix}:next", f"{prefix}:answered"]


def try_acquire(
    limit: SlotLimit, name: str, token: str, *, bucket: tuple[str, float] | None = None
) -> Attempt:
    """Take one of `name`'s slots for `token`, if the limit allows it now; with `bucket`
    (a rate-limit bucket's hot key and the caller's clock), read that bucket in the same
    step and take no slot while it is closed (ACQUIRE)."""
    rate = limit.rate_for(name)
    interval = 1.0 / rate if rate else 0.0
    warmup_interval = 1.0 / limit.warmup_rate if limit.warmup_rate else 0.0
    keys = _keys(limit, name)
    args = [token, limit.concurrency, repr(limit.lease), repr(interval), repr(warmup_interval)]
    if bucket is not None:
        keys.append(bucket[0])
        args.append(repr(bucket[1]))
    taken, wait_ms, now_ms, *fields = ACQUIRE(keys=keys, args=args, client=redis_client())
    wait = None if wait_ms < 0 else wait_ms / 1000
    return Attempt(
        taken=bool(taken), wait=wait, now=now_ms / 1000, warming=wait_ms == -2,
        bucket=fields if bucket is not None else None, bucket_closed=wait_ms == -3,
    )  # fmt: skip


def release(limit: SlotLimit, name: str, token: str) -> None:
    redis_client().zrem(_keys(limit, name)[0], token)


def answered(limit: SlotLimit, name: str, *, pipe=None) -> None:
    """`name` gave an answer (not an error or a 5xx): no slow start for a while. With
    `pipe`, the write joins the caller's pipeline."""
    if limit.warmup_rate:
        (pipe or redis_client()).set(_keys(limit, name)[2], 1, ex=ANSWERED_SECONDS)


class Held:
    """A slot held for a block (`slot`): whether it was waited for, and its release, which
    the holder may send with its own writes (`release_into`) instead of on its own.
    Asked with a bucket: `bucket`, its fields as read with the slot (None: not asked), and
    `bucket_closed`, no slot taken because that bucket is closed."""

    def __init__(
        self,
        waited: bool = False,
        release: tuple | None = None,
        *,
        bucket: list | None = None,
        bucket_closed: bool = False,
    ):
        self.waited = waited
        self._release = release  # (limit, name, token); None: no slot was taken
        self.queued = False
        self.bucket = bucket
        self.bucket_closed = bucket_closed

    def release_into(self, pipe) -> None:
        """Queue the release into the holder's pipeline; the block's end then sends none.
        If that pipeline fails, call `not_sent()`: the block's end releases it then."""
        if self._release is not None and not self.queued:
            limit, name, token = self._release
            pipe.zrem(_keys(limit, name)[0], token)
            self.queued = True

    def not_sent(self) -> None:
        self.queued = False


NOTHING_HELD = Held()


@contextlib.contextmanager
def slot(
    limit: SlotLimit,
    name: str,
    *,
    key: str,
    max_wait: float | None,
    bucket: tuple[str, float] | None = None,
) -> Iterator[Held]:
    """Hold one of `name`'s slots for the block (a `Held`: whether it waited for it).

    `bucket` (a rate-limit bucket's hot key and the caller's clock) is read with each
    try for the slot: while it is closed no slot is taken and the block runs holding
    none (`Held.bucket_closed`), for the caller to act on the bucket's word.

    `max_wait` None never waits: a full host raises RateLimited at once with no
    retry time (nobody knows when a slot frees), for the job to back off. A number
    waits up to that many seconds, then raises RateLimited with the time worth
    trying again, so the job is deferred instead of holding a worker while other
    slow calls to the host run. `key` is the bucket the RateLimited names.
    """
    if not limit.limits_anything:
        yield NOTHING_HELD
        return
    token = uuid.uuid4().hex
    deadline = time.monotonic() + (max_wait or 0.0)
    waited = False
    while not (attempt := try_acquire(limit, name, token, bucket=bucket)).taken:
        if attempt.bucket_closed:
            yield Held(waited, None, bucket=attempt.bucket, bucket_closed=True)
            return
        # Every slot busy: poll again soon (jittered, so pollers do not line up).
        wait = (
            BUSY_POLL_SECONDS * random.uniform(0.5, 1.5) if attempt.wait is None else attempt.wait
        )
        if max_wait is None or time.monotonic() + wait > deadline:
            if max_wait is not None:
                retry_at = attempt.now + max(wait, MIN_RETRY_SECONDS)
            else:
                retry_at = None if attempt.wait is None else attempt.now + attempt.wait
            raise RateLimited(key, SLOTS_RESOURCE, retry_at, reason=_why_busy(limit, name, attempt))
        time.sleep(wait)
        waited = True
    held = Held(waited, (limit, name, token), bucket=attempt.bucket)
    try:
        yield held
    finally:
        if not held.queued:
            release(limit, name, token)


def _why_busy(limit: SlotLimit, name: str, attempt: Attempt) -> str:
    if attempt.warming:
        return f"{name} has not answered lately: {limit.warmup_rate:g} call(s) a second"
    if attempt.wait is None:
        return f"{name} is busy with {limit.concurrency} call(s) in flight"
    return f"{name} may start {limit.rate_for(name):g} call(s) a second"


@contextlib.contextmanager
def slot_of_any(limit: SlotLimit, names: list[str], *, key: str, reason: str) -> Iterator[str]:
    """Hold one slot of the first of `names` that has one free now, and yield its name.

    Never waits: with every name's slots busy it raises RateLimited at once with no
    retry time, so the job is deferred (no attempt spent) and its thread moves on.
    `key` is the bucket the RateLimited names; `reason` says why, in words a client may read.
    """
    token = uuid.uuid4().hex
    for name in names:
        if try_acquire(limit, name, token).taken:
            break
    else:
        raise RateLimited(key, SLOTS_RESOURCE, None, reason=reason)
    try:
        yield name
    finally:
        release(limit, name, token)
