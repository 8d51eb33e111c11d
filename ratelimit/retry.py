"""How a retry is delayed: the one retry policy every Plumb task uses.

Exponential backoff from RETRY_BACKOFF_BASE_SECONDS, capped at
RETRY_BACKOFF_MAX_SECONDS, with jitter (RETRY_JITTER, multiplicative in
[0.75, 1.25] by default) applied after the cap as well, so tasks that failed
together do not come back together even once they have all reached the cap.
A downstream's Retry-After wins over the computed delay, is never shortened,
and gets a small positive jitter on top. DECISIONS.md ("Retries") has the
measurements behind each choice.

`PlumbTask` puts the policy around every task:
- `autoretry_for` errors are retried with `retry_delay`; a wait longer than a
  worker may hold a message (the queue's visibility timeout) is parked in Redis
  instead of becoming a countdown (ratelimit.parking);
- the task's downstream has a circuit breaker (ratelimit.breakers): while it is
  open the task is parked without using an attempt;
- after the last attempt, or on an error no retry can fix, the task becomes a
  dead letter (ratelimit.deadletters).
"""

from __future__ import annotations

import inspect
import logging
import random
import time
from typing import NoReturn

from celery import Task
from celery.exceptions import Ignore, Retry
from celery.worker.request import Request
from django import db
from django.conf import settings
from redis import RedisError

from observability import metrics
from ratelimit import breakers, deadletters, parking
from ratelimit.deadletters import MalformedTaskMessage

log = logging.getLogger(__name__)

# The database is down or unreachable: worth retrying, never the downstream's fault.
DATABASE_UNAVAILABLE = (db.OperationalError, db.InterfaceError)

JITTER_LOW, JITTER_HIGH = 0.75, 1.25

# Message headers a retried task carries forward.
FIRST_FAILED_AT_HEADER = "plumb_first_failed_at"
LAST_DELAY_HEADER = "plumb_last_delay"


def backoff_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    jitter: str = "multiplicative",
    previous: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """Delay before retry number `attempt` (1 for the first retry).

    `jitter` is one of settings.RETRY_JITTER_CHOICES; `previous` (the last
    delay) is used by "decorrelated" only.
    """
    rng = rng or random
    exponential = min(cap, base * (2 ** max(0, attempt - 1)))
    if jitter == "multiplicative":
        return exponential * rng.uniform(JITTER_LOW, JITTER_HIGH)
    if jitter == "full":
        return rng.uniform(0, exponential)
    if jitter == "equal":
        return exponential / 2 + rng.uniform(0, exponential / 2)
    if jitter == "decorrelated":
        # AWS's "decorrelated jitter": min(cap, uniform(base, previous * 3)).
        return min(cap, rng.uniform(base, max(base, previous or base) * 3))
    if jitter == "none":
        return exponential
    raise ValueError(f"unknown jitter {jitter!r}")


def retry_after_delay(retry_after: float, *, rng: random.Random | None = None) -> float:
    """A downstream's own wait, in full, plus up to 10 % (at least up to 1 s) more."""
    rng = rng or random
    return retry_after + rng.uniform(0, max(1.0, 0.1 * retry_after))


def retry_delay(
    attempt: int,
    *,
    retry_after: float | None = None,
    previous: float | None = None,
    base: float | None = None,
    cap: float | None = None,
    jitter: str | None = None,
    rng: random.Random | None = None,
) -> float:
    if retry_after is not None:
        return retry_after_delay(retry_after, rng=rng)
    return backoff_delay(
        attempt,
        base=settings.RETRY_BACKOFF_BASE_SECONDS if base is None else base,
        cap=settings.RETRY_BACKOFF_MAX_SECONDS if cap is None else cap,
        jitter=settings.RETRY_JITTER if jitter is None else jitter,
        previous=previous,
        rng=rng,
    )


class PlumbRequest(Request):
    """A request whose hard time limit ends in the task's own failure hooks, with its context.

    Celery runs `on_failure` for a hard time limit in the worker's main process, where
    the task's request stack is empty: the attempt count and headers read there would
    be a blank request's. The task is dead-lettered (and its audit finished as failed)
    at once, not left `running` for the reconciler to run again and again.
    """

    def on_timeout(self, soft, timeout):
        if soft:
            return super().on_timeout(soft, timeout)
        self.task.request_stack.push(self._context)
        try:
            return super().on_timeout(soft, timeout)
        finally:
            self.task.request_stack.pop()


