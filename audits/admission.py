"""Admission of audit submissions: the client's token bucket, its share, and the backlog.

A submission's outcome, in this order:

1. bucket empty -> refused_ip (429, Retry-After: whole seconds until a token);
2. the client holds its share of the backlog (client_share) -> refused_client (429);
3. backlog >= AUDIT_QUEUE_MAX_DEPTH -> refused_backlog (503);
4. otherwise admitted.

One Lua script decides the bucket and the backlog: it refills the client's bucket, reads
the audits queue's backlog (jobs.backlog), decides, takes the token only if it admits, and
counts the decision, in one round trip and one atomic step.

What a client holds is in the database (its audits not finished, an audit checking links
weighing the checks it still waits on, counted up to its share: HOLDING_CTES), so it is
exact and survives any restart, and it is read where it is written: an admitted
submission's own statement inserts its page and audit only while the client holds less
than its share (audits.submission), so admitting costs the script's round trip and no read
of its own. A submission that statement finds at its share, and one the script refused
for the backlog whose client holds its share too (client_holding), is refused_client:
`refuse_client` gives an admitted one's token back and moves the decision's count, so a
refused submission takes no token and writes nothing but its count, whichever step
refused it. The share has the backlog's check-then-act window: a client can exceed it by
its concurrent requests - 1.

The check-then-act window: the script reads the backlog, and the admitted audit
reaches the queue only after the view has written its row and committed. Another
submission checked inside that window does not see it. Each request handler holds
at most one submission in the window, so with H handlers across all web processes
(gunicorn workers x threads) the backlog can reach at most
AUDIT_QUEUE_MAX_DEPTH + H - 1. It's OK to be this inexact: H is small and fixed by
the deployment, while closing the window would cost a reservation and a second
round trip on every submission. Pinned by
tests/test_admission_live.py::test_concurrent_submissions_overshoot_the_cap_by_at_most_the_handlers_minus_one.

Audits alive but not backlog, so not refused on: the running attempts (at most one
per worker slot; they are not owed a slot) and, for a moment, a message a worker has
popped off the list but not yet recorded in `unacked` (at most one per worker). In a
fail-fast outage, where every attempt goes straight back into backoff, admitted
audits stay within cap + slots + workers + H - 1: pinned by
tests/test_admission_live.py::test_a_fail_fast_outage_admits_no_more_than_the_cap_plus_the_bounded_overshoot.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import redis
from django.conf import settings
from django.db import connections, router

from audits.models import Audit, LinkCheck
from config.redis import REDIS_NOW_LUA, lua, redis_client
from jobs.backlog import QUEUE_BACKLOG_LUA, backlog_keys, backlog_snapshot
from jobs.policy import DATABASE_UNAVAILABLE, wait_horizon
from jobs.sql import column, fetch_one
from observability import gauges
from observability.metrics import ADMISSION_DECISIONS_METRIC, admission_metric_keys, read_counter

log = logging.getLogger(__name__)

ADMITTED, REFUSED_IP, REFUSED_BACKLOG = "admitted", "refused_ip", "refused_backlog"
REFUSED_CLIENT = "refused_client"
SUBMIT_BUCKET_PREFIX = "ratelimit:submit:"
# Room opens as soon as one audit starts, so the wait is short; the spread keeps
# the clients refused together from all coming back in the same second.
BACKLOG_RETRY_AFTER_SECONDS = (5, 15)

# Lua functions; the scripts that use them (_ADMIT, _REFUSE_CLIENT below) define `now`.
# A bucket holds `tokens` as of `at`, and expires once it would have refilled to the burst
# (a bucket that is not there is full).
TOKEN_BUCKET_LUA = """
local function bucket_tokens(key, now, burst, per_second)
  local state = redis.call('HMGET', key, 'tokens', 'at')
  local tokens, at = tonumber(state[1]), tonumber(state[2])
  if not tokens then return burst end
  return math.min(burst, tokens + math.max(0, now - at) * per_second)
end

