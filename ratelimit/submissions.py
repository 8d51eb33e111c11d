"""Admission of audit submissions: the client's token bucket and the backlog backstop.

One Lua script decides a submission: it refills the client's bucket, reads the
backlog (audits.backlog), decides, takes the token only if the submission is
admitted, and counts the decision, all in one round trip and one atomic step, so
a count can never disagree with the decisions made. The order:

1. bucket empty -> refused_ip (429, Retry-After: whole seconds until a token);
2. backlog >= AUDIT_QUEUE_MAX_DEPTH -> refused_backlog (503);
3. otherwise admitted.

A refused submission takes no token and writes nothing but its count.

The check-then-act window: the script reads the backlog, and the admitted audit
reaches the queue only after the view has written its row and committed. Another
submission checked inside that window does not see it. Each request handler holds
at most one submission in the window, so with H handlers across all web processes
(gunicorn workers x threads) the backlog can reach at most
AUDIT_QUEUE_MAX_DEPTH + H - 1. It's OK to be this inexact: H is small and fixed by
the deployment, while closing the window would cost a reservation and a second
round trip on every submission. Pinned by
tests/test_admission_live.py::test_concurrent_submissions_overshoot_the_cap_by_at_most_the_handlers_minus_one.

Audits alive but not backlog, so not refused on: the running attempts (at most one
per worker slot; they are not owed a slot) and, for a moment, a message a worker has
popped off the list but not yet recorded in `unacked` (at most one per worker). In a
fail-fast outage, where every attempt goes straight back into backoff, admitted
audits stay within cap + slots + workers + H - 1: pinned by
tests/test_admission_live.py::test_a_fail_fast_outage_admits_no_more_than_the_cap_plus_the_bounded_overshoot.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import redis
from django.conf import settings

from audits.backlog import (
    AUDIT_BACKLOG_LUA,
    REDIS_NOW_LUA,
    backlog_keys,
    backlog_snapshot,
    parked_grace_seconds,
)
from config.redis import LuaScript, redis_client
from observability.metrics import admission_metric_keys, record_admission
from ratelimit.buckets import TOKEN_BUCKET_LUA, BucketAnswer, submit_bucket_key
from reaudit.services import count_scheduled

log = logging.getLogger(__name__)

COUNTS_KEY = "admission:counts"
ADMITTED, REFUSED_IP, REFUSED_BACKLOG = "admitted", "refused_ip", "refused_backlog"
IN_BACKOFF_SUFFIX = "_in_backoff"
# Room opens as soon as one audit starts, so the wait is short; the spread keeps
# the clients refused together from all coming back in the same second.
BACKLOG_RETRY_AFTER_SECONDS = (5, 15)

# KEYS: bucket, counts, metrics counter, metrics minute bucket, then backlog_keys().
# ARGV: burst, tokens per second, max depth, parked grace, bucket expiry.
_ADMIT = LuaScript(
    REDIS_NOW_LUA
    + TOKEN_BUCKET_LUA
    + AUDIT_BACKLOG_LUA
    + """
local now = redis_now()
local burst, per_second, max_depth = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tokens = bucket_tokens(KEYS[1], now, burst, per_second)
local waiting, retrying, running = audit_backlog(5, now, tonumber(ARGV[4]))
local decision = 'admitted'
if tokens < 1 then
  decision = 'refused_ip'
elseif waiting + retrying >= max_depth then
  decision = 'refused_backlog'
else
  bucket_take(KEYS[1], now, tokens, burst, per_second)
end
redis.call('HINCRBY', KEYS[2], decision, 1)
if retrying > 0 then
  redis.call('HINCRBY', KEYS[2], decision .. '_in_backoff', 1)
end
-- The metrics (observability.metrics.admission_metric_keys) in the same step, so a
-- decision costs one round trip: the counter's field is its labels as JSON.
local in_backoff = 'false'
if retrying > 0 then in_backoff = 'true' end
local counter, bucket = KEYS[3], KEYS[4]
redis.call('HINCRBY', counter, '["' .. decision .. '", "' .. in_backoff .. '"]', 1)
redis.call('HINCRBY', bucket, 'admissions:' .. decision, 1)
if retrying > 0 then
  redis.call('HINCRBY', bucket, 'admissions_in_backoff:' .. decision, 1)
