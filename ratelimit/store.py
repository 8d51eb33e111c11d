"""Plumb's shared state in Redis (breakers, parked tasks, counters): its key prefix.

The client is the project's one, `config.redis.redis_client`.
"""

KEY_PREFIX = "plumb:"
