"""Circuit breakers per (task type, downstream origin), shared by every worker through Redis.

The origin is scheme, host and port (`outbound.urls.origin_key`): failures against one
port of a host, or one spelling of it, open nobody else's breaker.

closed     calls go through; their outcomes fill a sliding window of one-second
           buckets. When the window holds at least BREAKER_MIN_CALLS calls and
           at least BREAKER_FAILURE_RATE of them failed, the breaker opens.
open       for BREAKER_OPEN_SECONDS nothing goes through: tasks are parked.
half_open  BREAKER_HALF_OPEN_PROBES calls go through as probes, the rest are
           parked. One failed probe opens the breaker again; once every probe
           has succeeded it closes.

Parked tasks are given release times one after another, first come first
served, starting at the end of the open period, at the rate the key was being
called when the breaker opened (its window's calls since the first one, over at
least a quarter of a second), or at the number
of tasks parked so far in this outage over one open period, if that is higher.
A trickle comes back at about the rate the downstream was taking before, however
long the outage: a ten-minute outage must not end in a burst of ten minutes'
work. A burst that met the breaker soon after its window began (10 calls in one
second, then thousands of deliveries) is not held to that small sample's rate:
each open period's worth of parked tasks raises the rate, so a backlog of N
tasks comes back within about ln(N / (rate x open period)) open periods more.
Each task's release time gets up to a second of jitter on top.

Each step is one Lua script, so workers deciding at the same moment see one
state, and time is Redis's clock, so workers on different hosts agree on it.
Outcomes of calls that started before the breaker opened are not counted:
the breaker already acted on what they would say.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db.models import F
from django.utils import timezone
from redis.client import Pipeline

from config.redis import lua, queue_script, redis_client
from jobs.models import CircuitBreaker
from jobs.retention import PrunableKind
from observability import metrics

log = logging.getLogger(__name__)

KEY_PREFIX = "plumb:breaker:"
# The breaker keys that changed state (a transition adds one; the gauges' count drops it
# once its state has expired): the gauges count their states without a SCAN.
BREAKERS_KEY = "plumb:breakers"
SUCCESS, FAILURE, NO_VERDICT = "success", "failure", "none"
CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
# A breaker that opens on calls made within less than this measures its release rate
# over this long: at most BREAKER_MIN_CALLS / 0.25 s when it opens on a sudden burst.
SHORTEST_RATE_SAMPLE_SECONDS = 0.25
# The state each transition leads to, for plumb_breaker_transitions_total.
TRANSITION_TO_STATE = {
    "opened": OPEN,
    "reopened": OPEN,
    "half_opened": HALF_OPEN,
    "closed": CLOSED,
    "closed_by_operator": CLOSED,
}

# Each script ends by refreshing the state hash's expiry: a breaker nobody calls is
# forgotten BREAKER_FORGET_AFTER_SECONDS after its last use, or after its open period and
# its parked tasks' last release time, if later (an open breaker outlives its release).
# A forgotten breaker is a closed one with an empty window: exactly what it was.
KEEP_LUA = """
local function keep(key, now, idle)
  local kept = redis.call('HMGET', key, 'state', 'open_until', 'next_release')
  if not kept[1] then return end
  local last = now
  if kept[1] ~= 'closed' then
    last = math.max(now, tonumber(kept[2] or '0'), tonumber(kept[3] or '0'))
  end
  redis.call('EXPIRE', key, math.ceil(last - now + idle))
end
"""

# `breaker_acquire`: one call's permit from the breaker at `key` ({decision, seconds until
# its release, transition}), with the settings `acquire_args` gives, in that order. Its own
# script below (`Breaker.acquire`), and a step of an attempt's start (jobs.task).
ACQUIRE_LUA = (
    KEEP_LUA
    + """
local function breaker_acquire(key, now, open_seconds, probes, slowest_rate, forget_after)
local function decide()
local state = redis.call('HGET', key, 'state') or 'closed'
if state == 'closed' then return {'allow', '0', ''} end
-- The next free release time at or after `earliest`, one every 1/rate seconds: the rate
-- before it opened, or the tasks parked in this outage over one open period if higher.
local function release_after(earliest)
  local parked = redis.call('HINCRBY', key, 'parked', 1)
  local rate = tonumber(redis.call('HGET', key, 'release_rate') or slowest_rate)
  rate = math.max(rate, parked / open_seconds)
  local at = math.max(earliest, tonumber(redis.call('HGET', key, 'next_release') or '0'))
  redis.call('HSET', key, 'next_release', tostring(at + 1 / rate))
  return tostring(at - now)