class PlumbTask(Task):
    """Base task: retries, circuit breaker, parking and dead letters.

    Subclasses set `max_attempts_setting` (the name of the setting holding the
    total number of attempts), name their downstream with `downstream_host`,
    and may override the hooks `before_retry`, `before_park`,
    `after_final_failure` and `replay_dead_letter`.
    """

    abstract = True
    Request = PlumbRequest
    max_attempts_setting = "AUDIT_MAX_ATTEMPTS"
    # A downstream with its own pace (webhook receivers) names its own base and cap.
    backoff_base_setting = "RETRY_BACKOFF_BASE_SECONDS"
    backoff_max_setting = "RETRY_BACKOFF_MAX_SECONDS"
    # Names a boolean setting that can turn the jitter off (benchmarks only).
    backoff_jitter_setting: str | None = None
    # Celery's own backoff is off: the delay is decided in `retry` below.
    retry_backoff = False
    # Errors that say the downstream is failing, counted by its breaker;
    # None means the task's `autoretry_for`.
    downstream_failures: tuple[type[BaseException], ...] | None = None

    def max_attempts(self) -> int:
        return getattr(settings, self.max_attempts_setting)

    def retry_delay(
        self,
        attempt: int,
        *,
        retry_after: float | None = None,
        previous: float | None = None,
        rng: random.Random | None = None,
    ) -> float:
        """The shared policy with this task's base and cap."""
        jitter = None
        if self.backoff_jitter_setting and not getattr(settings, self.backoff_jitter_setting):
            jitter = "none"
        return retry_delay(
            attempt,
            retry_after=retry_after,
            previous=previous,
            base=getattr(settings, self.backoff_base_setting),
            cap=getattr(settings, self.backoff_max_setting),
            jitter=jitter,
            rng=rng,
        )

    def downstream_host(self, args: tuple, kwargs: dict) -> str | None:
        """The host this run will call (its breaker's key), or None for no breaker.

        Raise MalformedTaskMessage when the arguments cannot belong to a real
        task (an id of the wrong type, a row that never existed).
        """
        return None

    # --- running ---------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if self.request.called_directly:
            return super().__call__(*args, **kwargs)
        self._check_arguments(args, kwargs)
        try:
            host = self.downstream_host(args, kwargs)
        except DATABASE_UNAVAILABLE as exc:
            # The database, not the message, is at fault: try again like any outage.
            raise self.retry(exc=exc) from exc
        if host is None or not settings.BREAKER_ENABLED:
            return super().__call__(*args, **kwargs)

        breaker = breakers.Breaker(self.name, host)
        try:
            permit = breaker.acquire()
        except RedisError:
            # The breaker fails open: without its state, the call goes through.
            log.warning("breaker.unavailable", extra={"task": self.name, "host": host})
            return super().__call__(*args, **kwargs)
        if not permit.allowed:
            delay = permit.park_delay()
            reason = f"breaker {permit.decision.replace('_', '-')} for {host}"
            self.before_park(reason, delay, args=args, kwargs=kwargs)
            # The current `retries`: waiting for a breaker does not use an attempt.
            self.park(delay, reason=reason, retries=self.request.retries)
            metrics.record_retry(self.name, "breaker_parked")
            # Acknowledged without a result: the parked copy is the task now.
            raise Ignore()
        outcome = breakers.NO_VERDICT
        try:
            result = super().__call__(*args, **kwargs)
        except BaseException as exc:
            if self._is_downstream_failure(exc):
                outcome = breakers.FAILURE
            raise
        else:
            outcome = breakers.SUCCESS
            return result
        finally:
            try:
                breaker.record(permit, outcome)
            except Exception:
                # Bookkeeping must not turn a finished run into a failed one.
                log.exception("breaker.record_failed", extra={"task": self.name, "host": host})

    def _check_arguments(self, args: tuple, kwargs: dict) -> None:
        try:
            inspect.signature(self.run).bind(*args, **kwargs)
        except TypeError as exc:
            raise MalformedTaskMessage(f"arguments do not fit {self.name}: {exc}") from None

    def _is_downstream_failure(self, exc: BaseException) -> bool:
        if isinstance(exc, Retry):
            exc = exc.exc
        failures = self.downstream_failures
        if failures is None:
            failures = tuple(getattr(self, "autoretry_for", ()) or ())
        return exc is not None and isinstance(exc, failures)

    # --- retrying ----------------------------------------------------------------
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
        request = self.request
        if max_retries is None:
            max_retries = self.max_attempts() - 1
        if request.called_directly or request.retries >= max_retries:
            # No attempt left: Celery re-raises `exc` and the task fails.
            return super().retry(
                args=args, kwargs=kwargs, exc=exc, throw=throw, eta=eta,
                countdown=countdown, max_retries=max_retries, **options,
            )  # fmt: skip

        attempt = request.retries + 1
        headers = dict(request.headers or {})
        retry_after = getattr(exc, "retry_after", None)
        if countdown is None and eta is None:
            countdown = self.retry_delay(
                attempt, retry_after=retry_after, previous=headers.get(LAST_DELAY_HEADER)
            )
        delay = countdown if countdown is not None else max(0.0, eta.timestamp() - time.time())
        headers.setdefault(FIRST_FAILED_AT_HEADER, time.time())
        headers[LAST_DELAY_HEADER] = delay
        parks = delay > parking.longest_held_delay(self)
        log.info(
            "task.retry",
            extra={
                "task": self.name,
                "task_id": request.id,
                "attempt": attempt,
                "delay_seconds": round(delay, 3),
                "parked": parks,
                "reason": f"{exc.__class__.__name__}: {exc}" if exc else "",
                "retry_after": retry_after,
            },
        )
        self.before_retry(exc, delay, args=request.args, kwargs=request.kwargs)
        if parks:
            # Too long to hold as an ETA: the message would outlive the
            # visibility timeout and be redelivered as a duplicate.
            self.park(
                delay, reason="retry", retries=attempt, headers=headers, args=args, kwargs=kwargs
            )
            retry = Retry(exc=exc, when=delay)
            if throw:
                raise retry
            return retry
        return super().retry(
            args=args, kwargs=kwargs, exc=exc, throw=throw, countdown=countdown, eta=eta,
            max_retries=max_retries, headers=headers, **options,
        )  # fmt: skip

    def park(
        self,
        delay: float,
        *,
        reason: str,
        retries: int,
        headers: dict | None = None,
        args=None,
        kwargs=None,
    ) -> None:
        """Hold this task outside the broker for `delay` seconds, then re-deliver it.

        The copy keeps the task id, the arguments (unless given) and the headers,
        with `retries` as given: a retry passes the next count, a breaker the
        current one.
        """
        request = self.request
        queue = parking.queue_of(self, request)
        options = {"retries": retries}
        if headers is not None:
            options["headers"] = headers
        signature = self.signature_from_request(request, args, kwargs, queue=queue, **options)
        parking.park(signature, delay=delay, queue=queue, reason=reason)

    # --- giving up ---------------------------------------------------------------
    def on_failure(self, exc, task_id, args, kwargs, einfo):
        request = self.request
        attempts = request.retries + 1
        log.warning(
            "task.failed",
            extra={
                "task": self.name,
                "task_id": task_id,
                "attempts": attempts,
                "error": f"{exc.__class__.__name__}: {exc}",
            },
        )
        deadletters.record_task_failure(
            task=self,
            task_id=task_id,
            args=args,
            kwargs=kwargs,
            exc=exc,
            traceback=str(einfo.traceback) if einfo else "",
            attempts=attempts,
            first_failed_at=(request.headers or {}).get(FIRST_FAILED_AT_HEADER),
            exhausted=self._is_retryable(exc),
            queue=parking.queue_of(self, request),
        )
        self.after_final_failure(exc, args=args, kwargs=kwargs)

    def _is_retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, tuple(getattr(self, "autoretry_for", ()) or ()))

    # --- hooks -------------------------------------------------------------------
    def before_retry(self, exc, countdown, *, args, kwargs) -> None:
        """Called before a retry is published (or parked), while the task holds its message."""

    def before_park(self, reason: str, delay: float, *, args, kwargs) -> None:
        """Called before the task is parked without using an attempt (its breaker is open)."""

    def after_final_failure(self, exc, *, args, kwargs) -> None:
        """Called once no attempt is left (or the error was not retryable)."""

    def replay_dead_letter(self, args: list, kwargs: dict) -> str:
        """Enqueue the task again from a dead letter; return the new task id.

        Called inside the transaction that marks the dead letter replayed:
        publish on commit. Raise deadletters.CannotReplay when replaying would
        make no sense.
        """
        return deadletters.send_on_commit(self, args, kwargs)


class Deferred(Ignore):
    """The task was sent again for later; this run ends without a retry or a failure."""


def defer(task: Task, until: float, reason: str, *, key: str = "", resource: str = "") -> NoReturn:
    """Run `task` again at `until` (epoch seconds) plus jitter, without spending an attempt.

    The same task id and the same `retries` count are published again, so a rate
    limit costs no attempt. A wait a worker may hold (half the queue's visibility
    timeout) becomes a countdown; a longer one is parked in Redis and woken by the
    periodic `ratelimit.wake_parked` (see `ratelimit.deferred`). Raises `Deferred`,
    which acknowledges the current message.
    """
    from ratelimit.deferred import ParkedTask, longest_eta, park, publish

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
    metrics.record_retry(task.name, "rate_limited")
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
    from ratelimit.deferred import DEFERRALS_HEADER

    return int(task.request.get(DEFERRALS_HEADER) or 0)