end
redis.call('EXPIREAT', bucket, tonumber(ARGV[5]))
return {decision, tostring(bucket_wait(tokens, per_second)), waiting, retrying, running}
"""
)


class AdmissionUnavailable(Exception):
    """Redis could not be asked: nothing may be admitted, and nothing was written."""


@dataclass(frozen=True)
class Decision:
    outcome: str
    client_ip: str
    waiting: int
    retrying: int
    running: int
    max_depth: int
    # Whole seconds a refused client should wait before trying again (0 if admitted).
    retry_after: int = 0

    @property
    def admitted(self) -> bool:
        return self.outcome == ADMITTED

    @property
    def backlog(self) -> int:
        return self.waiting + self.retrying


def _retry_after(outcome: str, bucket_wait_seconds: float) -> int:
    if outcome == REFUSED_IP:
        return BucketAnswer(allowed=False, wait_seconds=bucket_wait_seconds).retry_after
    if outcome == REFUSED_BACKLOG:
        return random.randint(*BACKLOG_RETRY_AFTER_SECONDS)
    return 0


def admit_submission(ip: str, *, client: redis.Redis | None = None) -> Decision:
    """Decide one submission from `ip` and count it. Raises AdmissionUnavailable."""
    max_depth = settings.AUDIT_QUEUE_MAX_DEPTH
    try:
        counter, bucket, bucket_expiry = admission_metric_keys()
        outcome, wait, waiting, retrying, running = _ADMIT(
            client or redis_client(),
            [submit_bucket_key(ip), COUNTS_KEY, counter, bucket, *backlog_keys()],
            [
                settings.AUDIT_SUBMIT_BURST,
                settings.AUDIT_SUBMIT_RATE_PER_MINUTE / 60,
                max_depth,
                parked_grace_seconds(),
                bucket_expiry,
            ],
        )
    except redis.RedisError as exc:
        log.warning(
            "admission.unavailable", extra={"client_ip": ip, "error": exc.__class__.__name__}
        )
        raise AdmissionUnavailable(str(exc)) from exc
    outcome = outcome.decode()
    decision = Decision(
        outcome=outcome,
        client_ip=ip,
        waiting=int(waiting),
        retrying=int(retrying),
        running=int(running),
        max_depth=max_depth,
        retry_after=_retry_after(outcome, float(wait)),
    )
    record_decision(decision)
    return decision


def record_decision(decision: Decision) -> None:
    """Every decision passes here once: the one place to observe admission.

    The counts (`admission_counts` and the metrics) were taken by the script itself,
    in the same atomic step as the decision; this logs a refusal with what it saw.
    """
    record_admission(
        decision.outcome,
        write=False,
        in_backoff=decision.retrying > 0,
        backlog=decision.backlog,
        client_ip=decision.client_ip,
        waiting=decision.waiting,
        retrying=decision.retrying,
        running=decision.running,
        max_depth=decision.max_depth,
    )


def admission_counts(client: redis.Redis | None = None) -> dict[str, int]:
    """Decisions so far: admitted / refused_ip / refused_backlog, each also `_in_backoff`."""
    raw = (client or redis_client()).hgetall(COUNTS_KEY)
    counts = {name.decode(): int(value) for name, value in raw.items()}
    names = [ADMITTED, REFUSED_IP, REFUSED_BACKLOG]
    return {
        name: counts.get(name, 0) for base in names for name in (base, base + IN_BACKOFF_SUFFIX)
    }


def queue_report(client: redis.Redis | None = None) -> dict[str, int]:
    """What GET /api/queue and `manage.py queue_depth` show. Raises RedisError."""
    client = client or redis_client()
    snapshot = backlog_snapshot(client)
    return {
        "backlog": snapshot.backlog,
        "waiting": snapshot.waiting,
        "retrying": snapshot.retrying,
        "running": snapshot.running,
        "scheduled": count_scheduled(),
        "max_depth": settings.AUDIT_QUEUE_MAX_DEPTH,
    }
