"""Redis clients for Plumb's own state (buckets, backlog, delayed jobs, breakers, metrics).

The broker has its own connections (kombu's); these are for the keys Plumb reads and
writes itself. Two rules keep them safe in a prefork worker:

- A client belongs to the process that made it. `redis_client()` hands each process
  its own, made on first use after a fork (`os.register_at_fork` forgets the parent's
  in the child, and `worker_process_init` makes a pool process's client at once): a
  pool process never touches a connection pool, or a pool's lock, that its parent
  made, so a lock copied while a parent thread held it can never block it.
- A thread of a worker's main process (the delayed-job waker, the minute sampler) uses
  `dedicated_client()`, a client of its own, never the process's shared one.

Every client fails fast: a request that needs Redis while Redis is down gets its
error in about a second, not after redis-py's default retries with backoff.
"""

from __future__ import annotations

import os

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.client import Pipeline
from redis.commands.core import Script
from redis.retry import Retry

CONNECT_TIMEOUT_SECONDS = 1.0
COMMAND_TIMEOUT_SECONDS = 2.0

# URL -> this process's client. Emptied in a forked child before it runs any code.
_process_clients: dict[str, redis.Redis] = {}


def _forget_inherited_clients() -> None:
    # Dropped, not closed: the sockets are the parent's to close.
    _process_clients.clear()


os.register_at_fork(after_in_child=_forget_inherited_clients)


def dedicated_client(url: str | None = None) -> redis.Redis:
    """A new client with its own connection pool (for a thread that must not share one)."""
    return redis.Redis.from_url(
        url or settings.REDIS_URL,
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
        socket_timeout=COMMAND_TIMEOUT_SECONDS,
        # One retry covers a pooled connection the server closed while idle.
        retry=Retry(NoBackoff(), retries=1),
        health_check_interval=30,
    )


def redis_client() -> redis.Redis:
    """This process's client for settings.REDIS_URL (per URL, so tests may point it elsewhere)."""
    url = settings.REDIS_URL
    client = _process_clients.get(url)
    if client is None:
        client = _process_clients[url] = dedicated_client(url)
    return client


def lua(source: str) -> Script:
    """A Lua script, run by its SHA and loaded on first use by each Redis server.

    Call it as `script(keys=[...], args=[...], client=redis_client())`.
    """
    return Script(None, source.encode())


def queue_script(pipe: Pipeline, script: Script, *, keys: list, args: list) -> None:
    """Queue `script` into `pipe` as an EVAL of its text: a pipeline holding a `Script`
    first asks Redis whether it is loaded (SCRIPT EXISTS), a round trip of its own on every
    send. Its answer is the script's slot in the pipeline's answers."""
    pipe.eval(script.script, len(keys), *keys, *args)


# Lua: `redis_now()` is the Redis server's clock, the one clock every process shares.
REDIS_NOW_LUA = """
local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""