local function bucket_set(key, now, tokens, burst, per_second)
  redis.call('HSET', key, 'tokens', tostring(tokens), 'at', tostring(now))
  redis.call('PEXPIRE', key, math.ceil((burst - tokens) / per_second * 1000))
end

local function bucket_take(key, now, tokens, burst, per_second)
  bucket_set(key, now, tokens - 1, burst, per_second)
end

local function bucket_wait(tokens, per_second)
  if tokens >= 1 then return 0 end
  return (1 - tokens) / per_second
end
"""

# Counting a decision (observability.metrics.admission_metric_keys): the counter's field is
# its labels as JSON, the minute bucket's its name. KEYS: counter, minute bucket.
COUNT_DECISION_LUA = """
local function count_decision(decision, in_backoff, delta, expiry)
  redis.call('HINCRBY', KEYS[2], '["' .. decision .. '", "' .. in_backoff .. '"]', delta)
  redis.call('HINCRBY', KEYS[3], 'admissions:' .. decision, delta)
  if in_backoff == 'true' then
    redis.call('HINCRBY', KEYS[3], 'admissions_in_backoff:' .. decision, delta)
  end
  redis.call('EXPIREAT', KEYS[3], expiry)
end
"""

# KEYS: bucket, metrics counter, metrics minute bucket, then the audits queue's backlog_keys().
# ARGV: burst, tokens per second, max depth, minute bucket expiry, the wait horizon.
_ADMIT = lua(
    REDIS_NOW_LUA
    + TOKEN_BUCKET_LUA
    + QUEUE_BACKLOG_LUA
    + COUNT_DECISION_LUA
    + """
local now = redis_now()
local burst, per_second, max_depth = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tokens = bucket_tokens(KEYS[1], now, burst, per_second)
local waiting, retrying, running = queue_backlog(4, now, tonumber(ARGV[5]))
local decision = 'admitted'
if tokens < 1 then
  decision = 'refused_ip'
elseif waiting + retrying >= max_depth then
  decision = 'refused_backlog'
else
  bucket_take(KEYS[1], now, tokens, burst, per_second)
end
-- Counted in the same step, so a decision costs one round trip.
local in_backoff = 'false'
if retrying > 0 then in_backoff = 'true' end
count_decision(decision, in_backoff, 1, tonumber(ARGV[4]))
return {decision, tostring(bucket_wait(tokens, per_second)), waiting, retrying, running}
"""
)

# A decision the share overturned, recounted as refused_client; an admitted one gives its
# token back (the bucket as full as it would be had the token never been taken, never
# fuller than the burst). KEYS: bucket, metrics counter, the decision's minute bucket.
# ARGV: the decision, in_backoff, the minute bucket's expiry, burst, tokens per second.
_REFUSE_CLIENT = lua(
    REDIS_NOW_LUA
    + TOKEN_BUCKET_LUA
    + COUNT_DECISION_LUA
    + """
local decision, in_backoff, expiry = ARGV[1], ARGV[2], tonumber(ARGV[3])
if decision == 'admitted' then
  local burst, per_second = tonumber(ARGV[4]), tonumber(ARGV[5])
  local now = redis_now()
  local tokens = bucket_tokens(KEYS[1], now, burst, per_second)
  bucket_set(KEYS[1], now, math.min(burst, tokens + 1), burst, per_second)
end
count_decision(decision, in_backoff, -1, expiry)
count_decision('refused_client', in_backoff, 1, expiry)
return 1
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


def client_address(request) -> str:
    """The request's client address (client_ip with TRUSTED_PROXY_COUNT): the admission
    buckets' key, and the address django-axes counts login failures against."""
    return client_ip(request.META, trusted_proxy_count=settings.TRUSTED_PROXY_COUNT)


