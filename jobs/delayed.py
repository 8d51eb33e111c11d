"""The delayed store: every wait Plumb keeps outside the broker, one entry each.

A job that must wait longer than a worker may hold its message (a long Retry-After,
an open breaker, a rate limit, a busy host, a webhook retry) is stored here instead
of riding in the broker as an ETA message. One sorted set per queue, scored by the
time the job is due on the Redis server's clock, the one clock every process shares.
An entry may name a wake condition, the (admission key, resource) bucket it waits on:
when it comes due and that bucket is still closed, it waits on, without a run.

Each worker wakes the store of the queue it consumes (`jobs.bootsteps.DelayedWaker`),
in three steps:

1. lease: one Lua script moves the due entries to the queue's leased set with a
   deadline, so each entry goes to exactly one waker (expired leases are due again;
   so are entries due past the wait horizon, jobs.policy.wait_horizon, which no wait
   of today reaches: stored before the bound, they are published to end rate limited);
2. publish: the job's message goes to its queue, carrying the entry's id and a fresh
   publish id;
3. release: the entry leaves the leased set.

A waker that dies after step 1 leaves its leases to expire: the entries are woken
again, never lost. One that dies after step 2 leaves a published message and a lease
that will publish a second one; the first delivery to run claims the entry's id for
its publish id (`claim`), and any other publish of the same entry is acknowledged
without running. Redeliveries of the claiming message (its worker was SIGKILLed) run,
so the job is never lost and never runs twice.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import redis
from celery import current_app

from config.redis import REDIS_NOW_LUA, lua, redis_client
from jobs.policy import DEFERRAL, RetryPolicy, delay, too_long, wait_horizon

log = logging.getLogger(__name__)

# Message headers of a woken job: which entry it is, and which publish of it.
ENTRY_HEADER = "plumb_delayed_entry"
PUBLISH_HEADER = "plumb_delayed_publish"
# How long a waker may take between leasing an entry and releasing it.
LEASE_SECONDS = 30.0
WAKE_BATCH = 200
# A claim outlives any redelivery of the claiming message (visibility timeouts are minutes).
CLAIM_TTL_SECONDS = 24 * 3600

_SCHEDULE = lua(
    REDIS_NOW_LUA
    + """
local due = redis_now() + tonumber(ARGV[1])
redis.call('ZADD', KEYS[1], due, ARGV[2])
return tostring(due)
"""
)

# KEYS: delayed, leased. ARGV: batch, lease seconds, horizon seconds.
# Entries due past the horizon (stored before RATELIMIT_MAX_WAIT_SECONDS bounded every
# wait, or under a longer bound) are leased with the due ones: published now, each
# meets its block again and ends rate limited (jobs.task) instead of waiting for years.
_LEASE_DUE = lua(
    REDIS_NOW_LUA
    + """
local now = redis_now()
local batch = tonumber(ARGV[1])
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, member in ipairs(expired) do
  redis.call('ZREM', KEYS[2], member)
  redis.call('ZADD', KEYS[1], now, member)
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, batch)
if #due < batch then
  local beyond = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. (now + tonumber(ARGV[3])), '+inf',
    'LIMIT', 0, batch - #due)
  for _, member in ipairs(beyond) do table.insert(due, member) end
