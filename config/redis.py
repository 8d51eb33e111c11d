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

With REDIS_SENTINELS set, the same functions hand out clients of the Sentinel-managed
master (`sentinel_master_client`): each new connection asks the sentinels where the
master is, and a command that meets a failover (a dead master, a demoted one answering
READONLY or UNBLOCKED, or one left without its replicas answering NOREPLICAS) is retried with backoff
on the new master for a few seconds (redis-py 8 gives a `master_for` client no
retries at all).
"""

from __future__ import annotations

import os
import socket

import redis
from django.conf import settings
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.client import Pipeline
from redis.commands.core import Script
from redis.connection import parse_url
from redis.exceptions import ConnectionError, ResponseError, TimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

CONNECT_TIMEOUT_SECONDS = 1.0
COMMAND_TIMEOUT_SECONDS = 2.0

# The Redis settings in force -> this process's client. Emptied in a forked child
# before it runs any code.
_process_clients: dict[tuple, redis.Redis] = {}


def _forget_inherited_clients() -> None:
    # Dropped, not closed: the sockets are the parent's to close.
    _process_clients.clear()


os.register_at_fork(after_in_child=_forget_inherited_clients)


def dedicated_client(url: str | None = None) -> redis.Redis:
    """A new client with its own connection pool (for a thread that must not share one).

    Without `url`, the client of the settings: the Sentinel-managed master when
    REDIS_SENTINELS is set, else REDIS_URL."""
    if url is None and settings.REDIS_SENTINEL_ADDRESSES:
        return sentinel_master_client()
    return redis.Redis.from_url(
        url or settings.REDIS_URL,
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
        socket_timeout=COMMAND_TIMEOUT_SECONDS,
        # One retry covers a pooled connection the server closed while idle.
        retry=Retry(NoBackoff(), retries=1),
        health_check_interval=30,
    )


def redis_client() -> redis.Redis:
    """This process's client (per settings, so tests may point it elsewhere)."""
    key = (settings.REDIS_URL, tuple(settings.REDIS_SENTINEL_ADDRESSES),
           settings.REDIS_SENTINEL_MASTER)  # fmt: skip
    client = _process_clients.get(key)
    if client is None:
        client = _process_clients[key] = dedicated_client()
    return client


# Answers of a server that is no longer the master Plumb should write to. READONLY is a
# demoted master (redis-py's SentinelManagedConnection already treats it so); UNBLOCKED
# is what a BRPOP blocked on it gets when it is demoted; NOREPLICAS is a master that has
# lost its replicas (`min-replicas-to-write`), which is how an old master looks in the
# seconds between a `SENTINEL FAILOVER` and its demotion: writes it took then are lost.
NOT_THE_MASTER = ("READONLY", "UNBLOCKED", "NOREPLICAS")

# A `SENTINEL FAILOVER` takes about a second. Six retries with exponential, jittered
# backoff capped at a second wait about 2.3 s in all on average (3.5 s at most) before
# the error reaches the caller, who handles it as an outage (admission answers 503,
# bookkeeping is best effort, tasks retry): a crashed master takes the sentinels'
# down-after-milliseconds to replace, longer than a request should hang.
FAILOVER_RETRIES = 6
FAILOVER_BACKOFF_BASE_SECONDS = 0.05
FAILOVER_BACKOFF_CAP_SECONDS = 1.0


class FailoverAwareConnection(SentinelManagedConnection):
    """A connection to the Sentinel-managed master that takes any of NOT_THE_MASTER as a
    lost connection: it disconnects, and the next connect asks the sentinels again."""

    def read_response(self, *args, **kwargs):
        try:
            return super().read_response(*args, **kwargs)
        except ResponseError as exc:
            code = str(exc).split(" ", 1)[0]
            if self.connection_pool.is_master and code in NOT_THE_MASTER:
                self.disconnect()
                raise ConnectionError(f"the master was replaced: {exc}") from exc
            raise

    def connect_check_health(self, check_health=True, retry_socket_connect=True):
        # One retry loop, the command's, not a second one nested in each of its tries.
        return super().connect_check_health(check_health=check_health, retry_socket_connect=False)

    def _connect(self):
        # A retry reconnects through here, not through connect(): ask the sentinels
        # again, or the retry would go back to the old master's address.
        if self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        return super()._connect()


def failover_retry() -> Retry:
    """The retry policy of every client of a Sentinel-managed master."""
    return Retry(
        ExponentialWithJitterBackoff(
            base=FAILOVER_BACKOFF_BASE_SECONDS, cap=FAILOVER_BACKOFF_CAP_SECONDS
        ),
        retries=FAILOVER_RETRIES,
        supported_errors=(ConnectionError, TimeoutError, socket.timeout),
    )


def sentinel_master_client() -> redis.Redis:
    """A new client of REDIS_SENTINEL_MASTER's current master, with its own pool."""
    from_url = parse_url(settings.REDIS_URL)
    sentinel_kwargs = {
        "socket_connect_timeout": CONNECT_TIMEOUT_SECONDS,
        "socket_timeout": COMMAND_TIMEOUT_SECONDS,
    }
    if settings.REDIS_SENTINEL_PASSWORD:
        sentinel_kwargs["password"] = settings.REDIS_SENTINEL_PASSWORD
    sentinel = Sentinel(settings.REDIS_SENTINEL_ADDRESSES, sentinel_kwargs=sentinel_kwargs)
    return sentinel.master_for(
        settings.REDIS_SENTINEL_MASTER,
        connection_class=FailoverAwareConnection,
        db=from_url.get("db", 0),
        username=from_url.get("username"),
        password=from_url.get("password"),
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
        socket_timeout=COMMAND_TIMEOUT_SECONDS,
        retry=failover_retry(),
        health_check_interval=30,
    )


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


# What a deployment's Redis must keep (docs/operations.md): the queues, the unacked
# messages and the delayed jobs survive a restart (AOF, fsync every second), and no
# key is ever evicted to make room (an evicted queue or lease is lost work).
REQUIRED_SERVER_SETTINGS = {
    "appendonly": "yes",
    "appendfsync": "everysec",
    "maxmemory-policy": "noeviction",
}


def unsafe_server_settings(client: redis.Redis) -> dict[str, str]:
    """The settings of the Redis behind `client` that differ from REQUIRED_SERVER_SETTINGS,
    as {name: value}. Empty when they match, and when the server will not say: managed
    Redis often disables CONFIG, and an unanswered check is no reason to stop a worker."""
    found = {}
    try:
        for name in REQUIRED_SERVER_SETTINGS:
            found.update({k: str(v) for k, v in client.config_get(name).items()})
    except redis.RedisError:
        return {}
    return {
        name: found[name]
        for name, required in REQUIRED_SERVER_SETTINGS.items()
        if name in found and found[name] != required
    }