def address_key(ip: str) -> str:
    """A client address as the admission keys it.

    IPv6 clients are keyed by their /64: one host usually holds a whole /64 and
    could otherwise take a fresh bucket (or share) with every address in it.
    """
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return ip
    if address.version == 6:
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def client_key(request) -> str:
    """Who a submission counts against: `user:<pk>` for an authenticated user (a staff
    session, or the owner of an API token), else `ip:<address>` (client_address, an IPv6
    client by its /64). Audit.client stores it."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and getattr(user, "pk", None) is not None:
        return f"user:{user.pk}"
    return "ip:" + address_key(client_address(request))


def submit_bucket_key(ip: str) -> str:
    """The bucket a client address submits from (address_key)."""
    return SUBMIT_BUCKET_PREFIX + address_key(ip)


def client_share() -> int:
    """The most of the backlog one client may hold: AUDIT_CLIENT_MAX_SHARE of
    AUDIT_QUEUE_MAX_DEPTH, at least 1."""
    return max(1, math.floor(settings.AUDIT_CLIENT_MAX_SHARE * settings.AUDIT_QUEUE_MAX_DEPTH))


def _sql_list(values) -> str:
    """Status constants as SQL literals: written into the statement, so SQLite can match
    the partial index audit_client_unfinished_idx (a bound parameter never matches one)."""
    assert all(value.isidentifier() for value in values)
    return ", ".join(f"'{value}'" for value in values)


# Written once, not compiled by the ORM on every submission (1.6 ms of CPU a call), and
# prepared on PostgreSQL (jobs.sql). Two counts, so the link checks are read only
# for the client's audits checking links, through their own index: a join of every
# unfinished audit to its checks was planned as a scan of every link check once the
# client held a few dozen audits (DECISIONS.md, "The client's holding is one prepared
# statement"). The checks are counted only up to the client's share (the LIMIT): the
# decision needs no more, and a client whose audits wait on thousands of checks made each
# of its submissions, refused ones too, count them all. Its audits need no LIMIT: the
# share refuses the next one once it is reached.
_AUDIT, _CHECK = Audit._meta, LinkCheck._meta
_A, _C = f'"{_AUDIT.db_table}"', f'"{_CHECK.db_table}"'
# The system's own work ("") holds nothing: none of it is read (a condition on the parameter
# alone, which PostgreSQL checks once before the scan).
_UNFINISHED_OF_CLIENT = (
    f"%s <> '' AND {_A}.{column(Audit, 'client')} = %s"
    f" AND {_A}.{column(Audit, 'status')} IN ({_sql_list(Audit.UNFINISHED)})"
)
_CHECK_OF_CHECKING = f'{_C}."{_CHECK.get_field("audit").column}" = checking.id'
_CHECK_UNFINISHED = f'{_C}."status" IN ({_sql_list(LinkCheck.UNFINISHED)})'
# The checks are found audit by audit through their index, never by a walk of every
# client's checks until enough turn up, which a LIMIT invites: the client's audits checking
# links are read first (MATERIALIZED), and on PostgreSQL each one's checks are a LATERAL
# subquery that OFFSET 0 keeps from being merged into a join it could plan as a hash
# join over the whole table. SQLite has no LATERAL and no hash join: it loops over the
# audits read first, probing the checks' index (its EXPLAIN QUERY PLAN).
_CHECKS_WAITED_ON = {
    "postgresql": f"""checking CROSS JOIN LATERAL (SELECT 1 FROM {_C}
      WHERE {_CHECK_OF_CHECKING} AND {_CHECK_UNFINISHED} OFFSET 0) AS waits_on""",
    "sqlite": f"checking INNER JOIN {_C} ON {_CHECK_OF_CHECKING} WHERE {_CHECK_UNFINISHED}",
}
# The holding as common table expressions (`held`: one row, its `entries`), for a statement
# to read or to act on: CLIENT_HOLDING_SQL reads it, and a submission's own statement on
# PostgreSQL inserts only while it is under the share (audits.submission). Parameters:
# holding_params.
HOLDING_CTES = {
    vendor: f"""checking AS MATERIALIZED (
  SELECT {_A}."{_AUDIT.pk.column}" AS id FROM {_A}
  WHERE {_UNFINISHED_OF_CLIENT} AND {_A}."status" = '{Audit.Status.CHECKING_LINKS}'
),
held AS (SELECT
  (SELECT COUNT(*) FROM {_A}
    WHERE {_UNFINISHED_OF_CLIENT} AND {_A}."status" <> '{Audit.Status.CHECKING_LINKS}')
  + (SELECT COUNT(*) FROM (SELECT 1 FROM {checks} LIMIT %s) AS checks) AS entries
)"""
    for vendor, checks in _CHECKS_WAITED_ON.items()
}
CLIENT_HOLDING_SQL = {
    vendor: f"WITH {ctes} SELECT entries FROM held" for vendor, ctes in HOLDING_CTES.items()
}


def holding_params(client_key: str, share: int) -> list:
    """HOLDING_CTES' parameters."""
    return [client_key] * 4 + [share]


