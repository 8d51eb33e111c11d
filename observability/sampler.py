"""Once a minute, the gauges' readings go into that minute's bucket for the dashboard.

Counters are bucketed as they happen; a gauge (the backlog, the breakers) has to
be read. Every Celery worker's main process runs a `MinuteSampler` thread, and a
per-minute `SET NX` lets exactly one of them, on any host, take each minute's
sample. `GET /api/stats` takes the current minute's sample too when no worker has,
so the latest point is there even with every worker stopped.
"""

from __future__ import annotations

import logging
import threading
import time

from celery import signals
from django.db import connections

from config.redis import redis_client
from observability import gauges
from observability.metrics import BREAKER_STATES, minute_of, record_samples

log = logging.getLogger(__name__)


def sample_once(*, now: float | None = None) -> bool:
    """Record this minute's gauge readings unless a process already has. True if this one did."""
    minute = minute_of(now)
    if not redis_client().set(f"metrics:sampled:{minute}", 1, nx=True, ex=180):
        return False
    snapshot = gauges.queue_snapshot()
    values: dict[str, int | float] = snapshot.as_dict()
    states = gauges.breaker_states()
    for state in BREAKER_STATES:
        values[f"breakers:{state}"] = states.get(state, 0)
    record_samples(values, now=now)
    return True


class MinuteSampler(threading.Thread):
    def __init__(self):
        super().__init__(name="metrics-sampler", daemon=True)
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                sample_once()
            except Exception:
                log.exception("metrics.sample_failed")
            finally:
                # This thread's own connection: do not hold one open between samples.
                connections.close_all()
            # A second into the next minute, so the sample belongs to that minute.
            self.stopping.wait(61 - time.time() % 60)

    def stop(self) -> None:
        self.stopping.set()


_sampler: MinuteSampler | None = None


@signals.worker_ready.connect
def start_sampler(**kwargs):
    global _sampler
    _sampler = MinuteSampler()
    _sampler.start()


@signals.worker_shutdown.connect
def stop_sampler(**kwargs):
    if _sampler is not None:
        _sampler.stop()