end
local transition = ''
if state == 'open' then
  local open_until = tonumber(redis.call('HGET', key, 'open_until'))
  if now < open_until then return {'open', release_after(open_until), ''} end
  redis.call('HSET', key, 'state', 'half_open', 'changed_at', tostring(now),
             'probes_started', 0, 'probe_successes', 0, 'probes_since', tostring(now))
  transition = 'half_opened'
end
if now - tonumber(redis.call('HGET', key, 'probes_since')) > open_seconds then
  -- Probes that never reported (their worker died): let others take their place.
  redis.call('HSET', key, 'probes_started', redis.call('HGET', key, 'probe_successes'),
             'probes_since', tostring(now))
end
if tonumber(redis.call('HGET', key, 'probes_started')) < probes then
  redis.call('HINCRBY', key, 'probes_started', 1)
  return {'probe', '0', transition}
end
-- The probes are out: wait at least a moment for their verdict.
return {'half_open', release_after(now + 1), transition}
end
local answer = decide()
keep(key, now, forget_after)
return answer
end
"""
)

_ACQUIRE = lua(
    ACQUIRE_LUA
    + """
local now = redis.call('TIME')
now = tonumber(now[1]) + tonumber(now[2]) / 1000000
return breaker_acquire(KEYS[1], now, tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
                       tonumber(ARGV[4]))
"""
)


def acquire_args() -> list:
    """ACQUIRE_LUA's settings, in its order."""
    return [
        settings.BREAKER_OPEN_SECONDS,
        settings.BREAKER_HALF_OPEN_PROBES,
        # The slowest release rate a breaker can have measured when it opened.
        settings.BREAKER_MIN_CALLS / settings.BREAKER_WINDOW_SECONDS,
        settings.BREAKER_FORGET_AFTER_SECONDS,
    ]


_RECORD = lua(
    KEEP_LUA
    + """
local now = redis.call('TIME')
now = tonumber(now[1]) + tonumber(now[2]) / 1000000
local outcome, probe = ARGV[1], ARGV[2]
local window, min_calls, rate = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local open_seconds, probes = tonumber(ARGV[6]), tonumber(ARGV[7])
local function decide()
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
local function open(release_rate)
  redis.call('HSET', KEYS[1], 'state', 'open', 'changed_at', tostring(now),
             'opened_at', tostring(now), 'open_until', tostring(now + open_seconds))
  if release_rate then
    -- A new outage (not a failed probe): its own rate and count of parked tasks.
    redis.call('HSET', KEYS[1], 'release_rate', tostring(release_rate), 'parked', 0)
  end
  redis.call('DEL', KEYS[2])
end
if probe == '1' and state == 'half_open' then
  if outcome == 'failure' then
    open(nil)
    return {'reopened', '0', '0'}
  elseif outcome == 'success' then
    if redis.call('HINCRBY', KEYS[1], 'probe_successes', 1) >= probes then
      redis.call('HSET', KEYS[1], 'state', 'closed', 'changed_at', tostring(now))
      redis.call('DEL', KEYS[2])
      return {'closed', '0', '0'}
    end
  else
    -- The probe said nothing about the downstream: let another one go.
    redis.call('HINCRBY', KEYS[1], 'probes_started', -1)
  end
  return {'', '0', '0'}
end
if state ~= 'closed' or outcome == 'none' then return {'', '0', '0'} end
local second = math.floor(now)
redis.call('HINCRBY', KEYS[2], 'c:' .. second, 1)
if outcome == 'failure' then redis.call('HINCRBY', KEYS[2], 'f:' .. second, 1) end
-- When this window's first call ended, to the microsecond: a burst's rate is not rounded
-- down to its calls per whole second.
redis.call('HSETNX', KEYS[2], 'since', tostring(now))
local calls, failures, oldest = 0, 0, second
local buckets = redis.call('HGETALL', KEYS[2])
for i = 1, #buckets, 2 do
  local field = buckets[i]
  if field ~= 'since' then
    local bucket = tonumber(string.sub(field, 3))
    if bucket <= second - window then
      redis.call('HDEL', KEYS[2], field)
    elseif string.sub(field, 1, 1) == 'c' then
      calls = calls + tonumber(buckets[i + 1])
      oldest = math.min(oldest, bucket)
    else
      failures = failures + tonumber(buckets[i + 1])
    end
  end
end
redis.call('EXPIRE', KEYS[2], window + 60)
if calls >= min_calls and failures >= rate * calls then
  -- Calls per second since the first call still in the window; a sample shorter than
  -- ARGV[8] seconds counts as that long, so ten calls in a millisecond are not a rate.
  local since = math.max(tonumber(redis.call('HGET', KEYS[2], 'since')), oldest)
  open(calls / math.max(now - since, tonumber(ARGV[8])))
  return {'opened', tostring(calls), tostring(failures)}
end
return {'', tostring(calls), tostring(failures)}
end
local answer = decide()
keep(KEYS[1], now, tonumber(ARGV[9]))
return answer
"""
)

