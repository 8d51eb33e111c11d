"""The one retry policy: how long a job waits, and whether a wait is held or stored.

Every wait Plumb imposes comes from `delay()`:

- a retry after an error: exponential backoff from the policy's base, capped, with
  multiplicative jitter in [0.75, 1.25] applied after the cap as well, so jobs that
  failed together do not come back together even at the cap (DECISIONS.md, "Retries",
  has the measurements);
- a known wait (a downstream's Retry-After, a bucket's reset): obeyed in full, never
  shortened, plus up to 10 % (at least up to a second) more;
- a breaker park: until the breaker's release time for this job, plus up to a second;
- a deferral nobody timed (every slot of a host busy): backoff on the job's deferral
  count from the policy's `defer_base`, capped at `defer_max`;
- an outage (Plumb's own PostgreSQL or Redis away, `infrastructure_away`): backoff on
  the job's outage count from the policy's `backoff_base`, capped at
  OUTAGE_BACKOFF_MAX_SECONDS, so a job resumes within seconds of the outage's end.

No wait is longer than `wait_horizon()`: RATELIMIT_MAX_WAIT_SECONDS plus its jitter. A
named wait past RATELIMIT_MAX_WAIT_SECONDS is not a wait at all (`too_long`): the job
ends rate limited instead (jobs.task), so nothing owed a slot is due beyond the horizon,
and the backlog admission counts is what can run within it (jobs.backlog).

A task declares its policy with one `RetryPolicy` object. Values that operators set
are read when used (a callable), so a changed setting applies without a restart
of anything but the process that reads it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import kombu.exceptions
import psycopg
import redis.exceptions
from django import db
from django.conf import settings

from jobs.errors import Transient

# The database is down or unreachable: worth retrying, never the downstream's fault.
DATABASE_UNAVAILABLE = (db.OperationalError, db.InterfaceError)
# Plumb's own infrastructure is away: the database, Redis (down, or a master a failover
# demoted: READONLY) or the broker. Every job retries these, and no breaker counts them
# (only `Transient`, a downstream's failure, does). An attempt that met a Redis blip was
# dead-lettered before, as if the page were at fault.
INFRASTRUCTURE_UNAVAILABLE = (
    *DATABASE_UNAVAILABLE,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    kombu.exceptions.OperationalError,
)

# SQLSTATE classes that say the server, not the statement, is at fault: a connection
# exception (08), or the server shutting down or not yet accepting connections (57P01-03).
_SERVER_AWAY_SQLSTATES = ("08", "57P01", "57P02", "57P03")


def infrastructure_away(exc: BaseException) -> bool:
    """Is `exc` Plumb's own PostgreSQL, Redis or broker being away (an outage), rather
    than a statement that failed? An outage spends no attempt (jobs.task): a statement
    timeout or a serialization failure is an OperationalError too, and is retried as an
    error, so a query that can never succeed still ends as a dead letter."""
    if not isinstance(exc, INFRASTRUCTURE_UNAVAILABLE):
        return False
    if isinstance(exc, db.OperationalError):
        cause = exc.__cause__
        sqlstate = getattr(cause, "sqlstate", None) if isinstance(cause, psycopg.Error) else None
        return sqlstate is None or sqlstate.startswith(_SERVER_AWAY_SQLSTATES)
    return True


JITTER_LOW, JITTER_HIGH = 0.75, 1.25
# A breaker spaces its releases itself; the jitter only breaks ties within a second.
PARK_JITTER_SECONDS = 1.0

Reason = Literal["retry", "deferral", "park", "outage"]
RETRY: Reason = "retry"
OUTAGE: Reason = "outage"
DEFERRAL: Reason = "deferral"
PARK: Reason = "park"


def _setting(name: str) -> Callable[[], float]:
    return lambda: getattr(settings, name)


@dataclass(frozen=True)
class RetryPolicy:
    """What one kind of job does when it cannot finish now.

    max_attempts     runs before the job is dead-lettered (a deferral or a park is no run)
    backoff_base     first retry's delay, doubled each attempt ...
    backoff_max      ... up to this cap
    max_deferrals    rate-limit waits without an attempt spent; past them a wait spends one
                     (a busy host's waits, which nobody timed, never spend one)
    defer_base/max   backoff for a deferral nobody gave a time for (a busy host)
    outage_max       cap of an outage's backoff (from backoff_base): how soon after
                     PostgreSQL or Redis returns a waiting job runs again
    countdowns_held  short retries ride in the broker as ETA messages a worker holds; False
                     keeps every wait in the delayed store (a worker holds only what it runs)
    retry_on         errors worth a retry besides `Transient` (Plumb's own database, Redis
                     or broker away: INFRASTRUCTURE_UNAVAILABLE)
    counts_as_job    the product's work (audits, link checks, deliveries): counted in
                     the attempt, completion and unique-job metrics; housekeeping is not
    """

    max_attempts: Callable[[], int] = _setting("AUDIT_MAX_ATTEMPTS")
    backoff_base: Callable[[], float] = _setting("RETRY_BACKOFF_BASE_SECONDS")
    backoff_max: Callable[[], float] = _setting("RETRY_BACKOFF_MAX_SECONDS")
    max_deferrals: int = 10
    defer_base: float = 0.25
    defer_max: Callable[[], float] = _setting("RETRY_BACKOFF_MAX_SECONDS")
    outage_max: Callable[[], float] = _setting("OUTAGE_BACKOFF_MAX_SECONDS")
    countdowns_held: bool = True
    retry_on: tuple[type[BaseException], ...] = field(default=INFRASTRUCTURE_UNAVAILABLE)
    counts_as_job: bool = True

    def retries(self, exc: BaseException | None) -> bool:
        return isinstance(exc, (Transient, *self.retry_on))


def longest_wait() -> float:
    """The longest wait a downstream may name for a job (RATELIMIT_MAX_WAIT_SECONDS)."""
    return settings.RATELIMIT_MAX_WAIT_SECONDS


def too_long(after: float | None) -> bool:
    """A named wait the job does not wait: it ends rate limited instead (jobs.task)."""
    return after is not None and after > longest_wait()


def named_wait_jitter(after: float) -> float:
    """The most jitter `delay` adds to a wait somebody named."""
    return max(1.0, 0.1 * after)


def wait_horizon() -> float:
    """The latest, from now, that any wait `delay` gives is due: the longest named wait
    plus its jitter. Entries of the delayed store due later were stored before the bound
    (or under a longer one): the waker publishes them now (jobs.delayed)."""
    bound = longest_wait()
    return bound + named_wait_jitter(bound)


def jitter_enabled() -> bool:
    # Off only to reproduce the old, unjittered policy in a benchmark (RETRY_JITTER=false).
    return settings.RETRY_JITTER


def exponential(step: int, *, base: float, cap: float) -> float:
    """base x 2^(step - 1), at most `cap` (step 1 is the first wait)."""
    return min(cap, base * (2 ** max(0, step - 1)))


def delay(
    policy: RetryPolicy,
    reason: Reason = RETRY,
    *,
    step: int = 1,
    after: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before a job runs again.

    `step` counts the waits of this kind so far, this one included (the attempt for
    a retry, the deferral count for a deferral); `after` is a wait somebody named:
    a Retry-After, a bucket's reset, a breaker's release time. Never past
    `wait_horizon()`: a caller that must not shorten a named wait asks `too_long` first.
    """
    return min(_delay(policy, reason, step=step, after=after, rng=rng or random), wait_horizon())


def _delay(policy: RetryPolicy, reason: Reason, *, step: int, after: float | None, rng) -> float:
    jitter = jitter_enabled()
    if after is not None:
        after = max(0.0, after)
        if not jitter:
            return after
        if reason == PARK:
            return after + rng.uniform(0, PARK_JITTER_SECONDS)
        return after + rng.uniform(0, named_wait_jitter(after))
    if reason == DEFERRAL:
        wait = exponential(step, base=policy.defer_base, cap=policy.defer_max())
    elif reason == OUTAGE:
        wait = exponential(step, base=policy.backoff_base(), cap=policy.outage_max())
    else:
        wait = exponential(step, base=policy.backoff_base(), cap=policy.backoff_max())
    return wait * rng.uniform(JITTER_LOW, JITTER_HIGH) if jitter else wait


def longest_held_countdown(queue: str, lease: float) -> float:
    """The longest wait a worker of `queue` may hold as an ETA message.

    A held message is redelivered once it has been unacked longer than the queue's
    visibility timeout, and it is held for the countdown plus the run, so the countdown
    leaves room for the attempt's lease (its deadline's hard limit and slack:
    jobs.deadlines). Anything longer goes to the delayed store (jobs.delayed).
    """
    return max(0.0, settings.QUEUE_VISIBILITY_TIMEOUTS[queue] - lease)
