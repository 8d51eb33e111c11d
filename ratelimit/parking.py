"""Parked tasks: held in Redis, outside the broker, until they are due.

A task that must wait longer than a worker may hold its message (a long
Retry-After), or whose downstream's breaker is open, is parked: its
signature goes into a sorted set per queue, scored by the time it is due.
Every worker runs `ParkedTaskSweeper`, a thread that re-publishes what has
come due for the queue it consumes. Nothing is held as an ETA, so nothing
outlives the visibility timeout, and a thousand parked tasks cost a thousand
small Redis entries rather than a thousand messages in one worker's memory.

Waking is at-least-once: a sweep first leases the due entries (moves their
score a minute ahead), publishes, then removes them; a sweeper that dies
half-way leaves them to come due again. Tasks are idempotent, so a rare
second delivery is harmless where a lost one is not.
"""

from __future__ import annotations

import logging
import threading
import uuid

from celery import bootsteps, signature
from django.conf import settings
from kombu.utils.json import dumps, loads

from config.redis import redis_client
from ratelimit.counters import count
from ratelimit.store import KEY_PREFIX

log = logging.getLogger(__name__)

# Seconds a woken entry is hidden from other sweepers while it is published.
WAKE_LEASE_SECONDS = 60
WAKE_BATCH = 200

_PARK = """
local now = redis.call('TIME')
local due = tonumber(now[1]) + tonumber(now[2]) / 1000000 + tonumber(ARGV[1])
redis.call('ZADD', KEYS[1], due, ARGV[2])
return tostring(due)
"""

_LEASE_DUE = """
local now = redis.call('TIME')
now = tonumber(now[1]) + tonumber(now[2]) / 1000000
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, member in ipairs(due) do
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), member)
end
return due
"""


def parked_key(queue: str) -> str:
    return f"{KEY_PREFIX}parked:{queue}"


def queue_of(task, request) -> str:
    """The queue a task's message came from (or the task's own queue)."""
    delivery_info = getattr(request, "delivery_info", None) or {}
    return delivery_info.get("routing_key") or task.queue or settings.CELERY_TASK_DEFAULT_QUEUE


def longest_held_delay(task) -> float:
    """The longest countdown a worker of the task's queue may hold as an ETA.

    A held message is redelivered once it has been unacked longer than the
    queue's visibility timeout; it is held for the countdown plus the run, so
    the countdown must leave room for the task's hard time limit and a margin.
    """
    timeouts = settings.QUEUE_VISIBILITY_TIMEOUTS
    visibility = timeouts.get(task.queue, settings.AUDITS_VISIBILITY_TIMEOUT_SECONDS)
    run_time = task.time_limit or 0
    margin = max(10.0, 0.1 * visibility)
    return max(0.0, visibility - run_time - margin)


def park(task_signature, *, delay: float, queue: str, reason: str) -> float:
    """Hold `task_signature` until `delay` seconds from now; return when it is due (epoch)."""
    entry = dumps({"park_id": uuid.uuid4().hex, "reason": reason, "signature": task_signature})
    due = float(redis_client().eval(_PARK, 1, parked_key(queue), max(0.0, delay), entry))
    count("task.parked", task=task_signature["task"], reason=reason.split(" ")[0])
    log.info(
        "task.parked",
        extra={
            "task": task_signature["task"],
            "task_id": task_signature["options"].get("task_id"),
            "retries": task_signature["options"].get("retries"),
            "delay_seconds": round(delay, 3),
            "reason": reason,
            "queue": queue,
        },
    )
    return due


def parked_count(queue: str) -> int:
    return redis_client().zcard(parked_key(queue))


def parked_entries(queue: str) -> list[dict]:
    """Every parked entry of `queue`, soonest first, with its due time (for tests and ops)."""
    rows = redis_client().zrange(parked_key(queue), 0, -1, withscores=True)
    return [{**loads(member), "due": score} for member, score in rows]


def wake_due(queue: str, *, app=None) -> int:
    """Re-publish every parked task of `queue` that has come due; return how many."""
    client = redis_client()
    key = parked_key(queue)
    woken = 0
    while True:
        members = client.eval(_LEASE_DUE, 1, key, WAKE_BATCH, WAKE_LEASE_SECONDS)
        for member in members:
            entry = loads(member)
            signature(entry["signature"], app=app).apply_async()
            client.zrem(key, member)
            woken += 1
        if len(members) < WAKE_BATCH:
            return woken


class ParkedTaskSweeper(bootsteps.StartStopStep):
    """A worker step: every PARKED_SWEEP_INTERVAL_SECONDS, wake the due tasks of its queue.

    A thread, not a beat entry: whatever runs a queue's tasks also wakes them,
    with no other process to keep alive. Several workers sweeping the same
    queue is fine: the lease hands each entry to one of them.
    """

    label = "Parked task sweeper"

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, worker):
        queues = sorted(worker.app.amqp.queues.consume_from)
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._run, args=(worker.app, queues), name="parked-sweeper", daemon=True
        )
        self._thread.start()

    def stop(self, worker):
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    shutdown = stop

    def _run(self, app, queues: list[str]) -> None:
        while not self._stopping.wait(settings.PARKED_SWEEP_INTERVAL_SECONDS):
            for queue in queues:
                try:
                    woken = wake_due(queue, app=app)
                except Exception:
                    log.exception("parked.sweep_failed", extra={"queue": queue})
                    continue
                if woken:
                    log.info("parked.woken", extra={"queue": queue, "count": woken})
