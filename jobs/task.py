"""PlumbTask: the one base class every Plumb task runs through.

Around each run it puts, in this order:

1. a duplicate check: a second publish of one delayed-store entry is acknowledged
   without running (jobs.delayed.claim);
2. the message's shape: arguments that cannot belong to a real task are a
   `MalformedTaskMessage`, dead-lettered on this first delivery;
3. the run's in-flight key: a copy of the job that meets another run in flight waits;
4. the circuit breaker of the task's downstream origin (`downstream_host`): while it
   is open the job is parked, without spending an attempt;
5. the metrics of an attempt (only now: a parked run is no attempt) and the running
   registry that keeps the backlog exact (jobs.backlog); 3 to 5 are one script, one
   round trip (`_start`);
6. the task's policy (`policy`, a jobs.policy.RetryPolicy) on what the run raised:
   `RateLimited` defers the job without spending an attempt, up to the policy's
   deferrals; `Transient` (and the policy's `retry_on`) retries it after
   `jobs.policy.delay`; anything else, or a retry past the last attempt, ends it as
   a dead letter (jobs.deadletters), written inside the task's body (`_give_up`). A wait
   a downstream names past RATELIMIT_MAX_WAIT_SECONDS is no wait: the job ends rate
   limited (`after_wait_too_long`). Plumb's own PostgreSQL or Redis away, wherever the run
   meets it (`jobs.policy.infrastructure_away`), is an outage: the job waits without
   spending an attempt, held in the worker when Redis cannot store the wait (`HoldInPlace`).

Every wait takes the same road (`_wait`): a short retry rides in the broker as an ETA
message that a worker holds, when the policy allows it; every other wait (a longer
retry, a deferral, a park, any wait of a policy that holds none) goes to the delayed
store.
Subclasses name their downstream with `downstream_host` and may override the hooks
`before_wait`, `after_final_failure` and `replay_dead_letter`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
import traceback
import types
import typing
import uuid
from dataclasses import dataclass

from celery import Task
from celery.exceptions import Ignore, Reject, Retry, WorkerLostError
from celery.worker.request import Request
from django.conf import settings
from django.db import transaction
from redis import RedisError
from redis.client import Pipeline

from config.redis import REDIS_NOW_LUA, lua, queue_script, redis_client
from jobs import backlog, breakers, deadletters, delayed, instrumentation, timelimits
from jobs.deadlines import Deadline
from jobs.errors import MalformedTaskMessage, RateLimited, Transient, WaitTooLong
from jobs.headers import (
    CARRIED_HEADERS,
    DEFERRALS_HEADER,
    FIRST_FAILED_AT_HEADER,
    OUTAGES_HEADER,
    RESUME_HEADER,
    header,
)
from jobs.lifecycle import Job
from jobs.policy import (
    DEFERRAL,
    INFRASTRUCTURE_UNAVAILABLE,
    OUTAGE,
    PARK,
    RETRY,
    RetryPolicy,
    delay,
    infrastructure_away,
    longest_held_countdown,
    longest_wait,
    too_long,
)
from observability import metrics
from observability.metrics import METRIC_WRITES_LUA

log = logging.getLogger(__name__)

# What each kind of wait is counted as (plumb_task_retries_total{reason}), and logged as.
RETRY_REASONS = {
    RETRY: "error", DEFERRAL: "rate_limited", PARK: "breaker_parked", OUTAGE: "outage",
}  # fmt: skip
LOG_EVENTS = {
    RETRY: "task.retry", DEFERRAL: "task.deferred", PARK: "task.parked",
    OUTAGE: "task.outage_wait",
}  # fmt: skip
# An outage wait held in the worker (Redis away) takes at most this share of the task's
# soft time limit, leaving the rest for the run that follows it.
HOLD_SHARE_OF_TIME_LIMIT = 0.5


# Annotations the argument check enforces; any other annotation is not checked.
_CHECKED_TYPES = (int, float, str, bool, list, dict)


def _fits(value, expected) -> bool:
    if isinstance(expected, types.UnionType):  # `str | None`: any member fits
        members = typing.get_args(expected)
        return any(value is None if m is type(None) else _fits(value, m) for m in members)
    if expected not in _CHECKED_TYPES:
        return True
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, expected)


def _type_name(expected) -> str:
    return getattr(expected, "__name__", None) or str(expected)


# A run's in-flight key this old, its row not in an attempt, belongs to no live run.
STALE_FLIGHT_SECONDS = 10.0


def in_flight_key(task_id: str) -> str:
    return f"jobs:in-flight:{task_id}"


# Left only by the run that holds it: a copy's token never deletes the original's key.
_LEAVE_FLIGHT = lua(
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
)

# Kept longer only by the run that holds it (PlumbTask.hold_flight).
_HOLD_FLIGHT = lua(
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
)

# An attempt's start in one round trip: the run takes its in-flight key, asks its breaker,
# and only when both let it run notes it running (jobs.backlog) and counts it. A refusal
# writes nothing else: a parked run is no attempt, and a copy that met the key asks no
# breaker. Answers the permit ({decision, release in, transition}, as ACQUIRE_LUA), or
# {'in_flight'} when another run holds the key.
# KEYS: the in-flight key, the breaker's key, the running registry, then the metrics'.
# ARGV: the flight's token ('' to take none) and lapse in ms, '1' to ask the breaker (else
# ''), its four settings (breakers.acquire_args), the run's id and lease, then the metrics'.
_START = lua(
    REDIS_NOW_LUA
    + breakers.ACQUIRE_LUA
    + backlog.RUNNING_LUA
    + METRIC_WRITES_LUA
    + """
