"""The re-audit fan-out's domain functions."""

from __future__ import annotations

import redis
from django.conf import settings

from config.celery_app import queue_list_keys, unacked_key_for_queue
from config.redis import redis_client


def count_scheduled(client: redis.Redis | None = None) -> int:
    """Re-audit placements not yet run: what GET /api/queue reports as `scheduled`.

    Interim: counts the `reaudit` queue's messages, waiting on its lists (every
    priority sub-queue) or held by a reaudit worker until their ETA
    (`unacked:reaudit`). The re-audit issue replaces this with the count of its own
    placements.
    """
    client = client or redis_client()
    queue = settings.REAUDIT_QUEUE
    with client.pipeline(transaction=False) as pipe:
        for key in queue_list_keys(queue):
            pipe.llen(key)
        pipe.hlen(unacked_key_for_queue(queue))
        return sum(pipe.execute())
