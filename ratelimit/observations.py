"""What downstreams said about their rate limits, per admission key and resource.

An observation names its bucket exactly: the admission key says whose quota
(`host:<origin>`, the origin as `outbound.urls.origin_key` spells it,
`github-installation:<id>`, `github-app:<appId>`,
`github-token:<hash>`) and the resource which of that quota's buckets (`core`,
`graphql`, `search`, ... as GitHub reports it; `default` for a plain host).
Admission reads the newest observation of exactly one (key, resource): kept hot
in Redis, one hash per bucket, and persisted to the database for history (and
as the fallback when Redis has lost it).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import redis
from django.db import models
from django.utils import timezone

from config.redis import lua, redis_client
from jobs.retention import PrunableKind
from ratelimit.headers import LimitHeaders

log = logging.getLogger(__name__)

DEFAULT_RESOURCE = "default"
# GitHub's secondary limits are per credential, across REST and GraphQL: kept as
# one more bucket of the key, which admission reads beside the call's own.
SECONDARY_RESOURCE = "secondary"
HOT_KEY_PREFIX = "ratelimit:observation:"
# How long Redis keeps a bucket it has heard nothing new about, past its reset.
HOT_TTL_SECONDS = 3600
# A bucket nobody has observed is remembered as "nothing known" this long, so a
# host seen once does not cost a database query per call.
UNKNOWN_TTL_SECONDS = 60


class Kind(models.TextChoices):
    OK = "ok", "answered"
    PRIMARY = "primary", "primary limit exhausted"
    SECONDARY = "secondary", "secondary limit (Retry-After)"
    RATE_LIMITED = "rate_limited", "rate limited"


def host_key(origin: str) -> str:
    """The bucket of a plain server: its origin (`http://example.org:8080`), so one
    spelling of a host cannot block or free another's, nor one port another's."""
    return f"host:{origin}"


def github_installation_key(installation_id: int | str) -> str:
    return f"github-installation:{installation_id}"


def github_app_key(app_id: int | str) -> str:
    return f"github-app:{app_id}"


def github_token_key(token: str) -> str:
    # The token itself must not end up in Redis keys, logs or the admin.
    return f"github-token:{hashlib.sha256(token.encode()).hexdigest()[:16]}"


class RateLimitObservation(models.Model):
    """One response's word on one bucket. Rows are history; admission reads the newest."""

    key = models.CharField(max_length=200, help_text="Whose quota: host:…, github-installation:…")
    resource = models.CharField(max_length=64, help_text="Which bucket of it: core, graphql, …")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.OK)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    limit = models.IntegerField(null=True, blank=True)
    remaining = models.IntegerField(null=True, blank=True)
    used = models.IntegerField(null=True, blank=True)
    reset_at = models.DateTimeField(null=True, blank=True)
    blocked_until = models.DateTimeField(
        null=True, blank=True, help_text="Retry-After or a secondary limit: no calls before this."
    )
    observed_at = models.DateTimeField()

    class Meta:
        app_label = "ratelimit"
        ordering = ["-observed_at"]
        indexes = [
            # The newest row of one (key, resource) is one index probe, filtered by
            # resource in the query itself, never by scanning a window of mixed rows.
            models.Index(fields=["key", "resource", "-observed_at"], name="observation_bucket_idx"),
            models.Index(fields=["-observed_at"], name="observation_observed_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.key} {self.resource}: {self.remaining}/{self.limit} ({self.kind})"


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _datetime(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, tz=UTC) if value is not None else None


@dataclass(frozen=True)
class Observation:
    """The hot form of an observation: epoch seconds, as Redis keeps it."""

    key: str
    resource: str
    observed_at: float
    kind: str = Kind.OK
    status_code: int | None = None
    limit: int | None = None
    remaining: int | None = None
    used: int | None = None
    reset_at: float | None = None
    blocked_until: float | None = None

    @classmethod
    def from_headers(
        cls,
        key: str,
        resource: str,
        limits: LimitHeaders,
        *,
        kind: str,
        status_code: int | None,
        observed_at: float,
        blocked_until: float | None = None,
    ) -> Observation:
        # `blocked_until` is the classification's alone (ratelimit.responses.classify):
        # a Retry-After on any other answer (a 200, a 301, a 500) blocks nobody.
        return cls(
            key=key,
            resource=resource,
            observed_at=observed_at,
            kind=kind,
            status_code=status_code,
            limit=limits.limit,
            remaining=limits.remaining,
            used=limits.used,
            reset_at=limits.reset_at,
            blocked_until=blocked_until,
        )

    @classmethod
    def from_row(cls, row: RateLimitObservation) -> Observation:
        return cls(
            key=row.key,
            resource=row.resource,
            observed_at=row.observed_at.timestamp(),
            kind=row.kind,
            status_code=row.status_code,
            limit=row.limit,
            remaining=row.remaining,
            used=row.used,
            reset_at=_epoch(row.reset_at),
            blocked_until=_epoch(row.blocked_until),
        )

    def wait_until(self, now: float) -> float | None:
        """When this bucket admits calls again, or None if it does now."""
        until = None
        if self.blocked_until is not None and self.blocked_until > now:
            until = self.blocked_until
        if (
            self.remaining is not None
            and self.remaining <= 0
            and self.reset_at is not None
            and self.reset_at > now
        ):
            until = max(until or 0.0, self.reset_at)
        return until


def hot_key(key: str, resource: str) -> str:
    return f"{HOT_KEY_PREFIX}{key}|{resource}"


FIELDS = ("observed_at", "kind", "status_code", "limit", "remaining", "used", "reset_at",
          "blocked_until")  # fmt: skip

# Newest wins, with two exceptions that keep an older row from being cleared by
# a response that was already in flight when the bucket ran dry:
# - a block (Retry-After, secondary limit) stands until it lapses, whatever comes after;
# - within one window (the same reset time) `remaining` only goes down.
MERGE = lua(
    """
local key = KEYS[1]
local observed = tonumber(ARGV[1])
local remaining, reset_at, blocked = ARGV[5], ARGV[7], ARGV[8]
local cur = redis.call('HMGET', key, 'observed_at', 'remaining', 'reset_at', 'blocked_until')
if cur[1] then
  local cur_blocked = tonumber(cur[4] or '')
  if cur_blocked and cur_blocked > observed and (blocked == '' or cur_blocked > tonumber(blocked)) then
    blocked = cur[4]
  end
  if tonumber(cur[1]) > observed then
    if blocked ~= '' and blocked ~= cur[4] then
      redis.call('HSET', key, 'blocked_until', blocked)
    end
    return 0
  end
  if reset_at ~= '' and cur[3] == reset_at and remaining ~= '' and cur[2] and cur[2] ~= ''
     and tonumber(cur[2]) < tonumber(remaining) then
    remaining = cur[2]
  end
end
redis.call('HSET', key, 'observed_at', ARGV[1], 'kind', ARGV[2], 'status_code', ARGV[3],
  'limit', ARGV[4], 'remaining', remaining, 'used', ARGV[6], 'reset_at', reset_at,
  'blocked_until', blocked)
redis.call('EXPIRE', key, tonumber(ARGV[9]))
return 1
"""
)


def _text(value) -> str:
    if value is None:
        return ""
    return repr(value) if isinstance(value, float) else str(value)


def _hot_ttl(observation: Observation, now: float) -> int:
    horizon = max(observation.reset_at or 0.0, observation.blocked_until or 0.0, now)
    return int(horizon - now) + HOT_TTL_SECONDS


def remember(observation: Observation, *, client: redis.Redis | None = None) -> None:
    """Merge an observation into the hot store (Redis only)."""
    client = client or redis_client()
    MERGE(
        keys=[hot_key(observation.key, observation.resource)],
        args=[
            _text(observation.observed_at),
            observation.kind,
            _text(observation.status_code),
            _text(observation.limit),
            _text(observation.remaining),
            _text(observation.used),
            _text(observation.reset_at),
            _text(observation.blocked_until),
            _hot_ttl(observation, time.time()),
        ],
        client=client,
    )


def record(observation: Observation) -> None:
    """Keep the observation hot for admission and write its row for history."""
    remember(observation)
    RateLimitObservation.objects.create(
        key=observation.key,
        resource=observation.resource,
        kind=observation.kind,
        status_code=observation.status_code,
        limit=observation.limit,
        remaining=observation.remaining,
        used=observation.used,
        reset_at=_datetime(observation.reset_at),
        blocked_until=_datetime(observation.blocked_until),
        observed_at=_datetime(observation.observed_at),
    )
    if observation.kind != Kind.OK:
        log.info(
            "ratelimit.observed",
            extra={
                "key": observation.key,
                "resource": observation.resource,
                "kind": observation.kind,
                "remaining": observation.remaining,
                "reset_at": observation.reset_at,
                "blocked_until": observation.blocked_until,
            },
        )


def _number(raw: bytes | None, cast=float):
    if raw is None or raw == b"":
        return None
    return cast(float(raw))


def from_hot(key: str, resource: str, raw: list) -> Observation | None:
    """The bucket's word from its hot hash's FIELDS, as HMGET returns them (raw[0] is not
    None: the hash exists); None when it is remembered as "nothing known"."""
    observed_at = float(raw[0])
    if observed_at == 0:
        return None  # remembered as "nothing known"
    return Observation(
        key=key,
        resource=resource,
        observed_at=observed_at,
        kind=raw[1].decode() if raw[1] else Kind.OK,
        status_code=_number(raw[2], int),
        limit=_number(raw[3], int),
        remaining=_number(raw[4], int),
        used=_number(raw[5], int),
        reset_at=_number(raw[6]),
        blocked_until=_number(raw[7]),
    )


def latest(key: str, resource: str) -> Observation | None:
    """The newest word on exactly this bucket: Redis, else the database."""
    client = redis_client()
    raw = client.hmget(hot_key(key, resource), FIELDS)
    if raw[0] is not None:
        return from_hot(key, resource, raw)
    observation = latest_from_database(key, resource)
    if observation is None:
        client.hset(hot_key(key, resource), "observed_at", "0")
        client.expire(hot_key(key, resource), UNKNOWN_TTL_SECONDS)
        return None
    remember(observation, client=client)
    return observation


def latest_from_database(
    key: str, resource: str, *, now: float | None = None
) -> Observation | None:
    """The newest row of (key, resource), carrying any block that still stands.

    Both queries filter on key and resource in SQL, so rows of another
    resource (a burst of graphql calls) can never push this bucket's row out.
    """
    now = time.time() if now is None else now
    rows = RateLimitObservation.objects.filter(key=key, resource=resource)
    newest = rows.order_by("-observed_at").first()
    if newest is None:
        return None
    observation = Observation.from_row(newest)
    standing = (
        rows.filter(blocked_until__gt=_datetime(max(now, observation.observed_at)))
        .order_by("-blocked_until")
        .values_list("blocked_until", flat=True)
        .first()
    )
    if standing is not None and standing.timestamp() > (observation.blocked_until or 0.0):
        observation = Observation(**{**observation.__dict__, "blocked_until": standing.timestamp()})
    return observation


def observed_before(cutoff: datetime):
    return RateLimitObservation.objects.filter(observed_at__lt=cutoff)


def not_blocking(observations):
    """Admission reads the newest observation of a bucket (from Redis; the database only
    when Redis has lost it), and a days-old word on a bucket has long been reset; a row
    whose block still stands stays all the same."""
    return observations.exclude(blocked_until__gte=timezone.now())


RETENTION = PrunableKind(
    name="ratelimit_observations",
    horizon_setting="RATELIMIT_OBSERVATION_RETENTION_DAYS",
    old_enough=observed_before,
    walk=("observed_at", "id"),
    may_go=not_blocking,
    description="outbound rate-limit observations, history only",
)
