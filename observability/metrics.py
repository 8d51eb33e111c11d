"""Every metric Plumb exposes, and the one function per event that records it.

Each `record_*` function writes, in one Redis pipeline, both the running total
that `GET /metrics` exposes to Prometheus and the per-minute bucket behind the
dashboard and `GET /api/stats`: the two can never disagree, and the dashboard
works with no Prometheus running. Totals live in Redis rather than in each
process's memory so web processes, Celery pool children and workers on other
hosts all add into one number (DECISIONS.md, "Observability").

Labels are closed sets (checked here: an unknown value is a bug, not a new
series), except `task`, which is a registered task name, and `source`, a registered
owed-work source (jobs.reconcile). Keys and hosts never
become labels; they go into log lines.

Who calls what:
    record_task_attempt / _retry / _completion / _failure / _audit_duration
        jobs.instrumentation, called by PlumbTask for the product's jobs only (audits,
        link checks, webhook deliveries): an attempt once its breaker lets it run (its
        writes, `task_attempt_writes`, applied by the attempt's start script), a
        retry for every wait by its reason (error, rate_limited, breaker_parked, outage).
    record_downstream_request   every HTTP request to a downstream (the outbound client)
    admission decisions         counted by the admission script itself, in the same atomic
                                step that decides (audits.admission, admission_metric_keys)
    record_dead_letter, record_breaker_transition
                                where a job is dead-lettered, where a breaker changes state
    record_republished          jobs.reconcile, per owed-work source a tick published again
    record_samples              observability.sampler, once a minute

Keys in Redis:
    metrics:counter:<metric>     hash  JSON label values -> total
    metrics:exported:<metric>    hash  JSON label values -> the highest total /metrics exported
    metrics:histogram:<metric>   hash  JSON [label values..., bucket|"sum"|"count"] -> value
    metrics:minute:<epoch min>   hash  dashboard field -> count in that minute (and samples)
    metrics:jobs:<epoch min>     HyperLogLog of the job ids attempted in that minute
    metrics:sampled:<epoch min>  which process took that minute's gauge sample (observability.sampler)
Minute keys expire METRICS_RETENTION_HOURS after their minute ends.
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis
from django.conf import settings
from prometheus_client.utils import floatToGoString
from redis.client import Pipeline

from config.redis import lua, queue_script, redis_client

log = logging.getLogger(__name__)

# --- Closed label values ------------------------------------------------------
RETRY_REASONS = ("error", "rate_limited", "breaker_parked", "outage")
KEY_CLASSES = ("host", "github-installation", "github-app", "github-token")
DOWNSTREAM_OUTCOMES = ("ok", "rate_limited", "transient_status", "timeout", "connection_error")
STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx", "none")
ADMISSION_DECISIONS = ("admitted", "refused_ip", "refused_client", "refused_backlog")
BREAKER_STATES = ("closed", "open", "half_open")
AUDIT_OUTCOMES = ("succeeded", "retried", "failed")
BOOLEAN = ("false", "true")

# The task whose attempts are "audits" for the audit-duration histogram.
AUDIT_TASK = "audits.run_audit"


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # counter | gauge | histogram
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()


# --- Counters (exposed with a _total suffix) ----------------------------------
TASK_ATTEMPTS = Metric(
    "plumb_task_attempts",
    "counter",
    "Task executions started (first attempts and retries).",
    ("task",),
)
TASK_FIRST_ATTEMPTS = Metric(
    "plumb_task_first_attempts",
    "counter",
    "Task executions that were a job's first attempt.",
    ("task",),
)
TASK_RETRIES = Metric(
    "plumb_task_retries",
    "counter",
    "Retries scheduled, by why the attempt did not finish.",
    ("task", "reason"),
)
TASK_COMPLETIONS = Metric(
    "plumb_task_completions",
    "counter",
    "Task executions that returned: the job is done.",
    ("task",),
)
TASK_FAILURES = Metric(
    "plumb_task_failures",
    "counter",
    "Task executions that failed for good (no retry left).",
    ("task",),
)
TASK_DEAD_LETTERS = Metric(
    "plumb_task_dead_letters",
    "counter",
    "Jobs set aside as dead letters for an operator.",
    ("task",),
)
DOWNSTREAM_REQUESTS = Metric(
    "plumb_downstream_requests",
    "counter",
    "HTTP requests sent to downstreams, by admission key class, status class and outcome.",
    ("key_class", "status_class", "outcome"),
)
ADMISSION_DECISIONS_METRIC = Metric(
    "plumb_admission_decisions",
    "counter",
    "Submissions admitted or refused; in_backoff=true when audits were waiting to retry.",
    ("decision", "in_backoff"),
)
JOBS_REPUBLISHED = Metric(
    "plumb_jobs_republished",
    "counter",
    "Jobs the reconciler published again, by owed-work source (jobs.reconcile): owed since "
    "Redis lost data, or still owed RECONCILE_AFTER_SECONDS past due.",
    ("source",),
)
BREAKER_TRANSITIONS = Metric(
    "plumb_breaker_transitions",
    "counter",
    "Circuit breaker state changes, by new state.",
    ("key_class", "to_state"),
)

# --- Gauges (computed when scraped: observability.gauges) ---------------------
QUEUE_BACKLOG = Metric(
    "plumb_queue_backlog", "gauge", "Audits admitted but not running: waiting plus retrying."
)
QUEUE_WAITING = Metric(
    "plumb_queue_waiting", "gauge", "Audit messages in the broker queue, due and not yet taken."
)
QUEUE_RETRYING = Metric(
    "plumb_queue_retrying",
    "gauge",
    "Audits owed a worker slot, not yet due: retry backoff, breaker parks, rate-limit waits.",
)
QUEUE_RUNNING = Metric("plumb_queue_running", "gauge", "Audits a worker is running now.")
QUEUE_DEFERRED_BEYOND_HORIZON = Metric(
    "plumb_queue_deferred_beyond_horizon",
    "gauge",
    "Audit waits stored past the longest wait Plumb keeps (RATELIMIT_MAX_WAIT_SECONDS): "
    "counted against no cap, ended rate limited by the waker.",
)
QUEUE_SCHEDULED = Metric(
    "plumb_queue_scheduled", "gauge", "Re-audits scheduled for later, not yet due."
)
BREAKERS = Metric("plumb_breakers", "gauge", "Circuit breakers in each state.", ("state",))
PAGES_CHANGED = Metric(
    "plumb_pages_changed", "gauge", "Pages an audit found changed in the last 24 hours."
)
PAGES_WORSE = Metric(
    "plumb_pages_worse",
    "gauge",
    "Pages that got worse in the last 24 hours: a 2xx became an error, noindex appeared, "
    "a security header disappeared, or a link broke.",
)
QUEUE_MAX_DEPTH = Metric(
    "plumb_queue_max_depth",
    "gauge",
    "AUDIT_QUEUE_MAX_DEPTH: the backlog at which submissions are refused.",
)
DELAYED_OVERDUE = Metric(
    "plumb_delayed_overdue_seconds",
    "gauge",
    "Age of the oldest delayed-store entry that is due and not yet published, by queue "
    "(0 when none): it grows when nothing wakes the queue's store.",
    ("queue",),
)
REAUDIT_FANOUT_TIMESTAMP = Metric(
    "plumb_reaudit_fanout_timestamp_seconds",
    "gauge",
    "When the latest nightly re-audit fan-out ran (Unix time).",
)
REAUDIT_PLACEMENTS = Metric(
    "plumb_reaudit_placements", "gauge", "Pages placed in the latest re-audit night."
)
REAUDIT_PLACEMENTS_DUE = Metric(
    "plumb_reaudit_placements_due",
    "gauge",
    "Placements of the latest night whose slice's planned window has ended.",
)
REAUDIT_PLACEMENTS_FIRED = Metric(
    "plumb_reaudit_placements_fired",
    "gauge",
    "Placements of the latest night that have fired (created their audit).",
)
# --- Histograms -----------------------------------------------------------------
AUDIT_DURATION = Metric(
    "plumb_audit_duration_seconds",
    "histogram",
    "Time a worker spent on one audit attempt.",
    ("outcome",),
    (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
DOWNSTREAM_LATENCY = Metric(
    "plumb_downstream_request_duration_seconds",
    "histogram",
    "Time from sending a downstream request to its last byte (or its failure).",
    ("key_class",),
    (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
QUEUE_WAIT = Metric(
    "plumb_queue_wait_seconds",
    "histogram",
    "Time a task message waited between becoming due (published, or its retry ETA) and starting.",
    ("task",),
    (0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 1800),
)

COUNTERS = (
    TASK_ATTEMPTS,
    TASK_FIRST_ATTEMPTS,
    TASK_RETRIES,
    TASK_COMPLETIONS,
    TASK_FAILURES,
    TASK_DEAD_LETTERS,
    DOWNSTREAM_REQUESTS,
    ADMISSION_DECISIONS_METRIC,
    BREAKER_TRANSITIONS,
    JOBS_REPUBLISHED,
)
GAUGES = (
    QUEUE_BACKLOG,
    QUEUE_WAITING,
    QUEUE_RETRYING,
    QUEUE_RUNNING,
    QUEUE_DEFERRED_BEYOND_HORIZON,
    QUEUE_SCHEDULED,
    BREAKERS,
    QUEUE_MAX_DEPTH,
    DELAYED_OVERDUE,
    REAUDIT_FANOUT_TIMESTAMP,
    REAUDIT_PLACEMENTS,
    REAUDIT_PLACEMENTS_DUE,
    REAUDIT_PLACEMENTS_FIRED,
)
HISTOGRAMS = (AUDIT_DURATION, DOWNSTREAM_LATENCY, QUEUE_WAIT)

# Label values known in advance: these series are exposed at 0 before their first event,
# so a rate() over them starts from the first scrape.
KNOWN_LABEL_VALUES = {
    ADMISSION_DECISIONS_METRIC.name: [(d, b) for d in ADMISSION_DECISIONS for b in BOOLEAN],
}


# --- Dashboard fields in each minute's hash -------------------------------------
class Field:
    ATTEMPTS = "attempts"
    FIRST_ATTEMPTS = "first_attempts"
    COMPLETIONS = "completions"
    FAILURES = "failures"
    DEAD_LETTERS = "dead_letters"
    DOWNSTREAM_REQUESTS = "downstream_requests"

    @staticmethod
    def retries(reason: str) -> str:
        return f"retries:{reason}"

    @staticmethod
    def admissions(decision: str) -> str:
        return f"admissions:{decision}"

    @staticmethod
    def admissions_in_backoff(decision: str) -> str:
        return f"admissions_in_backoff:{decision}"

    @staticmethod
    def breaker_transitions(to_state: str) -> str:
        return f"breaker_transitions:{to_state}"

    @staticmethod
    def sample(name: str) -> str:
        return f"sample:{name}"


def counter_key(metric: Metric) -> str:
    return f"metrics:counter:{metric.name}"


def exported_key(metric: Metric) -> str:
    """The highest total of each of a counter's series that /metrics has exported
    (observability.collector)."""
    return f"metrics:exported:{metric.name}"


def histogram_key(metric: Metric) -> str:
    return f"metrics:histogram:{metric.name}"


def minute_key(minute: int) -> str:
    return f"metrics:minute:{minute}"


def jobs_key(minute: int) -> str:
    return f"metrics:jobs:{minute}"


def minute_of(now: float | None = None) -> int:
    return int((time.time() if now is None else now) // 60)


def bucket_label(bound: float) -> str:
    """A histogram bucket's `le` as Prometheus writes it (1 -> "1.0")."""
    return floatToGoString(bound)