end
for _, member in ipairs(due) do
  redis.call('ZREM', KEYS[1], member)
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), member)
end
return due
"""
)

# Still waiting on its bucket: from the leased set back to the delayed one, due again
# in ARGV[2] seconds (only while this waker still holds the lease).
_POSTPONE = lua(
    REDIS_NOW_LUA
    + """
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  redis.call('ZADD', KEYS[1], redis_now() + tonumber(ARGV[2]), ARGV[1])
end
"""
)


@dataclass(frozen=True)
class Entry:
    """One waiting job: enough to publish its message again, as it was."""

    task: str
    queue: str
    task_id: str
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    retries: int = 0
    headers: dict = field(default_factory=dict)
    # What kind of wait (retry, deferral, park: jobs.policy) and why, for operators.
    wait: str = ""
    reason: str = ""
    # (admission key, resource) whose bucket must admit the job before it runs again.
    wait_on: tuple[str, str] | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def loads(cls, raw: bytes | str) -> Entry:
        data = json.loads(raw)
        if data.get("wait_on") is not None:
            data["wait_on"] = tuple(data["wait_on"])
        return cls(**data)


def delayed_key(queue: str) -> str:
    return f"jobs:delayed:{queue}"


def leased_key(queue: str) -> str:
    return f"jobs:delayed-leased:{queue}"


def claim_key(entry_id: str) -> str:
    return f"jobs:delayed-claim:{entry_id}"


# Says until when (epoch seconds) a bucket still refuses calls, or None when it admits
# them: set by the outbound rate-limit app, which owns admission (ratelimit.apps).
WakeCheck = Callable[[str, str], float | None]
_wake_check: WakeCheck | None = None


def set_wake_check(check: WakeCheck) -> None:
    global _wake_check
    _wake_check = check


def schedule(entry: Entry, *, delay: float, client: redis.Redis | None = None) -> float:
    """Store `entry` until `delay` seconds from now (Redis time); return when it is due."""
    due = _SCHEDULE(
        keys=[delayed_key(entry.queue)],
        args=[max(0.0, delay), entry.dumps()],
        client=client or redis_client(),
    )
    return float(due)


def waiting(queue: str, client: redis.Redis | None = None) -> int:
    """Entries of `queue` not yet published (leased ones included)."""
    pipe = (client or redis_client()).pipeline(transaction=False)
    pipe.zcard(delayed_key(queue))
    pipe.zcard(leased_key(queue))
    stored, leased = pipe.execute()
    return stored + leased


def entries(queue: str, client: redis.Redis | None = None) -> list[tuple[Entry, float]]:
    """Every stored entry of `queue` with its due time, soonest first (for tests and ops)."""
    rows = (client or redis_client()).zrange(delayed_key(queue), 0, -1, withscores=True)
    return [(Entry.loads(member), score) for member, score in rows]


def oldest_overdue_seconds(queues: list[str], client: redis.Redis) -> dict[str, float]:
    """How long the oldest entry of each queue has been due and not published (0 if none).

    Read only, for the gauge (jobs.apps): a live waker publishes an entry within a poll
    interval of its due time, so an age that grows means nothing wakes that queue. An
    entry whose lease expired counts from the latest it can have been due (its deadline
    less the lease), since the waker that leased it died or hung before publishing.
    """
    pipe = client.pipeline(transaction=False)
    pipe.time()
    for queue in queues:
        pipe.zrange(delayed_key(queue), 0, 0, withscores=True)
        pipe.zrange(leased_key(queue), 0, 0, withscores=True)
    (seconds, micros), *firsts = pipe.execute()
    now = seconds + micros / 1_000_000
    ages = {}
    for index, queue in enumerate(queues):
        stored, leased = firsts[2 * index], firsts[2 * index + 1]
        due_since = [score for _, score in stored if score <= now]
        due_since += [score - LEASE_SECONDS for _, score in leased if score <= now]
        ages[queue] = max(0.0, now - min(due_since)) if due_since else 0.0
    return ages


def lease_due(
    queue: str,
    *,
    client: redis.Redis,
    lease_seconds: float = LEASE_SECONDS,
    batch: int = WAKE_BATCH,
) -> list[bytes]:
    """Step 1: lease the due entries of `queue` (and those whose lease expired, and those
    due past the wait horizon, jobs.policy.wait_horizon)."""
    return _LEASE_DUE(
        keys=[delayed_key(queue), leased_key(queue)],
        args=[batch, lease_seconds, wait_horizon()],
        client=client,
    )


def publish(entry: Entry, *, app=None) -> None:
    """Step 2: send the entry's job to its queue: same task id, same retries, no attempt spent."""
    (app or current_app).send_task(
        entry.task,
        args=entry.args,
        kwargs=entry.kwargs,
        task_id=entry.task_id,
        queue=entry.queue,
        retries=entry.retries,
        headers={**entry.headers, ENTRY_HEADER: entry.id, PUBLISH_HEADER: uuid.uuid4().hex},
    )


def release(queue: str, member: bytes, *, client: redis.Redis) -> None:
    """Step 3: the entry's message is out; its lease goes."""
    client.zrem(leased_key(queue), member)


def wake_due(queue: str, *, client: redis.Redis, app=None) -> int:
    """Publish every entry of `queue` that has come due; return how many were published."""
    woken = 0
    while True:
        members = lease_due(queue, client=client)
        for member in members:
            entry = Entry.loads(member)
            blocked_for = _still_blocked_for(entry, client)
            # Past the bound the job is published all the same: it meets the block and
            # ends rate limited (jobs.task), rather than waiting on in the store.
            if blocked_for is not None and not too_long(blocked_for):
                # A newer answer closed its bucket for longer: wait that out in full.
                postpone = delay(RetryPolicy(), DEFERRAL, after=blocked_for)
                _POSTPONE(
                    keys=[delayed_key(queue), leased_key(queue)],
                    args=[member, postpone],
                    client=client,
                )
                log.info(
                    "delayed.postponed",
                    extra={"task": entry.task, "task_id": entry.task_id,
                           "wait_on": entry.wait_on, "delay_seconds": round(postpone, 3)},
                )  # fmt: skip
                continue
            publish(entry, app=app)
            release(queue, member, client=client)
            woken += 1
        if len(members) < WAKE_BATCH:
            return woken


def _still_blocked_for(entry: Entry, client: redis.Redis) -> float | None:
    """Seconds the entry's bucket still refuses calls, or None (wake it)."""
    if entry.wait_on is None or _wake_check is None:
        return None
    until = _wake_check(*entry.wait_on)
    if until is None:
        return None
    seconds, micros = client.time()
    remaining = until - (seconds + micros / 1_000_000)
    return remaining if remaining > 0 else None


def claim(headers: dict | None, *, client: redis.Redis | None = None) -> bool:
    """May this delivery run? False for a second publish of an entry another one claimed.

    A message that did not come from the store always may. The first delivery of an
    entry claims it for its publish id; a redelivery of that same message may run.
    """
    headers = headers or {}
    entry_id, publish_id = headers.get(ENTRY_HEADER), headers.get(PUBLISH_HEADER)
    if not entry_id or not publish_id:
        return True
    client = client or redis_client()
    key = claim_key(entry_id)
    if client.set(key, publish_id, nx=True, ex=CLAIM_TTL_SECONDS):
        return True
    owner = client.get(key)
    return owner is not None and owner.decode() == publish_id
