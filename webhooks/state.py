"""The Redis connection the webhooks app keeps its shared state in: the project's one."""

from __future__ import annotations

from config.redis import redis_client

__all__ = ["redis_client"]
