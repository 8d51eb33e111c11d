"""Inbound token buckets in Redis, shared by every web process.

A bucket holds up to `burst` tokens and refills at `rate_per_minute`; a request
takes one. The state is one Redis hash (`tokens` as of `at`), read, refilled and
written inside one Lua script, so two web processes can never both spend the
last token. Time is the Redis server's clock (TIME), the one clock every web
process shares. A bucket expires once it would be full again: an address that
stops sending costs no memory.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass

import redis

from config.redis import LuaScript, redis_client

SUBMIT_BUCKET_PREFIX = "ratelimit:submit:"

# Lua functions; the scripts that use them (here and in ratelimit.submissions) define `now`.
TOKEN_BUCKET_LUA = """
local function bucket_tokens(key, now, burst, per_second)
  local state = redis.call('HMGET', key, 'tokens', 'at')
  local tokens, at = tonumber(state[1]), tonumber(state[2])
  if not tokens then return burst end
  return math.min(burst, tokens + math.max(0, now - at) * per_second)
end

local function bucket_take(key, now, tokens, burst, per_second)
  local left = tokens - 1
  redis.call('HSET', key, 'tokens', tostring(left), 'at', tostring(now))
  redis.call('PEXPIRE', key, math.ceil((burst - left) / per_second * 1000))
end

local function bucket_wait(tokens, per_second)
  if tokens >= 1 then return 0 end
  return (1 - tokens) / per_second
end
"""

_TAKE = LuaScript(
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""
    + TOKEN_BUCKET_LUA
    + """
local burst, per_second = tonumber(ARGV[1]), tonumber(ARGV[2])
local tokens = bucket_tokens(KEYS[1], now, burst, per_second)
if tokens < 1 then
  return {0, tostring(bucket_wait(tokens, per_second))}
end
bucket_take(KEYS[1], now, tokens, burst, per_second)
return {1, '0'}
"""
)


@dataclass(frozen=True)
class BucketAnswer:
    allowed: bool
    # Seconds until the bucket holds a whole token again (0 when allowed).
    wait_seconds: float

    @property
    def retry_after(self) -> int:
        """Whole seconds for a Retry-After header: never 0, never short."""
        return max(1, math.ceil(self.wait_seconds))


def take_token(
    key: str, *, burst: int, rate_per_minute: float, client: redis.Redis | None = None
) -> BucketAnswer:
    """Take one token from the bucket at `key`, or say how long until there is one."""
    allowed, wait = _TAKE(client or redis_client(), [key], [burst, rate_per_minute / 60])
    return BucketAnswer(allowed=bool(allowed), wait_seconds=float(wait))


def client_ip(meta: Mapping[str, str], *, trusted_proxy_count: int) -> str:
    """The address a request came from, as far as it can be trusted.

    With no trusted proxy, the socket's peer (REMOTE_ADDR): X-Forwarded-For is
    whatever the client chose to send. Behind N proxies that each append the
    address they received from, the Nth entry from the right is the client; entries
    further left were written by the client and are ignored. A header with fewer
    than N entries, or an entry that is not an IP address, did not come through the
    proxies as configured, so the peer address is used.
    """
    remote = meta.get("REMOTE_ADDR", "")
    if trusted_proxy_count:
        hops = [h.strip() for h in meta.get("HTTP_X_FORWARDED_FOR", "").split(",") if h.strip()]
        if len(hops) >= trusted_proxy_count:
            candidate = hops[-trusted_proxy_count]
            try:
                ipaddress.ip_address(candidate)
            except ValueError:
                return remote
            return candidate
    return remote


def submit_bucket_key(ip: str) -> str:
    """The bucket a client address submits from.

    IPv6 clients are keyed by their /64: one host usually holds a whole /64 and
    could otherwise take a fresh bucket with every address in it.
    """
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return SUBMIT_BUCKET_PREFIX + ip
    if address.version == 6:
        if address.ipv4_mapped is not None:
            return SUBMIT_BUCKET_PREFIX + str(address.ipv4_mapped)
        return SUBMIT_BUCKET_PREFIX + str(ipaddress.ip_network(f"{address}/64", strict=False))
    return SUBMIT_BUCKET_PREFIX + str(address)
