"""One Redis client per process for Plumb's own shared state (buckets, backlog, counters).

The broker has its own connections (kombu's); this client is for the keys Plumb
reads and writes itself. It fails fast: a request that needs Redis while Redis is
down should get its error in about a second, not after redis-py's default ten
retries with backoff.
"""

from __future__ import annotations

import functools
import hashlib

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError
from redis.retry import Retry

CONNECT_TIMEOUT_SECONDS = 1.0
COMMAND_TIMEOUT_SECONDS = 2.0


@functools.cache
def _client_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
        socket_timeout=COMMAND_TIMEOUT_SECONDS,
        # One retry covers a pooled connection the server closed while idle.
        retry=Retry(NoBackoff(), retries=1),
        health_check_interval=30,
    )


def redis_client() -> redis.Redis:
    """The client for settings.REDIS_URL (cached per URL, so tests may point it elsewhere)."""
    return _client_for(settings.REDIS_URL)


class LuaScript:
    """A Lua script run by its SHA (EVALSHA), loaded on first use by each Redis server."""

    def __init__(self, source: str):
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, client: redis.Redis, keys: list[str], args: list) -> object:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(self.source, len(keys), *keys, *args)
