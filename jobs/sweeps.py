"""Periodic sweeps: work an app does every few seconds, run by the workers themselves.

A sweep is a tick of every worker's main-process threads (jobs.bootsteps.Sweeper),
never a message on a queue: a message behind a backlog waits its turn, and one given
an expiry to keep it from piling up expires unrun (the link-check deadline did, behind
more than ten seconds of `audits` backlog). A worker's own threads tick whatever its
pool is doing, and any worker of any queue may run any sweep.

Each app registers its sweeps in its AppConfig.ready(), as it registers what it owes
(jobs.reconcile), so jobs/ imports no app. A lock per sweep in Redis, taken for
`interval` seconds, lets one worker a sweep an interval do it, cluster-wide; a sweep
is idempotent (two workers sweeping at once finish nothing twice), so a lock that
lapses during a long sweep costs a second pass, not a wrong answer.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import redis

log = logging.getLogger(__name__)

LOCK_PREFIX = "jobs:sweep:"


@dataclass(frozen=True)
class Sweep:
    """`run()` every `interval_seconds`, by one worker of the cluster."""

    name: str
    interval_seconds: float
    run: Callable[[], object]


_sweeps: dict[str, Sweep] = {}


def register(sweep: Sweep) -> None:
    """Called from an AppConfig.ready(); registering a name again replaces it."""
    _sweeps[sweep.name] = sweep


def sweeps() -> list[Sweep]:
    return list(_sweeps.values())


def shortest_interval(default: float = 1.0) -> float:
    return min((sweep.interval_seconds for sweep in sweeps()), default=default)


def tick(client: redis.Redis) -> list[str]:
    """Run every sweep whose lock this worker takes; returns the names it ran. A sweep
    that raises is logged and does not keep the others from running."""
    ran = []
    for sweep in sweeps():
        lock = f"{LOCK_PREFIX}{sweep.name}"
        # Redis's clock expires the lock: workers on different hosts agree on the interval.
        if not client.set(lock, uuid.uuid4().hex, nx=True, px=int(sweep.interval_seconds * 1000)):
            continue
        started = time.monotonic()
        try:
            sweep.run()
        except Exception:
            log.exception("sweep.failed", extra={"sweep": sweep.name})
            continue
        ran.append(sweep.name)
        log.debug(
            "sweep.ran",
            extra={"sweep": sweep.name, "seconds": round(time.monotonic() - started, 3)},
        )
    return ran