_CLOSE = lua(
    KEEP_LUA
    + """
local now = redis.call('TIME')
now = tonumber(now[1]) + tonumber(now[2]) / 1000000
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
redis.call('HSET', KEYS[1], 'state', 'closed', 'changed_at', tostring(now))
redis.call('DEL', KEYS[2])
keep(KEYS[1], now, tonumber(ARGV[1]))
return state
"""
)

# Counts the breakers in each state as the next call would find them (an open one past
# its open period is half-open: its next call is a probe), and drops from the set the
# keys whose state has expired. One script, so a breaker whose state is written while
# it runs is never dropped. A state written before breakers expired (no TTL) is given its
# expiry here. It reads keys named by the set, not passed in KEYS: Plumb's Redis is one
# primary (standalone or Sentinel), never a cluster.
_STATE_COUNTS = lua(
    KEEP_LUA
    + """
local now = redis.call('TIME')
now = tonumber(now[1]) + tonumber(now[2]) / 1000000
local counts = {closed = 0, open = 0, half_open = 0}
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local found = redis.call('HMGET', key, 'state', 'open_until')
  local state = found[1]
  if not state then
    redis.call('SREM', KEYS[1], key)
  else
    if redis.call('TTL', key) == -1 then keep(key, now, tonumber(ARGV[1])) end
    if state == 'open' and found[2] and tonumber(found[2]) <= now then state = 'half_open' end
    counts[state] = (counts[state] or 0) + 1
  end
end
return {counts.closed, counts.open, counts.half_open}
"""
)


@dataclass(frozen=True)
class Permit:
    """What the breaker said to one call: allow, probe, open or half_open.

    `release_in` is, for a refused call, the seconds until its release time.
    """

    decision: str
    release_in: float = 0.0

    @property
    def allowed(self) -> bool:
        return self.decision in ("allow", "probe")

    @property
    def probe(self) -> bool:
        return self.decision == "probe"


