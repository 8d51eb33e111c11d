"""How a retry is delayed: the one retry policy every Plumb task uses.

Exponential backoff from RETRY_BACKOFF_BASE_SECONDS, capped at
RETRY_BACKOFF_MAX_SECONDS, with multiplicative jitter in [0.75, 1.25] applied
after the cap as well, so tasks that failed together do not come back
together even once they have all reached the cap. A downstream's Retry-After
wins over the computed delay, is never shortened, and gets a small positive
jitter on top.
"""

from __future__ import annotations

import logging
import random
import time
from typing import NoReturn

from celery import Task
from celery.exceptions import Ignore
from django.conf import settings

log = logging.getLogger(__name__)

JITTER_LOW, JITTER_HIGH = 0.75, 1.25


def backoff_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    jitter: bool = True,
    rng: random.Random | None = None,
) -> float:
    """Delay before retry number `attempt` (1 for the first retry).

    `jitter=False` (exact doubling) exists only so a benchmark can show the
    waves it causes; every Plumb task keeps the jitter.
    """
    rng = rng or random
    exponential = min(cap, base * (2 ** max(0, attempt - 1)))
    if not jitter:
        return exponential
    return exponential * rng.uniform(JITTER_LOW, JITTER_HIGH)


def retry_after_delay(retry_after: float, *, rng: random.Random | None = None) -> float:
    """A downstream's own wait, in full, plus up to 10 % (at least up to 1 s) more."""
    rng = rng or random
    return retry_after + rng.uniform(0, max(1.0, 0.1 * retry_after))


def retry_delay(
    attempt: int,
    *,
    retry_after: float | None = None,
    base: float | None = None,
    cap: float | None = None,
    jitter: bool = True,
    rng: random.Random | None = None,
) -> float:
    if retry_after is not None:
        return retry_after_delay(retry_after, rng=rng)
    return backoff_delay(
        attempt,
        base=settings.RETRY_BACKOFF_BASE_SECONDS if base is None else base,
        cap=settings.RETRY_BACKOFF_MAX_SECONDS if cap is None else cap,
        jitter=jitter,
        rng=rng,
    )


class PlumbTask(Task):
    """Base task: `autoretry_for` errors are retried with `retry_delay`.

    Subclasses set `max_attempts_setting` (the name of the setting holding the
    total number of attempts), may name their own backoff base and cap settings
    (`backoff_base_setting`, `backoff_max_setting`; a downstream with its own
    pace, such as webhook receivers, needs a slower schedule than page fetches),
    and may override `before_retry` / `after_final_failure` to record the state
    a user sees.
    """

    abstract = True
    max_attempts_setting = "AUDIT_MAX_ATTEMPTS"
    backoff_base_setting = "RETRY_BACKOFF_BASE_SECONDS"
    backoff_max_setting = "RETRY_BACKOFF_MAX_SECONDS"
    # Names a boolean setting that can turn the jitter off (benchmarks only).
    backoff_jitter_setting: str | None = None
    # Celery's own backoff is off: the delay is decided in `retry` below.
    retry_backoff = False

    def max_attempts(self) -> int:
        return getattr(settings, self.max_attempts_setting)

    def retry_delay(
        self, attempt: int, *, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float:
        """The shared policy with this task's base and cap."""
        jitter = True
        if self.backoff_jitter_setting:
            jitter = getattr(settings, self.backoff_jitter_setting)
        return retry_delay(
            attempt,
            retry_after=retry_after,
            base=getattr(settings, self.backoff_base_setting),
            cap=getattr(settings, self.backoff_max_setting),
            jitter=jitter,
            rng=rng,
        )

    def retry(
        self,
        args=None,
        kwargs=None,
        exc=None,
        throw=True,
        eta=None,
        countdown=None,
        max_retries=None,
        **options,
    ):
        if max_retries is None:
            max_retries = self.max_attempts() - 1
        attempt = self.request.retries + 1
        if countdown is None and eta is None:
            countdown = self.retry_delay(attempt, retry_after=getattr(exc, "retry_after", None))
        if self.request.retries < max_retries:
            log.info(
                "task.retry",
                extra={
                    "task": self.name,
                    "task_id": self.request.id,
                    "attempt": attempt,
                    "delay_seconds": round(countdown or 0, 3),
                    "reason": f"{exc.__class__.__name__}: {exc}" if exc else "",
                    "retry_after": getattr(exc, "retry_after", None),
                },
            )
            self.before_retry(exc, countdown, args=self.request.args, kwargs=self.request.kwargs)
        return super().retry(
            args=args,
            kwargs=kwargs,
            exc=exc,
            throw=throw,
            eta=eta,
            countdown=countdown,
            max_retries=max_retries,
            **options,
        )

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        log.warning(
            "task.failed",
            extra={
                "task": self.name,
                "task_id": task_id,
                "attempts": self.request.retries + 1,
                "error": f"{exc.__class__.__name__}: {exc}",
            },
        )
        self.after_final_failure(exc, args=args, kwargs=kwargs)

    def before_retry(self, exc, countdown, *, args, kwargs) -> None:
        """Called before the retry is published, while the task still holds its message."""

    def after_final_failure(self, exc, *, args, kwargs) -> None:
        """Called once no attempt is left (or the error was not retryable)."""


class Deferred(Ignore):
    """The task was sent again for later; this run ends without a retry or a failure."""


def defer(task: Task, until: float, reason: str, *, key: str = "", resource: str = "") -> NoReturn:
    """Run `task` again at `until` (epoch seconds) plus jitter, without spending an attempt.

    The same task id and the same `retries` count are published again, so a rate
    limit costs no attempt. A wait a worker may hold (half the queue's visibility
    timeout) becomes a countdown; a longer one is parked in Redis and woken by the
    periodic `ratelimit.wake_parked` (see `ratelimit.parking`). Raises `Deferred`,
    which acknowledges the current message.
    """
    from ratelimit.parking import ParkedTask, longest_eta, park, publish

    now = time.time()
    delay = retry_after_delay(max(0.0, until - now))
    request = task.request
    queue = (request.delivery_info or {}).get("routing_key") or task.queue
    parked = ParkedTask(
        name=task.name,
        task_id=request.id,
        queue=queue,
        args=list(request.args or []),
        kwargs=dict(request.kwargs or {}),
        retries=request.retries,
        deferrals=deferrals(task) + 1,
        key=key,
        resource=resource,
        reason=reason,
    )
    parked_in_redis = delay > longest_eta(queue)
    if parked_in_redis:
        park(parked, due=now + delay)
    else:
        publish(parked, countdown=delay)
    log.info(
        "task.deferred",
        extra={
            "task": task.name,
            "task_id": request.id,
            "attempt": request.retries + 1,
            "deferrals": parked.deferrals,
            "delay_seconds": round(delay, 3),
            "parked": parked_in_redis,
            "key": key,
            "resource": resource,
            "reason": reason,
        },
    )
    raise Deferred(reason)


def deferrals(task: Task) -> int:
    """How many times this task was deferred so far."""
    from ratelimit.parking import DEFERRALS_HEADER

    return int(task.request.get(DEFERRALS_HEADER) or 0)
