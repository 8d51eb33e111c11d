"""Retries that wait in Redis, not in a worker.

Celery hands a message with an ETA to a worker at once; the worker keeps it in
memory until it is due and raises its prefetch count for each one, so after a
burst of failures every worker holds thousands of deliveries it cannot run,
all of them unacknowledged (and redelivered if they wait longer than the
visibility timeout). Webhook retries are published here instead: a sorted set
scored by due time. A promoter thread in each webhooks worker moves due
entries to the `webhooks` queue, where a worker takes one only when it has a
free thread. So a worker never holds more deliveries than it can run, and the
rest stay in Redis.

The promoter leases what it moves (pushes its score forward) before publishing
and removes it after, so a promoter that dies half-way leaves the entries to
be moved again once the lease lapses: at least once, never lost. Several
workers promote side by side without moving an entry twice while its lease holds.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid

from celery import current_app

from config.redis import redis_client

log = logging.getLogger(__name__)

DELAYED_KEY = "webhooks:delayed"
LEASE_SECONDS = 30.0
PROMOTE_INTERVAL_SECONDS = 0.2
PROMOTE_BATCH = 500

# Take the due entries and lease them in one step, so two promoters never take the same.
_CLAIM_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  redis.call('ZADD', KEYS[1], ARGV[3], member)
end
return due
"""


def publish_later(
    task_name: str,
    *,
    args: list,
    kwargs: dict | None,
    task_id: str,
    retries: int,
    delay: float,
) -> None:
    entry = {
        "task": task_name,
        "args": list(args or []),
        "kwargs": dict(kwargs or {}),
        "task_id": task_id,
        "retries": retries,
        # Two schedules of the same task and attempt stay two members.
        "nonce": uuid.uuid4().hex,
    }
    redis_client().zadd(DELAYED_KEY, {json.dumps(entry): time.time() + max(0.0, delay)})


def promote_due(*, now: float | None = None, limit: int = PROMOTE_BATCH) -> int:
    """Publish the entries that are due; returns how many."""
    client = redis_client()
    now = time.time() if now is None else now
    claimed = client.eval(_CLAIM_DUE, 1, DELAYED_KEY, now, limit, now + LEASE_SECONDS)
    for raw in claimed:
        entry = json.loads(raw)
        task = current_app.tasks[entry["task"]]
        # No countdown: this publishes to the queue itself (see WebhookTask.apply_async).
        task.apply_async(
            args=entry["args"],
            kwargs=entry["kwargs"],
            task_id=entry["task_id"],
            retries=entry["retries"],
        )
    if claimed:
        client.zrem(DELAYED_KEY, *claimed)
    return len(claimed)


def waiting() -> int:
    return redis_client().zcard(DELAYED_KEY)


class Promoter(threading.Thread):
    """Moves due retries to the queue every PROMOTE_INTERVAL_SECONDS until stopped."""

    def __init__(self):
        super().__init__(name="webhooks-promoter", daemon=True)
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                moved = promote_due()
            except Exception:  # a Redis hiccup must not end the thread
                log.exception("webhooks.promote_failed")
                moved = 0
            # A full batch means more are due: go again at once.
            if moved < PROMOTE_BATCH:
                self.stopping.wait(PROMOTE_INTERVAL_SECONDS)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=5)
