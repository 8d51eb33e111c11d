"""Plumb's shared state in Redis (breakers, parked tasks, counters): one client per process."""

from __future__ import annotations

import functools

import redis
from django.conf import settings

KEY_PREFIX = "plumb:"


@functools.cache
def redis_client() -> redis.Redis:
    # redis-py notices a fork and opens fresh connections in the child, so
    # one cached client serves every pool process.
    return redis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5, health_check_interval=30
    )
