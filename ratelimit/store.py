"""Plumb's shared state in Redis (breakers, parked tasks, counters).

The client is the project's one (config.redis): one per process and URL, failing fast.
"""

from __future__ import annotations

from config.redis import redis_client

__all__ = ["KEY_PREFIX", "redis_client"]

KEY_PREFIX = "plumb:"