class Breaker:
    def __init__(self, task_name: str, host: str):
        self.task_name = task_name
        self.host = host
        self.key = f"{KEY_PREFIX}{task_name}:{host}"
        self.window_key = f"{self.key}:window"

    def acquire(self) -> Permit:
        return self.permitted(_ACQUIRE(keys=[self.key], args=acquire_args(), client=redis_client()))

    def permitted(self, answer: list) -> Permit:
        """The permit in ACQUIRE_LUA's answer; a transition it made is logged, counted and
        mirrored."""
        decision, release_in, transition = answer
        if transition:
            self._transitioned(transition.decode())
        return Permit(decision.decode(), float(release_in))

    def record(self, permit: Permit, outcome: str, *, pipe: Pipeline | None = None) -> None:
        """Record a call's outcome. With `pipe`, the script joins the caller's pipeline, and
        the caller hands its answer to `recorded`."""
        keys = [self.key, self.window_key]
        args = [
            outcome, "1" if permit.probe else "0",
            settings.BREAKER_WINDOW_SECONDS, settings.BREAKER_MIN_CALLS,
            settings.BREAKER_FAILURE_RATE, settings.BREAKER_OPEN_SECONDS,
            settings.BREAKER_HALF_OPEN_PROBES, SHORTEST_RATE_SAMPLE_SECONDS,
            settings.BREAKER_FORGET_AFTER_SECONDS,
        ]  # fmt: skip
        if pipe is not None:
            queue_script(pipe, _RECORD, keys=keys, args=args)
        else:
            self.recorded(_RECORD(keys=keys, args=args, client=redis_client()))

    def recorded(self, answer: list) -> None:
        """Act on the record script's answer: a transition is logged, counted and mirrored."""
        transition, calls, failures = answer
        if transition:
            self._transitioned(transition.decode(), calls=int(calls), failures=int(failures))

    def close(self, *, by: str) -> str:
        """Close the breaker by hand; return the state it was in."""
        previous = _CLOSE(
            keys=[self.key, self.window_key],
            args=[settings.BREAKER_FORGET_AFTER_SECONDS],
            client=redis_client(),
        ).decode()
        self._transitioned("closed_by_operator", previous=previous, by=by)
        return previous

    def state(self) -> dict:
        """The live state: {"state": ..., "open_until": epoch or None, ...}."""
        raw = {k.decode(): v.decode() for k, v in redis_client().hgetall(self.key).items()}
        state = raw.get("state", CLOSED)
        return {
            "state": state,
            "changed_at": float(raw["changed_at"]) if "changed_at" in raw else None,
            "open_until": float(raw["open_until"]) if state == OPEN else None,
            "release_rate": float(raw["release_rate"]) if "release_rate" in raw else None,
            "next_release": float(raw["next_release"]) if "next_release" in raw else None,
            "parked": int(raw.get("parked", 0)),
            "probes_started": int(raw.get("probes_started", 0)),
            "probe_successes": int(raw.get("probe_successes", 0)),
        }

    def _transitioned(self, transition: str, **fields) -> None:
        record_transition(self, transition, **fields)


def record_transition(breaker: Breaker, transition: str, **fields) -> None:
    """Log, count and mirror (for the admin) one change of a breaker's state."""
    log.info(
        f"breaker.{transition}",
        extra={"task": breaker.task_name, "host": breaker.host, **fields},
    )
    redis_client().sadd(BREAKERS_KEY, breaker.key)
    metrics.record_breaker_transition(TRANSITION_TO_STATE[transition])
    live = breaker.state()
    open_until = live["open_until"]
    CircuitBreaker.objects.update_or_create(
        task_name=breaker.task_name,
        host=breaker.host,
        defaults={
            "state": live["state"],
            "changed_at": timezone.now(),
            "last_transition": transition,
            "open_until": datetime.fromtimestamp(open_until, tz=UTC) if open_until else None,
        },
    )
    if transition in ("opened", "reopened"):
        CircuitBreaker.objects.filter(task_name=breaker.task_name, host=breaker.host).update(
            times_opened=F("times_opened") + 1
        )


def state_counts() -> dict[str, int]:
    """How many breakers are in each state now, as the next call would find them: those
    used within BREAKER_FORGET_AFTER_SECONDS, or still open or releasing parked tasks.
    Forgotten ones leave the set as they are read, so the set holds only those."""
    closed, opened, half_open = _STATE_COUNTS(
        keys=[BREAKERS_KEY], args=[settings.BREAKER_FORGET_AFTER_SECONDS], client=redis_client()
    )
    return {CLOSED: int(closed), OPEN: int(opened), HALF_OPEN: int(half_open)}


def unchanged_since(cutoff: datetime):
    """Admin rows of breakers that have not changed state since `cutoff`: their state in
    Redis was forgotten long before (BREAKER_FORGET_AFTER_SECONDS), and a breaker that
    changes state again gets a new row."""
    return CircuitBreaker.objects.filter(changed_at__lt=cutoff)


RETENTION = PrunableKind(
    name="breakers",
    horizon_setting="BREAKER_RETENTION_DAYS",
    old_enough=unchanged_since,
    walk=("changed_at", "id"),
    description="breakers' admin rows with no change of state that long",
)
