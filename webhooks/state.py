"""The Redis connection the webhooks app keeps its shared state in (one per process)."""

from __future__ import annotations

import functools

import redis
from django.conf import settings


@functools.cache
def _client_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def redis_client() -> redis.Redis:
    # Keyed by URL so a test that points REDIS_URL elsewhere gets its own client.
    return _client_for(settings.REDIS_URL)