def status_class(status_code: int | None) -> str:
    if status_code is None or not 100 <= status_code <= 599:
        return "none"
    return f"{status_code // 100}xx"


def _check(name: str, value: str, allowed: Iterable[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {sorted(allowed)}, got {value!r}")
    return value


# The writes of one event in one command: KEYS are the keys written, ARGV a flat list of
# writes, each an operation's letter, its key's index in KEYS, then its arguments. Packing
# one command instead of one per write is most of what recording costs the process
# (redis-py packs and parses each command of a pipeline in Python): a downstream request
# was six commands, an attempt's start eight (DECISIONS.md, "The audit's own plumbing").
# `metric_writes(first_key, first_arg)` applies the writes from ARGV[first_arg] on, their
# keys' indexes counted after KEYS[first_key]: so another script can apply an event's
# writes in its own step, after its own keys and arguments (`Writes`; an attempt's start,
# jobs.task). It returns nothing, or the error of a write it does not know.
METRIC_WRITES_LUA = """
local function metric_writes(first_key, first_arg)
  local i = first_arg
  while i <= #ARGV do
    local op, key = ARGV[i], KEYS[first_key + tonumber(ARGV[i + 1])]
    if op == 'i' then
      redis.call('HINCRBY', key, ARGV[i + 2], ARGV[i + 3]); i = i + 4
    elseif op == 'f' then
      redis.call('HINCRBYFLOAT', key, ARGV[i + 2], ARGV[i + 3]); i = i + 4
    elseif op == 'h' then
      redis.call('HSET', key, ARGV[i + 2], ARGV[i + 3]); i = i + 4
    elseif op == 'p' then
      redis.call('PFADD', key, ARGV[i + 2]); i = i + 3
    elseif op == 'x' then
      redis.call('EXPIREAT', key, ARGV[i + 2]); i = i + 3
    else
      return redis.error_reply('unknown metric write ' .. tostring(op))
    end
  end
end
"""


@dataclass(frozen=True)
class Writes:
    """One event's writes, for a script that applies them with METRIC_WRITES_LUA: its own
    keys first, then these (`metric_writes(<its key count>, <its argument count> + 1)`)."""

    keys: list[str]
    args: list


class _Recorder:
    """Collects the writes of one event; `flush` queues them as one command into `pipe`."""

    def __init__(self, pipe, minute: int):
        self.pipe = pipe
        self.minute = minute
        self.keys: dict[str, int] = {}
        self.args: list = []
        self.expiring: set[str] = set()

    def _key(self, key: str) -> int:
        index = self.keys.get(key)
        if index is None:
            index = self.keys[key] = len(self.keys) + 1
        return index

    def _write(self, op: str, key: str, *args) -> None:
        self.args += [op, self._key(key), *args]

    def _expire(self, key: str) -> None:
        if key not in self.expiring:
            self.expiring.add(key)
            self._write("x", key, _expiry(self.minute))

    def count(self, metric: Metric, *labels: str, amount: int = 1) -> None:
        self._write("i", counter_key(metric), _labels(labels), amount)

    def observe(self, metric: Metric, *labels: str, value: float) -> None:
        index = bisect.bisect_left(metric.buckets, value)
        bucket = bucket_label(metric.buckets[index]) if index < len(metric.buckets) else "+Inf"
        key = histogram_key(metric)
        self._write("i", key, _labels((*labels, bucket)), 1)
        self._write("i", key, _labels((*labels, "count")), 1)
        self._write("f", key, _labels((*labels, "sum")), repr(float(value)))

    def bump(self, field: str, amount: int = 1) -> None:
        key = minute_key(self.minute)
        self._write("i", key, field, amount)
        self._expire(key)

    def sample(self, values: dict[str, int | float]) -> None:
        key = minute_key(self.minute)
        for name, value in values.items():
            self._write("h", key, Field.sample(name), value)
        self._expire(key)

    def add_job(self, job_id: str) -> None:
        key = jobs_key(self.minute)
        self._write("p", key, job_id)
        self._expire(key)

    def flush(self) -> None:
        if self.args:
            queue_script(self.pipe, WRITE, keys=list(self.keys), args=self.args)

    def writes(self) -> Writes:
        return Writes(keys=list(self.keys), args=self.args)


WRITE = lua(
    METRIC_WRITES_LUA
    + """
local failed = metric_writes(0, 1)
if failed then return failed end
return 0
"""
)


@functools.lru_cache(maxsize=1024)
def _labels(labels: tuple[str, ...]) -> str:
    """A hash field of label values (closed sets: few distinct ones), as JSON."""
    return json.dumps(list(labels))


def _expiry(minute: int) -> int:
    return (minute + 1) * 60 + settings.METRICS_RETENTION_HOURS * 3600


def _record(
    event: str, write: Callable[[_Recorder], None], now: float | None, pipe: Pipeline | None = None
) -> None:
    if pipe is not None:
        # The caller's pipeline: it sends this with its own writes, in one round trip.
        recorder = _Recorder(pipe, minute_of(now))
        write(recorder)
        recorder.flush()
        return
    try:
        pipe = redis_client().pipeline(transaction=False)
        recorder = _Recorder(pipe, minute_of(now))
        write(recorder)
        recorder.flush()
        pipe.execute()
    except redis.RedisError as exc:
        # Losing a data point must never fail the work it describes.
        log.warning("metrics.unrecorded", extra={"metric_event": event, "error": repr(exc)})


# --- Recording functions ----------------------------------------------------------
def record_task_attempt(
    task: str,
    *,
    first: bool,
    job_id: str,
    queue_wait: float | None = None,
    now: float | None = None,
) -> None:
    """A worker started running `task` for job `job_id` (the task id, kept across retries).
    A worker's own attempts are written in their start's round trip (`task_attempt_writes`)."""
    _record("task_attempt", _task_attempt(task, first, job_id, queue_wait), now)


def task_attempt_writes(
    task: str, *, first: bool, job_id: str, queue_wait: float | None = None
) -> Writes:
    """`record_task_attempt`'s writes, for a script to apply in its own step."""
    recorder = _Recorder(None, minute_of(None))
    _task_attempt(task, first, job_id, queue_wait)(recorder)
    return recorder.writes()


def _task_attempt(
    task: str, first: bool, job_id: str, queue_wait: float | None
) -> Callable[[_Recorder], None]:
    def write(r: _Recorder) -> None:
        r.count(TASK_ATTEMPTS, task)
        r.bump(Field.ATTEMPTS)
        if first:
            r.count(TASK_FIRST_ATTEMPTS, task)
            r.bump(Field.FIRST_ATTEMPTS)
        r.add_job(job_id)
        if queue_wait is not None:
            r.observe(QUEUE_WAIT, task, value=max(0.0, queue_wait))

    return write


def record_retry(task: str, reason: str, *, now: float | None = None) -> None:
    """A retry of `task` was scheduled: `reason` is error, rate_limited, breaker_parked or
    outage."""
    _check("reason", reason, RETRY_REASONS)

    def write(r: _Recorder) -> None:
        r.count(TASK_RETRIES, task, reason)
        r.bump(Field.retries(reason))

    _record("retry", write, now)


def record_completion(task: str, *, now: float | None = None, pipe: Pipeline | None = None) -> None:
    """A run of `task` succeeded. With `pipe` the writes join the caller's pipeline (an
    attempt's end)."""

    def write(r: _Recorder) -> None:
        r.count(TASK_COMPLETIONS, task)
        r.bump(Field.COMPLETIONS)

    _record("completion", write, now, pipe)


def record_failure(task: str, *, now: float | None = None) -> None:
    def write(r: _Recorder) -> None:
        r.count(TASK_FAILURES, task)
        r.bump(Field.FAILURES)

    _record("failure", write, now)


def record_dead_letter(task: str, *, now: float | None = None) -> None:
    """A job was set aside for an operator (ratelimit.deadletters logs `task.dead_lettered`)."""

    def write(r: _Recorder) -> None:
        r.count(TASK_DEAD_LETTERS, task)
        r.bump(Field.DEAD_LETTERS)

    _record("dead_letter", write, now)


def record_republished(source: str, count: int, *, now: float | None = None) -> None:
    """The reconciler published `count` jobs of one owed-work source again."""
    if count:
        _record("republished", lambda r: r.count(JOBS_REPUBLISHED, source, amount=count), now)


def record_audit_duration(seconds: float, *, outcome: str, now: float | None = None) -> None:
    _check("outcome", outcome, AUDIT_OUTCOMES)
    _record("audit_duration", lambda r: r.observe(AUDIT_DURATION, outcome, value=seconds), now)


def record_downstream_request(
    key_class: str,
    status_code: int | None,
    outcome: str,
    seconds: float,
    *,
    now: float | None = None,
    pipe: Pipeline | None = None,
) -> None:
    """One HTTP request sent to a downstream (every redirect hop is one); with `pipe`,
    its writes join the caller's pipeline (the outbound client's, with the host slot's
    release)."""
    _check("key_class", key_class, KEY_CLASSES)
    _check("outcome", outcome, DOWNSTREAM_OUTCOMES)

    def write(r: _Recorder) -> None:
        r.count(DOWNSTREAM_REQUESTS, key_class, status_class(status_code), outcome)
        r.observe(DOWNSTREAM_LATENCY, key_class, value=seconds)
        r.bump(Field.DOWNSTREAM_REQUESTS)

    _record("downstream_request", write, now, pipe)


def read_counter(metric: Metric, *, client: redis.Redis | None = None) -> dict[tuple, float]:
    """A counter's totals by label values: {("admitted", "false"): 12.0, ...}."""
    stored = (client or redis_client()).hgetall(counter_key(metric))
    return {tuple(json.loads(field)): float(value) for field, value in stored.items()}


def admission_metric_keys(now: float | None = None) -> tuple[str, str, int]:
    """Where an admission decision is counted: the Prometheus counter's hash, this
    minute's dashboard bucket and that bucket's expiry. For the admission script,
    which counts its decision in the same atomic step that makes it."""
    minute = minute_of(now)
    return counter_key(ADMISSION_DECISIONS_METRIC), minute_key(minute), _expiry(minute)


def record_breaker_transition(
    to_state: str, *, key_class: str = "host", now: float | None = None
) -> None:
    """A breaker changed state (ratelimit.breakers logs `breaker.<transition>` with its key)."""
    _check("to_state", to_state, BREAKER_STATES)
    _check("key_class", key_class, KEY_CLASSES)

    def write(r: _Recorder) -> None:
        r.count(BREAKER_TRANSITIONS, key_class, to_state)
        r.bump(Field.breaker_transitions(to_state))

    _record("breaker_transition", write, now)


def record_samples(values: dict[str, int | float], *, now: float | None = None) -> None:
    """Gauge readings for the dashboard's per-minute series (the last one in a minute wins)."""
    _record("samples", lambda r: r.sample(values), now)
