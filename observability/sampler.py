"""Once a minute, the gauges' readings go into that minute's bucket for the dashboard.

Counters are bucketed as they happen; a gauge (the backlog, the breakers) has to be
read. Every Celery worker's main process runs the sampler thread
(jobs.bootsteps.MinuteSampler), and a per-minute `SET NX` lets exactly one of them,
on any host, take each minute's sample. `GET /api/stats` takes the current minute's
sample too when no worker has, so the latest point is there even with every worker
stopped.
"""

from __future__ import annotations

import time

import redis

from config.redis import redis_client
from observability import gauges
from observability.metrics import minute_of, record_samples


def sample_once(*, now: float | None = None, client: redis.Redis | None = None) -> bool:
    """Record this minute's gauge readings unless a process already has. True if this one did."""
    minute = minute_of(now)
    if not (client or redis_client()).set(f"metrics:sampled:{minute}", 1, nx=True, ex=180):
        return False
    record_samples(gauges.read_all(), now=now)
    return True


def seconds_to_next_sample(now: float | None = None) -> float:
    # A second into the next minute, so the sample belongs to that minute.
    return 61 - (time.time() if now is None else now) % 60