if ARGV[1] ~= '' and not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {'in_flight', '0', ''}
end
local now = redis_now()
local permit = {'allow', '0', ''}
if ARGV[3] ~= '' then
  permit = breaker_acquire(KEYS[2], now, tonumber(ARGV[4]), tonumber(ARGV[5]),
                           tonumber(ARGV[6]), tonumber(ARGV[7]))
  if permit[1] ~= 'allow' and permit[1] ~= 'probe' then return permit end
end
note_running(KEYS[3], now, ARGV[8], tonumber(ARGV[9]))
local failed = metric_writes(3, 10)
if failed then return failed end
return permit
"""
)


@dataclass(frozen=True)
class Start:
    """What an attempt's start found: its run's id in the running registry, and its
    breaker's permit (None: no breaker asked, or none could be)."""

    run_id: str
    permit: breakers.Permit | None


class Waiting(Ignore):
    """The job was sent back to wait (deferred or parked): this run ends with no verdict."""


class HoldInPlace(Exception):  # noqa: N818 (a signal inside the runtime, not an error)
    """An outage wait that Redis cannot store: the worker holds the job, its message
    unacknowledged, and runs it again after `seconds` (PlumbTask.__call__)."""

    def __init__(self, seconds: float, why: str):
        super().__init__(why)
        self.seconds = seconds


def _leave_dead_flight(task, task_id: str) -> None:
    """Free the in-flight key of a run whose process died (in the worker's main process)."""
    if getattr(task, "job", None) is None:
        return
    try:
        redis_client().delete(in_flight_key(task_id))
    except RedisError as exc:
        # It lapses with its lease: the copy waits that long instead of running at once.
        log.warning("task.flight_not_left", extra={"task": task.name, "error": repr(exc)})


class PlumbRequest(Request):
    """A request whose hard time limit ends in the task's own failure hooks, with its context,
    and whose lost pool process leaves its job's in-flight key free for the requeued copy.

    Celery runs `on_failure` for a hard time limit in the worker's main process, where
    the task's request stack is empty: the attempt count and headers read there would
    be a blank request's. The task is dead-lettered (and its audit finished as failed)
    at once, not left `running` for the reconciler to run again and again.
    """

    def on_failure(self, exc_info, send_failed_event=True, return_ok=False):
        # A pool process that died (SIGKILL, OOM) held its job's in-flight key, and Celery
        # is about to requeue the message (task_reject_on_worker_lost): the key names a run
        # that is gone, so the copy must find it free and run at once, not wait it out.
        exc = getattr(exc_info.exception, "exc", exc_info.exception)
        if isinstance(exc, (WorkerLostError, SystemExit, KeyboardInterrupt)):
            _leave_dead_flight(self.task, self.id)
        return super().on_failure(exc_info, send_failed_event, return_ok)

    def on_timeout(self, soft, timeout):
        if soft:
            return super().on_timeout(soft, timeout)
        self.task.request_stack.push(self._context)
        try:
            return super().on_timeout(soft, timeout)
        finally:
            self.task.request_stack.pop()