def client_holding(client_key: str) -> int:
    """What `client_key` holds of the backlog, read from the record in one query and
    counted up to its share (client_share): each of its audits not finished is one
    entry, except that an audit checking links holds one per check it still waits on
    (the entries it put on the queue). A client at or past its share reads as its share,
    whatever it holds beyond: the count costs the database no more than the share's worth
    of checks, for the client the share exists for. The system's own work ("") belongs to
    no client."""
    if not client_key:
        return 0
    share = client_share()
    connection = connections[router.db_for_read(Audit)]
    # Prepared: planning the statement cost more than running it.
    (entries,) = fetch_one(
        connection, CLIENT_HOLDING_SQL[connection.vendor], holding_params(client_key, share)
    )
    return min(entries, share)


class AdmissionUnavailable(Exception):
    """Redis could not be asked: nothing may be admitted, and nothing was written."""


@dataclass(frozen=True)
class Decision:
    outcome: str
    client_ip: str
    waiting: int
    retrying: int
    running: int
    max_depth: int
    # Whole seconds a refused client should wait before trying again (0 if admitted).
    retry_after: int = 0
    # The most of the backlog the client may hold (client_share), and what it held when
    # that refused it (refuse_client; 0 otherwise: only a refusal reads it).
    client_share: int = 0
    client_held: int = 0
    # Where the script counted it (admission_metric_keys), for refuse_client to recount it.
    counted_in: tuple = field(default=(), repr=False, compare=False)

    @property
    def admitted(self) -> bool:
        return self.outcome == ADMITTED

    @property
    def backlog(self) -> int:
        return self.waiting + self.retrying


def _retry_after(outcome: str, bucket_wait_seconds: float) -> int:
    if outcome == REFUSED_IP:
        return BucketAnswer(allowed=False, wait_seconds=bucket_wait_seconds).retry_after
    if outcome in (REFUSED_BACKLOG, REFUSED_CLIENT):
        return random.randint(*BACKLOG_RETRY_AFTER_SECONDS)
    return 0


def admit_submission(ip: str, *, client: redis.Redis | None = None) -> Decision:
    """Decide one submission from `ip` by its bucket and the backlog, and count it; the
    client's share is the submission's own statement's to check (module docstring).
    Raises AdmissionUnavailable."""
    max_depth = settings.AUDIT_QUEUE_MAX_DEPTH
    counted_in = admission_metric_keys()
    counter, bucket, bucket_expiry = counted_in
    try:
        outcome, wait, waiting, retrying, running = _ADMIT(
            keys=[submit_bucket_key(ip), counter, bucket, *backlog_keys(settings.AUDIT_QUEUE)],
            args=[
                settings.AUDIT_SUBMIT_BURST,
                settings.AUDIT_SUBMIT_RATE_PER_MINUTE / 60,
                max_depth,
                bucket_expiry,
                wait_horizon(),
            ],
            client=client or redis_client(),
        )
    except redis.RedisError as exc:
        log.warning(
            "admission.unavailable", extra={"client_ip": ip, "error": exc.__class__.__name__}
        )
        raise AdmissionUnavailable(str(exc)) from exc
    outcome = outcome.decode()
    decision = Decision(
        outcome=outcome,
        client_ip=ip,
        waiting=int(waiting),
        retrying=int(retrying),
        running=int(running),
        max_depth=max_depth,
        retry_after=_retry_after(outcome, float(wait)),
        client_share=client_share(),
        counted_in=counted_in,
    )
    if not decision.admitted:
        _log_refusal(decision)
    return decision


