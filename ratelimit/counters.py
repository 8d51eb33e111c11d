"""Counting what the retry machinery does, in one place.

Every count goes through `count()`: a Redis hash today, so all processes add
to the same numbers; the observability work can turn this one function into
Prometheus counters without touching the callers.
"""

from __future__ import annotations

from config.redis import redis_client
from ratelimit.store import KEY_PREFIX

COUNTERS_KEY = f"{KEY_PREFIX}counters"


def _field(event: str, labels: dict[str, str]) -> str:
    return event + "".join(f"|{name}={labels[name]}" for name in sorted(labels))


def count(event: str, **labels: str) -> None:
    """Add one to `event` with these labels: count("breaker.opened", task=..., host=...)."""
    redis_client().hincrby(COUNTERS_KEY, _field(event, labels), 1)


def read(event: str, **labels: str) -> int:
    value = redis_client().hget(COUNTERS_KEY, _field(event, labels))
    return int(value or 0)