class PlumbTask(Task):
    abstract = True
    Request = PlumbRequest
    policy: RetryPolicy = RetryPolicy()
    # The task's deadline budget (jobs.deadlines), declared once: its soft and hard time
    # limits, its running lease and what it holds are derived from it. Given as an option
    # (`@shared_task(deadline=...)`) or by the task's job.
    deadline: Deadline | None = None
    # The kind of job whose row this task runs (jobs.lifecycle), keyed by its first
    # argument: the runtime records each wait on the row.
    job: Job | None = None
    # Celery's own retry machinery is off: the policy decides (`_wait`).
    autoretry_for = ()
    retry_backoff = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.deadline is None and cls.job is not None:
            cls.deadline = cls.job.deadline
        if cls.deadline is not None:
            cls.soft_time_limit, cls.time_limit = cls.deadline.soft, cls.deadline.hard

    def downstream_host(self, args: tuple, kwargs: dict) -> str | None:
        """The origin this run will call (its breaker's key, as `outbound.urls.origin_key`
        spells it: scheme, normalized host and port), or None for no breaker.

        Raise MalformedTaskMessage when the arguments cannot belong to a real task
        (an id of the wrong type, a row that never existed).
        """
        return None

    # --- running ---------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if self.request.called_directly:
            return super().__call__(*args, **kwargs)
        # Redis away: the outage wait cannot be stored, so this worker holds the job (its
        # message unacknowledged) and runs it again, within a share of its time limit.
        hold_until = time.monotonic() + HOLD_SHARE_OF_TIME_LIMIT * self._time_budget()
        while True:
            try:
                return self._run(args, kwargs)
            except HoldInPlace as hold:
                if time.monotonic() + hold.seconds > hold_until:
                    # The row says the job waits (before_wait); the reconciler
                    # publishes it again once Redis answers (jobs.reconcile).
                    raise Waiting(f"{hold} (held as long as its time limit allows)") from hold
                log.info(
                    "task.outage_held",
                    extra={"task": self.name, "task_id": self.request.id,
                           "delay_seconds": round(hold.seconds, 3), "reason": str(hold)},
                )  # fmt: skip
                time.sleep(hold.seconds)
                # The next hold backs off further: this message's header cannot say so.
                self.request.plumb_outages_held = getattr(self.request, "plumb_outages_held", 0) + 1

    def _time_budget(self) -> float:
        queue = self._queue()
        return self.soft_time_limit or settings.QUEUE_VISIBILITY_TIMEOUTS[queue]

    def _lease(self) -> float:
        """How long the attempt's running entry outlives a worker that died running it."""
        if self.deadline is not None:
            return self.deadline.lease
        return settings.QUEUE_VISIBILITY_TIMEOUTS[self._queue()]

    def _run(self, args, kwargs):
        """One run; a failure for good is recorded here, inside the task's body, and on the
        row before the run's in-flight key is left: a copy waiting for the key never finds
        the row still in an attempt that is over."""
        try:
            return self._run_once(args, kwargs)
        except (Retry, Ignore, Reject, HoldInPlace):
            raise
        except Exception as exc:
            self._give_up(exc)
            raise
        finally:
            self._leave_flight()

    def _run_once(self, args, kwargs):
        request = self.request
        try:
            if not delayed.claim(self._headers(request)):
                log.info("task.duplicate_skipped", extra={"task": self.name, "task_id": request.id})
                return None
            self._check_arguments(args, kwargs)
            host = self.downstream_host(args, kwargs)
            start = self._start(host, take_flight=True)
            if start is None and self._flight_taken_over():
                start = self._start(host, take_flight=False)
        except INFRASTRUCTURE_UNAVAILABLE as exc:
            # Redis or the database, not the message, is at fault: wait it out.
            return self._after_error(exc)
        if start is None:
            log.info("task.duplicate_in_flight", extra={"task": self.name, "task_id": request.id})
            # Not dropped: this copy may be the one that carries the job (a redelivery that
            # came before the killed run's key lapsed). It waits, and touches no row: the
            # row is the run's that holds the key.
            deferrals = int(header(request, DEFERRALS_HEADER) or 0)
            self._wait(DEFERRAL, step=deferrals + 1, after=None, deferrals=deferrals + 1,
                       why="another copy of this job is in flight", on_row=False)  # fmt: skip
        permit = start.permit
        if permit is not None and not permit.allowed:
            reason = f"breaker {permit.decision.replace('_', '-')} for {host}"
            self._wait(PARK, after=permit.release_in, why=reason)
        return self._attempt(host, start, args, kwargs)

    # --- an attempt's start, and one copy of a job in flight ------------------------
    def _start(self, host: str | None, *, take_flight: bool) -> Start | None:
        """Start an attempt in one round trip (`_START`): take the run's in-flight key
        (`take_flight`, for a job with a row), ask the breaker of `host`, and if both let it
        run, note it in the running registry and count it. None: another run holds the key.

        Redis away raises when the key was to be taken (the run cannot know it is alone);
        otherwise the run goes on unrecorded, its breaker failing open, as when a breaker or
        the bookkeeping cannot be reached in any other step.
        """
        request = self.request
        flight_token = ""
        if take_flight and self.job is not None:
            flight_token = getattr(request, "plumb_flight_token", None)
            if flight_token is None:
                flight_token = request.plumb_flight_token = uuid.uuid4().hex
        breaker = (
            breakers.Breaker(self.name, host)
            if host is not None and settings.BREAKER_ENABLED
            else None
        )
        run_id = f"{request.id}:{time.monotonic_ns()}"
        writes = instrumentation.attempt_started_writes(self) or metrics.Writes([], [])
        flight_key = in_flight_key(request.id)
        try:
            answer = _START(
                keys=[flight_key, breaker.key if breaker else flight_key,
                      backlog.running_key(self._queue()), *writes.keys],
                args=[flight_token, int(self._flight_lapse() * 1000), "1" if breaker else "",
                      *breakers.acquire_args(), run_id, self._lease(), *writes.args],
                client=redis_client(),
            )  # fmt: skip
        except RedisError as exc:
            if flight_token:
                raise
            if breaker is not None:
                log.warning("breaker.unavailable", extra={"task": self.name, "host": host})
            log.warning(
                "task.bookkeeping_unrecorded",
                extra={"task": self.name, "moment": "attempt_started", "error": repr(exc)},
            )
            return Start(run_id, permit=None)
        if answer[0] == b"in_flight":
            return None
        return Start(run_id, permit=breaker.permitted(answer) if breaker else None)

    def _flight_lapse(self) -> float:
        """How long a run's in-flight key outlives a worker that died holding it: the task's
        lease or its queue's visibility timeout, whichever is shorter, so no longer than
        its message stays unacknowledged."""
        return min(self._lease(), settings.QUEUE_VISIBILITY_TIMEOUTS[self._queue()])

    def _flight_taken_over(self) -> bool:
        """A job's run holds `jobs:in-flight:<task id>` while it runs (`_start`); found
        held, may this delivery run its job after all? True when the key is its own, or
        stale (taken over); False while another copy of the job (the same task id) is in
        flight.

        Two copies of one job exist when the reconciler publishes again a message that was
        not lost: after Redis restarted with its data (an AOF, a replica), it cannot tell
        which messages survived and publishes every recent row again. A copy that met its
        original in flight claimed the running row a second time: 14 of 60 audits counted
        2-3 attempts and fetched their page twice (bench/outages.py, redis-20s-kept). Now
        the copy waits (`_run_once`) until the run that holds the key ends; its claim then
        finds the row finished, or runs it once.

        The key names this delivery, not this run: a run held in the worker (Redis away,
        HoldInPlace) runs again under it, even if its release could not be written. It
        lapses after `_flight_lapse`. Only jobs with a row (`job`) take it: their claims
        count attempts.
        """
        request = self.request
        key = in_flight_key(request.id)
        client = redis_client()
        holder = client.get(key)
        if holder is None or holder.decode() == request.plumb_flight_token:
            return True
        # A run that ended while Redis was away could not delete its key (a run held in
        # the worker past its budget): its copy waited out the whole lapse, and the last
        # audit of a 20 s outage succeeded 95 s after it. A key that old whose row is not
        # in an attempt has no live run behind it: take it over. A holder still between
        # taking the key and claiming the row is milliseconds old, not seconds.
        lapse = self._flight_lapse()
        age = lapse - max(0, client.pttl(key)) / 1000
        if age >= STALE_FLIGHT_SECONDS and not self._row_running(request.args):
            client.set(key, request.plumb_flight_token, px=int(lapse * 1000))
            return True
        return False

    def _row_running(self, args) -> bool:
        job = self.job
        if not args:
            return False
        return job.model.objects.filter(pk=args[0], **{job.status_field: job.running}).exists()

    def hold_flight(self, seconds: float) -> bool:
        """Keep this run's in-flight key `seconds` from now, past its queue's visibility
        timeout if need be: a job calls it just before an exchange whose repetition the
        downstream would notice (a webhook's POST), so a copy the broker hands on while
        the exchange is still waiting (its message outlived the visibility timeout) waits
        for it instead of making it a second time. False if the key is no longer this
        run's: it lapsed, and a copy may be running the job."""
        if self.job is None:
            return True
        return bool(
            _HOLD_FLIGHT(
                keys=[in_flight_key(self.request.id)],
                args=[getattr(self.request, "plumb_flight_token", ""), int(seconds * 1000)],
                client=redis_client(),
            )
        )

    def _leave_flight(self, pipe: Pipeline | None = None) -> None:
        """Delete this run's in-flight key; with `pipe`, in the caller's pipeline (a
        successful attempt's end: nothing is left to record on the row after it)."""
        request = self.request
        token = getattr(request, "plumb_flight_token", None)
        if self.job is None or token is None or getattr(request, "plumb_flight_left", False):
            return  # never taken (the run ended before it), or left with the attempt's end
        keys, args = [in_flight_key(request.id)], [token]
        if pipe is not None:
            queue_script(pipe, _LEAVE_FLIGHT, keys=keys, args=args)
            request.plumb_flight_left = True
            return
        try:
            _LEAVE_FLIGHT(keys=keys, args=args, client=redis_client())
        except RedisError as exc:
            # It lapses with its lease; a rerun of this delivery holds it still (its token).
            log.warning("task.flight_not_left", extra={"task": self.name, "error": repr(exc)})

    def _attempt(self, host, start: Start, args, kwargs):
        queue = self._queue()
        permit = start.permit
        hard, soft = self.request.timelimit or (None, None)
        timelimits.attempt_started(
            self.name, self.request.id,
            soft_limit=soft or self.soft_time_limit, hard_limit=hard or self.time_limit,
        )  # fmt: skip
        outcome = breakers.NO_VERDICT
        try:
            result = super().__call__(*args, **kwargs)
        except RateLimited as exc:
            return self._after_rate_limit(exc)
        except Exception as exc:
            if isinstance(exc, Transient):
                outcome = breakers.FAILURE
            return self._after_error(exc)
        else:
            outcome = breakers.SUCCESS
            return result
        finally:
            timelimits.attempt_stopped()
            # The attempt's end, its metrics and its breaker's verdict in one round trip.
            pipe = redis_client().pipeline(transaction=False)
            if outcome == breakers.SUCCESS:
                instrumentation.completed(self, pipe=pipe)
                # The run is over: its in-flight key goes in this round trip, not one more.
                self._leave_flight(pipe)
            backlog.attempt_stopped(queue, start.run_id, pipe=pipe)
            if permit is None:
                self._send_bookkeeping(pipe, "attempt_stopped")
            else:
                breaker = breakers.Breaker(self.name, host)
                breaker.record(permit, outcome, pipe=pipe)
                answers = self._send_bookkeeping(pipe, "attempt_stopped")
                self._after_verdict(breaker, None if answers is None else answers[-1])

    def _send_bookkeeping(self, pipe, moment: str) -> list | None:
        """Send the pipeline; its answers, or None when it could not be sent."""
        try:
            answers = pipe.execute(raise_on_error=False)
        except RedisError as exc:
            # Best effort: the run goes on (and its outcome stands) without its bookkeeping.
            log.warning(
                "task.bookkeeping_unrecorded",
                extra={"task": self.name, "moment": moment, "error": repr(exc)},
            )
            return None
        failed = [answer for answer in answers if isinstance(answer, Exception)]
        if failed:
            log.warning(
                "task.bookkeeping_unrecorded",
                extra={"task": self.name, "moment": moment, "error": repr(failed[0])},
            )
        return answers

    def _after_verdict(self, breaker: breakers.Breaker, answer) -> None:
        """Act on the breaker's answer to the verdict (None or an error: it was not recorded)."""
        if answer is None or isinstance(answer, Exception):
            log.error("breaker.record_failed", extra={"task": self.name, "host": breaker.host})
            return
        try:
            breaker.recorded(answer)
        except Exception:
            # Bookkeeping must not turn a finished run into a failed one.
            log.exception("breaker.record_failed", extra={"task": self.name, "host": breaker.host})

    def _check_arguments(self, args: tuple, kwargs: dict) -> None:
        """Arguments that do not fit the task's signature, or not the types it annotates
        (`link_check_id: int`, `audit_id: str`), are a malformed message: the same check
        for every task, before anything looks a row up with them."""
        signature = self._run_signature
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise MalformedTaskMessage(f"arguments do not fit {self.name}: {exc}") from None
        for name, value in bound.arguments.items():
            expected = signature.parameters[name].annotation
            if not _fits(value, expected):
                raise MalformedTaskMessage(
                    f"argument {name} of {self.name} must be {_type_name(expected)}, "
                    f"got {value!r:.100}"
                )

    @functools.cached_property
    def _run_signature(self) -> inspect.Signature:
        """The run function's signature, its annotations evaluated (read once per task)."""
        return inspect.signature(self.run, eval_str=True)

    # --- what a run raised -------------------------------------------------------
    def _after_rate_limit(self, exc: RateLimited):
        deferrals = int(header(self.request, DEFERRALS_HEADER) or 0)
        # A host that keeps refusing us: its waits now spend attempts, so it ends. A
        # wait nobody timed (every slot of a host busy) is our own politeness, not a
        # refusal: slots turn over, so it is deferred on, however many turns it takes.
        if deferrals >= self.policy.max_deferrals and exc.retry_at is not None:
            return self._after_error(exc)
        self._wait(
            DEFERRAL,
            step=deferrals + 1,
            after=None if exc.retry_at is None else exc.retry_after,
            why=str(exc),
            exc=exc,
            deferrals=deferrals + 1,
        )

    def _after_error(self, exc: BaseException):
        request = self.request
        if infrastructure_away(exc) and self.policy.retries(exc):
            # Not the downstream's failure, nor the job's: no attempt is spent, however
            # long it lasts (DECISIONS.md, "An outage spends no attempt").
            outages = int(header(request, OUTAGES_HEADER) or 0)
            outages += getattr(request, "plumb_outages_held", 0)
            self._wait(OUTAGE, step=outages + 1, after=None, exc=exc, outages=outages + 1,
                       why=f"{exc.__class__.__name__}: {exc}")  # fmt: skip
        if not self.policy.retries(exc) or request.retries >= self.policy.max_attempts() - 1:
            raise exc
        self._wait(RETRY, step=request.retries + 1, after=getattr(exc, "retry_after", None),
                   why=f"{exc.__class__.__name__}: {exc}", exc=exc)  # fmt: skip

    def _wait(
        self,
        reason: str,
        *,
        step: int = 1,
        after: float | None,
        why: str,
        exc: BaseException | None = None,
        deferrals: int | None = None,
        outages: int | None = None,
        on_row: bool = True,
    ):
        """Send this job back to wait; raises Retry (a retry) or Waiting (deferral, park,
        outage), or HoldInPlace (an outage wait that Redis cannot store). `on_row=False`:
        the row is not told (a copy waiting for the run that owns the row).

        A wait a downstream named past RATELIMIT_MAX_WAIT_SECONDS is not waited
        (`_refuse_wait`): the job ends rate limited.
        """
        if reason != PARK and too_long(after):
            return self._refuse_wait(after, why=why, exc=exc)
        request = self.request
        seconds = delay(self.policy, reason, step=step, after=after)
        queue = self._queue()
        # Only a short retry rides in the broker: parks and deferrals come in bursts (an
        # outage, a host's limit), and a worker holding thousands of ETA messages it
        # cannot run is what the store exists to prevent.
        held = (
            reason == RETRY
            and self.policy.countdowns_held
            and seconds <= longest_held_countdown(queue, self._lease())
        )
        # A retry spends an attempt; a deferral or a park does not.
        retries = request.retries + 1 if reason == RETRY else request.retries
        headers = {name: header(request, name) for name in CARRIED_HEADERS}
        headers = {name: value for name, value in headers.items() if value is not None}
        if reason == RETRY:
            headers.setdefault(FIRST_FAILED_AT_HEADER, time.time())
        if deferrals is not None:
            headers[DEFERRALS_HEADER] = deferrals
        if reason != RETRY:
            # No attempt spent: the next run goes on from where this one (or an earlier
            # deferred one) stopped. A retry is a new attempt, from the beginning.
            resume = getattr(exc, "resume", None) or header(request, RESUME_HEADER)
            if resume is not None:
                headers[RESUME_HEADER] = resume
        if outages is not None:
            headers[OUTAGES_HEADER] = outages
        log.info(
            LOG_EVENTS[reason],
            extra={
                "task": self.name, "task_id": request.id,
                "attempt": request.retries + 1, "delay_seconds": round(seconds, 3),
                "held": held, "reason": why, "deferrals": deferrals,
            },
        )  # fmt: skip
        try:
            if on_row:
                self.before_wait(reason, seconds, why=why, args=request.args, kwargs=request.kwargs)
        except INFRASTRUCTURE_UNAVAILABLE as error:
            # The row cannot say it waits (the database is what failed): the wait is still
            # stored, and its next run's claim puts the row right.
            log.warning(
                "task.wait_not_recorded",
                extra={"task": self.name, "task_id": request.id, "error": repr(error)},
            )
        try:
            instrumentation.waited(self, RETRY_REASONS[reason])
            if held:
                self.apply_async(
                    args=request.args, kwargs=request.kwargs, task_id=request.id, queue=queue,
                    countdown=seconds, retries=retries, headers=headers,
                )  # fmt: skip
            else:
                entry = delayed.Entry(
                    task=self.name, queue=queue, task_id=request.id,
                    args=list(request.args or []), kwargs=dict(request.kwargs or {}),
                    retries=retries, headers=headers, wait=reason, reason=why,
                    wait_on=exc.wait_on if isinstance(exc, RateLimited) else None,
                )  # fmt: skip
                delayed.schedule(entry, delay=seconds)
        except INFRASTRUCTURE_UNAVAILABLE as error:
            if reason == OUTAGE:
                raise HoldInPlace(seconds, why) from error
            # Redis (or the broker) is away, so the wait cannot be stored. The job has not
            # failed: its row records the wait (before_wait), and the reconciler publishes
            # it again once Redis answers (jobs.reconcile). Raised on, this error failed
            # the job for good ("gave up after 1 attempt") in the middle of a Redis blip.
            log.warning(
                "task.wait_not_stored",
                extra={"task": self.name, "task_id": request.id,
                       "error": f"{error.__class__.__name__}: {error}"},
            )  # fmt: skip
            raise Waiting(f"{why} (the wait could not be stored: Redis is away)") from error
        if reason == RETRY:
            # Celery records the retry (task_retry, state RETRY) and acknowledges the message.
            raise Retry(exc=exc, when=seconds)
        raise Waiting(why)

    def _refuse_wait(self, after: float, *, why: str, exc: BaseException | None):
        """End the job rate limited, carrying the time asked for: its hook records the
        outcome (returns None), or it fails with WaitTooLong (a dead letter, as any
        failure)."""
        request = self.request
        retry_at = time.time() + after
        until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(retry_at))
        error = WaitTooLong(
            f"rate limited until {until} (longer than the {longest_wait():g} s "
            f"RATELIMIT_MAX_WAIT_SECONDS allows): {why}",
            retry_at=retry_at,
            status_code=getattr(exc, "status_code", None),
        )
        log.info(
            "task.wait_refused",
            extra={"task": self.name, "task_id": request.id, "retry_at": error.retry_at,
                   "reason": why},
        )  # fmt: skip
        if self.after_wait_too_long(error, args=request.args, kwargs=request.kwargs):
            return None
        raise error from exc

    def resumes_after_outage(self) -> bool:
        """Did this job wait out an outage? Its run may then follow a claim whose attempt
        the outage wait could not give back (the database was away)."""
        return bool(header(self.request, OUTAGES_HEADER))

    def attempt_number(self) -> int:
        """Which attempt of its budget this run is (1 for the first)."""
        return self.request.retries + 1

    def _queue(self) -> str:
        """The queue this message came from (or the task's own)."""
        delivery_info = self.request.delivery_info or {}
        return delivery_info.get("routing_key") or self.queue or settings.CELERY_TASK_DEFAULT_QUEUE

    @staticmethod
    def _headers(request) -> dict:
        return {
            name: header(request, name) for name in (delayed.ENTRY_HEADER, delayed.PUBLISH_HEADER)
        }

    # --- giving up ---------------------------------------------------------------
    def _give_up(self, exc: Exception) -> None:
        """Record a failure for good (dead letter, then the task's hook) inside the body.

        The outcome that cannot be written (PostgreSQL away) is no outcome: the job waits
        out the outage instead, with no attempt spent, and ends once it can be written.
        Raised from on_failure, outside the body, this error was Celery's "Exception
        raised outside body": the message neither recorded nor acknowledged.
        """
        try:
            self._record_failure(exc, self.request.id, self.request.args, self.request.kwargs,
                                 traceback.format_exc())  # fmt: skip
        except INFRASTRUCTURE_UNAVAILABLE as error:
            if not infrastructure_away(error):
                raise
            log.warning(
                "task.failure_not_recorded",
                extra={"task": self.name, "task_id": self.request.id,
                       "error": f"{error.__class__.__name__}: {error}"},
            )  # fmt: skip
            self._after_error(error)
        self.request.plumb_failure_recorded = True

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        """Celery's hook: a failure the body recorded already (`_give_up`) is done; one
        that ended outside the body (a hard time limit, in the worker's main process) is
        recorded here. It never raises: what cannot be written now (PostgreSQL away) is
        left to the reconciler, which finds the row still owed."""
        if getattr(self.request, "plumb_failure_recorded", False):
            return
        try:
            self._record_failure(exc, task_id, args, kwargs,
                                 str(einfo.traceback) if einfo else "")  # fmt: skip
        except Exception as error:
            log.error(
                "task.failure_not_recorded",
                extra={"task": self.name, "task_id": task_id,
                       "error": f"{error.__class__.__name__}: {error}"},
            )  # fmt: skip

    def _record_failure(self, exc, task_id, args, kwargs, traceback_text: str) -> None:
        """The dead letter and the task's hook, in one transaction: both or neither."""
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
        with transaction.atomic():
            deadletters.record_task_failure(
                task=self,
                task_id=task_id,
                args=args,
                kwargs=kwargs,
                exc=exc,
                traceback=traceback_text,
                attempts=attempts,
                first_failed_at=header(request, FIRST_FAILED_AT_HEADER),
                exhausted=self.policy.retries(exc),
                queue=self._queue(),
            )
            if isinstance(exc, MalformedTaskMessage):
                # Its arguments name no row the hook could finish (or not one of this task's).
                log.error("task.malformed_message", extra={"task": self.name, "error": str(exc)})
            else:
                self._final_failure_hook(exc, args, kwargs)
        instrumentation.failed(self)

    def _final_failure_hook(self, exc, args, kwargs) -> None:
        try:
            with transaction.atomic():
                self.after_final_failure(exc, args=args, kwargs=kwargs)
        except Exception as error:
            if infrastructure_away(error):
                raise  # neither is written: the outcome is written once the database returns
            # Celery would fail the task again with the hook's error: a second dead letter
            # for one message. The dead letter above is the record; the hook's failure is logged.
            log.exception("task.final_failure_hook_failed", extra={"task": self.name})

    # --- hooks -------------------------------------------------------------------
    def before_wait(self, reason: str, seconds: float, *, why: str, args, kwargs) -> None:
        """Called before the job is sent back to wait (retry, deferral, park or outage),
        while the task still holds its message: its row says it waits, and until when.
        A subclass adds its own fields with `waiting_fields`."""
        if self.job is None or not args:
            return
        self.job.wait(
            args[0], seconds=seconds, attempt_spent=reason == RETRY, task_id=self.request.id,
            **self.waiting_fields(reason, why),
        )  # fmt: skip

    def waiting_fields(self, reason: str, why: str) -> dict:
        """More of the row to write as the job waits (an audit's `error` says why)."""
        return {}

    def after_final_failure(self, exc, *, args, kwargs) -> None:
        """Called once no attempt is left (or the error was not retryable)."""

    def after_wait_too_long(self, error: WaitTooLong, *, args, kwargs) -> bool:
        """A downstream asked for a wait past RATELIMIT_MAX_WAIT_SECONDS. Return True once
        the job's outcome is recorded (it ends as done); False fails it with `error`
        (dead letter, then `after_final_failure`)."""
        return False

    def replay_dead_letter(self, args: list, kwargs: dict) -> str:
        """Enqueue the task again from a dead letter; return the new task id.

        Called inside the transaction that marks the dead letter replayed:
        publish on commit. Raise jobs.errors.CannotReplay when replaying would
        make no sense.
        """
        return deadletters.send_on_commit(self, args, kwargs)