def refuse_client(decision: Decision, held: int, *, client: redis.Redis | None = None) -> Decision:
    """`decision` (admitted, or refused for the backlog) overturned because its client holds
    `held`, its share or more: refused_client, recounted where the script counted it, and
    an admitted one's token given back. If Redis cannot be reached now the refusal stands
    and only its count is lost (logged)."""
    refused = replace(
        decision,
        outcome=REFUSED_CLIENT,
        retry_after=_retry_after(REFUSED_CLIENT, 0),
        client_held=held,
    )
    counter, bucket, bucket_expiry = decision.counted_in
    try:
        _REFUSE_CLIENT(
            keys=[submit_bucket_key(decision.client_ip), counter, bucket],
            args=[
                decision.outcome,
                "true" if decision.retrying else "false",
                bucket_expiry,
                settings.AUDIT_SUBMIT_BURST,
                settings.AUDIT_SUBMIT_RATE_PER_MINUTE / 60,
            ],
            client=client or redis_client(),
        )
    except redis.RedisError as exc:
        log.warning(
            "admission.recount_failed",
            extra={"client_ip": decision.client_ip, "error": exc.__class__.__name__},
        )
    _log_refusal(refused)
    return refused


def _log_refusal(decision: Decision) -> None:
    # Counted by the scripts; the log line says what the refusal was measured against.
    log.info(
        "admission.refused",
        extra={
            "reason": decision.outcome, "client_ip": decision.client_ip,
            "backlog": decision.backlog, "waiting": decision.waiting,
            "retrying": decision.retrying, "running": decision.running,
            "max_depth": decision.max_depth, "client_held": decision.client_held,
            "client_share": decision.client_share,
        },
    )  # fmt: skip


def admission_counts(client: redis.Redis | None = None) -> dict[str, int]:
    """Decisions so far: admitted / refused_ip / refused_client / refused_backlog, each also `_in_backoff`
    (made while audits were waiting to retry), read from the decisions' metric."""
    totals = read_counter(ADMISSION_DECISIONS_METRIC, client=client)
    counts: dict[str, int] = {}
    for decision in (ADMITTED, REFUSED_IP, REFUSED_CLIENT, REFUSED_BACKLOG):
        in_backoff = int(totals.get((decision, "true"), 0))
        counts[decision] = in_backoff + int(totals.get((decision, "false"), 0))
        counts[f"{decision}_in_backoff"] = in_backoff
    return counts


def queue_gauges(client: redis.Redis | None = None) -> dict[str, int]:
    """The audits queue's backlog, as the gauges report it (registered in audits.apps)."""
    return backlog_snapshot(settings.AUDIT_QUEUE, client).as_dict()


def queue_report(client: redis.Redis | None = None) -> dict[str, int | None]:
    """What GET /api/queue and `manage.py queue_depth` show. Raises RedisError.

    The backlog is read from Redis; only `scheduled` (tonight's re-audits) is read from
    PostgreSQL, and it is None while the database is away. A database outage is when an
    operator reads the backlog most (the jobs waiting it out show as `retrying`), and the
    whole answer was a 503 for want of that one count (bench/outages.py).
    """
    try:
        scheduled = gauges.read("scheduled")
    except DATABASE_UNAVAILABLE as exc:
        log.warning("queue.scheduled_unavailable", extra={"error": exc.__class__.__name__})
        scheduled = {"scheduled": None}
    return {
        **queue_gauges(client),
        **scheduled,
        "max_depth": settings.AUDIT_QUEUE_MAX_DEPTH,
    }
