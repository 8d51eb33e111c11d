"""The backlog owed to the audit workers: what admission refuses submissions on.

    backlog = waiting + retrying

- waiting: messages on the `audits` queue's Redis lists, the main key and every
  priority sub-queue (kombu names them queue + '\\x06\\x16' + priority).
- retrying: messages an `audits` worker holds without running them. kombu takes an
  ETA message (a Celery retry inside its backoff) off the list at once and keeps it
  in the `unacked:audits` hash until it is acked, so the hash holds every retry in
  backoff, every running attempt (acks are late), and the few messages a worker has
  prefetched and is about to start. Subtracting the running attempts, which the
  audit registers itself (`note_started` / `note_stopped`), leaves the ones still
  owed a slot. Audits parked outside the broker (`note_parked`) count here too.

Not counted: running audits, and anything on the `reaudit` queue (scheduled
placements): its workers keep their own unacked keys (config.celery_app).

Each count is O(1) in Redis (LLEN, HLEN, ZCARD, plus trimming expired entries), so
the check costs the same with 100 or 100,000 held messages, and the whole read is
one Lua script: one round trip, one consistent moment.

Both registries heal themselves. A running entry is a lease that outlives the
task's hard time limit, so the entry of a process that died vanishes within that
limit; until then the audits that process held are under-counted by one each. A
parked entry is dropped once its due time is a visibility timeout in the past, so a
lost `note_started` over-counts for a bounded time only. The registry writes are
best effort: an audit runs even when its bookkeeping cannot be written.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis
from django.conf import settings

from config.celery_app import queue_list_keys, unacked_key_for_queue
from config.redis import LuaScript, redis_client

log = logging.getLogger(__name__)

RUNNING_KEY = "backlog:audits:running"
PARKED_KEY = "backlog:audits:parked"
# A running lease outlives the hard time limit by this much, so clock skew between
# a worker host and Redis never drops the entry of a live attempt.
RUNNING_LEASE_MARGIN_SECONDS = 30

REDIS_NOW_LUA = """
local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""

# KEYS (from `backlog_keys`): unacked hash, running zset, parked zset, then the queue lists.
AUDIT_BACKLOG_LUA = """
local function audit_backlog(first_key, now, parked_grace)
  local unacked_key, running_key, parked_key = KEYS[first_key], KEYS[first_key + 1], KEYS[first_key + 2]
  local waiting = 0
  for i = first_key + 3, #KEYS do
    waiting = waiting + redis.call('LLEN', KEYS[i])
  end
  redis.call('ZREMRANGEBYSCORE', running_key, '-inf', now)
  redis.call('ZREMRANGEBYSCORE', parked_key, '-inf', now - parked_grace)
  local running = redis.call('ZCARD', running_key)
  local held = redis.call('HLEN', unacked_key) - running
  if held < 0 then held = 0 end
  return waiting, held + redis.call('ZCARD', parked_key), running
end
"""

_SNAPSHOT = LuaScript(
    REDIS_NOW_LUA
    + AUDIT_BACKLOG_LUA
    + """
local waiting, retrying, running = audit_backlog(1, redis_now(), tonumber(ARGV[1]))
return {waiting, retrying, running}
"""
)

_NOTE_STARTED = LuaScript(
    REDIS_NOW_LUA
    + """
redis.call('ZADD', KEYS[1], redis_now() + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
"""
)

_NOTE_PARKED = LuaScript(
    REDIS_NOW_LUA
    + """
redis.call('ZADD', KEYS[1], redis_now() + tonumber(ARGV[2]), ARGV[1])
"""
)


@dataclass(frozen=True)
class BacklogSnapshot:
    waiting: int
    retrying: int
    running: int

    @property
    def backlog(self) -> int:
        return self.waiting + self.retrying


def backlog_keys() -> list[str]:
    """KEYS for AUDIT_BACKLOG_LUA, in its order."""
    queue = settings.AUDIT_QUEUE
    return [unacked_key_for_queue(queue), RUNNING_KEY, PARKED_KEY, *queue_list_keys(queue)]


def parked_grace_seconds() -> int:
    """How long past its due time a parked entry is trusted: a visibility timeout."""
    return settings.AUDITS_VISIBILITY_TIMEOUT_SECONDS


def backlog_snapshot(client: redis.Redis | None = None) -> BacklogSnapshot:
    """Waiting, retrying and running audits, read in one round trip. Raises RedisError."""
    client = client or redis_client()
    waiting, retrying, running = _SNAPSHOT(client, backlog_keys(), [parked_grace_seconds()])
    return BacklogSnapshot(waiting=int(waiting), retrying=int(retrying), running=int(running))


def running_lease_seconds() -> float:
    from audits.tasks import AUDIT_TIME_LIMIT_SECONDS

    return AUDIT_TIME_LIMIT_SECONDS + RUNNING_LEASE_MARGIN_SECONDS


def note_started(audit_id: str) -> None:
    """An attempt of this audit is running: its held message is not owed a slot any more."""
    _best_effort(
        "started",
        audit_id,
        lambda client: _NOTE_STARTED(
            client, [RUNNING_KEY, PARKED_KEY], [str(audit_id), running_lease_seconds()]
        ),
    )


def note_stopped(audit_id: str) -> None:
    """The attempt ended (finished, failed, or about to be retried)."""
    _best_effort("stopped", audit_id, lambda client: client.zrem(RUNNING_KEY, str(audit_id)))


def note_parked(audit_id: str, due_in_seconds: float) -> None:
    """An audit owed a slot that the broker does not hold (parked outside Celery).

    Not for Celery retries: a retry's message sits in the `unacked` hash, which the
    snapshot already counts; noting it here as well would count it twice. Counted
    until the audit starts (`note_started`) or a visibility timeout after it was due.
    """
    _best_effort(
        "parked",
        audit_id,
        lambda client: _NOTE_PARKED(client, [PARKED_KEY], [str(audit_id), due_in_seconds]),
    )


def _best_effort(event: str, audit_id: str, write) -> None:
    try:
        write(redis_client())
    except redis.RedisError as exc:
        log.warning(
            "backlog.note_failed",
            extra={"event": event, "audit_id": audit_id, "error": f"{exc.__class__.__name__}"},
        )
