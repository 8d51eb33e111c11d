"""What a queue owes its workers, derived from where the work is, never kept by hooks.

    backlog = waiting + held + delayed

- waiting: messages on the queue's Redis lists (the main key and every priority
  sub-queue kombu keeps beside it);
- held: messages a worker of the queue holds without running them. kombu takes an
  ETA message (a retry in backoff, a short deferral) off the list at once and keeps it
  in the queue's `unacked` hash until it is acknowledged, so the hash holds every
  such message, every running attempt (acks are late) and the few a worker has
  prefetched; subtracting the running attempts leaves the ones owed a slot;
- delayed: the queue's entries in the delayed store (jobs.delayed): long retries,
  breaker parks, rate-limit deferrals, busy hosts, whatever made them wait, due within
  the wait horizon (jobs.policy.wait_horizon: no wait is longer). Entries due later
  were stored before that bound: reported apart (`deferred_beyond_horizon`), never
  counted against a cap, and published by the waker to end rate limited.

`held` and `delayed` are reported together as `retrying`: owed a slot, not yet due.
The running attempts are registered by the runtime itself around every run
(`running`), under any pool: a prefork process, a thread or a greenlet registers
the attempt it runs. An entry is the lease its task's deadline budget derives
(jobs.deadlines), so the entry of a process that died vanishes within it.

Each count is O(1) or O(log n) in Redis (LLEN, HLEN, ZCARD, ZCOUNT, plus trimming expired leases), so
the read costs the same with 100 or 100,000 held messages, and it is one Lua script:
one round trip, one consistent moment. Work for another queue is never counted:
each queue's workers keep their own unacked keys (config.celery_app), so tonight's
re-audit placements, held by the `reaudit` workers, are not the audits' backlog.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from redis.client import Pipeline

from config.celery_app import queue_list_keys, unacked_key_for_queue
from config.redis import REDIS_NOW_LUA, lua, redis_client
from jobs.delayed import delayed_key, leased_key
from jobs.policy import wait_horizon

# KEYS from `backlog_keys` (from KEYS[first_key] on): unacked hash, running zset,
# delayed zset, leased zset, then the queue's lists. `horizon`: seconds from now within
# which a delayed entry is owed a slot (jobs.policy.wait_horizon); the entries due later
# are returned apart (`later`), counted by no cap.
QUEUE_BACKLOG_LUA = """
local function queue_backlog(first_key, now, horizon)
  local unacked, running_key = KEYS[first_key], KEYS[first_key + 1]
  local waiting = 0
  for i = first_key + 4, #KEYS do
    waiting = waiting + redis.call('LLEN', KEYS[i])
  end
  redis.call('ZREMRANGEBYSCORE', running_key, '-inf', now)
  local running = redis.call('ZCARD', running_key)
  local held = redis.call('HLEN', unacked) - running
  if held < 0 then held = 0 end
  local stored = redis.call('ZCARD', KEYS[first_key + 2])
  local soon = redis.call('ZCOUNT', KEYS[first_key + 2], '-inf', now + horizon)
  local delayed = soon + redis.call('ZCARD', KEYS[first_key + 3])
  return waiting, held + delayed, running, stored - soon
end
"""

_SNAPSHOT = lua(
    REDIS_NOW_LUA
    + QUEUE_BACKLOG_LUA
    + """
local waiting, retrying, running, later = queue_backlog(1, redis_now(), tonumber(ARGV[1]))
return {waiting, retrying, running, later}
"""
)

# `note_running`: an attempt's entry in its queue's running registry (running_key), lapsing
# `lease` seconds after `now` (the task's deadline lease, jobs.deadlines, so a worker that
# died running it leaves nothing behind): a step of an attempt's start (jobs.task), in its
# round trip.
RUNNING_LUA = """
local function note_running(key, now, run_id, lease)
  redis.call('ZADD', key, now + lease, run_id)
end
"""


@dataclass(frozen=True)
class BacklogSnapshot:
    waiting: int
    retrying: int
    running: int
    # Delayed entries due past the wait horizon: not owed a slot soon, so not backlog
    # (stored before every wait was bounded; the waker ends them, jobs.delayed).
    deferred_beyond_horizon: int = 0

    @property
    def backlog(self) -> int:
        return self.waiting + self.retrying

    def as_dict(self) -> dict[str, int]:
        return {
            "backlog": self.backlog,
            "waiting": self.waiting,
            "retrying": self.retrying,
            "running": self.running,
            "deferred_beyond_horizon": self.deferred_beyond_horizon,
        }


def running_key(queue: str) -> str:
    return f"jobs:running:{queue}"


def backlog_keys(queue: str) -> list[str]:
    """KEYS for QUEUE_BACKLOG_LUA, in its order."""
    return [
        unacked_key_for_queue(queue),
        running_key(queue),
        delayed_key(queue),
        leased_key(queue),
        *queue_list_keys(queue),
    ]


def backlog_snapshot(queue: str, client: redis.Redis | None = None) -> BacklogSnapshot:
    """Waiting, retrying and running work of `queue`, read in one round trip. Raises RedisError."""
    waiting, retrying, running, later = _SNAPSHOT(
        keys=backlog_keys(queue), args=[wait_horizon()], client=client or redis_client()
    )
    return BacklogSnapshot(
        waiting=int(waiting),
        retrying=int(retrying),
        running=int(running),
        deferred_beyond_horizon=int(later),
    )


def attempt_stopped(queue: str, run_id: str, *, pipe: Pipeline) -> None:
    """The attempt `run_id` ended: its entry leaves the running registry, in the end's
    pipeline (jobs.task). Best effort, as that pipeline is: the entry lapses with its lease."""
    pipe.zrem(running_key(queue), run_id)
