"""What every job reports: its log lines and its metrics.

`PlumbTask` calls these at the moments that matter to the product: an attempt
starts once its breaker lets it through (a parked run is no attempt), it retries,
waits or completes. Only jobs whose policy `counts_as_job` (audits, link checks,
webhook deliveries) are counted, so the unique jobs and the downstream requests per
unique job describe the product's work, never housekeeping. The signal handlers
below log every task, housekeeping included, and stamp each message with the time
it was published.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import datetime

from celery import signals
from redis.client import Pipeline

from jobs.headers import DEFERRALS_HEADER, PUBLISHED_AT_HEADER, header
from observability import metrics

log = logging.getLogger(__name__)

# task id -> (monotonic start, seconds its message waited once due), for the tasks this
# process (or thread) is running.
_started: dict[str, tuple[float, float | None]] = {}

_AUDIT_OUTCOMES = {"SUCCESS": "succeeded", "RETRY": "retried", "FAILURE": "failed"}


def queue_wait(request, started: float) -> float | None:
    """Seconds between the message becoming due (published, or its ETA) and `started`."""
    headers = request.headers or {}
    published = headers.get(PUBLISHED_AT_HEADER, getattr(request, PUBLISHED_AT_HEADER, None))
    if published is None:
        return None
    due = float(published)
    if request.eta:
        eta = (
            request.eta
            if isinstance(request.eta, datetime)
            else datetime.fromisoformat(request.eta)
        )
        due = max(due, eta.timestamp())
    return max(0.0, started - due)


def attempt_started_writes(task) -> metrics.Writes | None:
    """The metrics of a job's attempt that passed its breaker and is about to run, for its
    start's script to write (jobs.task); None for a task that is not counted as a job."""
    if not task.policy.counts_as_job:
        return None
    request = task.request
    _, waited = _started.get(request.id, (None, None))
    # A job's first attempt is its first run past the breaker: no retry, no deferral
    # before it. So first attempts count unique jobs, and every other run is waste.
    first = not request.retries and not header(request, DEFERRALS_HEADER)
    return metrics.task_attempt_writes(task.name, first=first, job_id=request.id, queue_wait=waited)


def waited(task, reason: str) -> None:
    """A job was sent back to wait: `reason` is error, rate_limited or breaker_parked."""
    if task.policy.counts_as_job:
        metrics.record_retry(task.name, reason)


def completed(task, *, pipe: Pipeline | None = None) -> None:
    if task.policy.counts_as_job:
        metrics.record_completion(task.name, pipe=pipe)


def failed(task) -> None:
    if task.policy.counts_as_job:
        metrics.record_failure(task.name)


@signals.before_task_publish.connect
def stamp_published_at(headers=None, **kwargs):
    if headers is not None:
        headers[PUBLISHED_AT_HEADER] = time.time()


@signals.task_prerun.connect
def log_start(task_id=None, task=None, **kwargs):
    waited = queue_wait(task.request, time.time())
    _started[task_id] = (time.monotonic(), waited)
    log.info(
        "task.started",
        extra={
            "task": task.name,
            "task_id": task_id,
            "attempt": task.request.retries + 1,
            # Which pool process (or the threads' process) runs it.
            "pid": os.getpid(),
            "queue_wait_seconds": None if waited is None else round(waited, 3),
        },
    )


@signals.task_postrun.connect
def log_finish(task_id=None, task=None, state=None, **kwargs):
    started, _ = _started.pop(task_id, (None, None))
    seconds = None if started is None else time.monotonic() - started
    log.info(
        "task.finished",
        extra={
            "task": task.name,
            "task_id": task_id,
            "state": state,
            "seconds": None if seconds is None else round(seconds, 3),
        },
    )
    if task.name == metrics.AUDIT_TASK and seconds is not None and state in _AUDIT_OUTCOMES:
        metrics.record_audit_duration(seconds, outcome=_AUDIT_OUTCOMES[state])
