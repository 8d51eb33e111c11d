"""Counting every task's attempts, retries and outcomes from Celery's signals.

Signals rather than hooks in a task base class: they see every task, whatever its
base, and they fire in the process that runs the task (a prefork pool child), so
nothing here depends on how a task decides to retry. They also write the
`task.started` / `task.finished` log lines.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from celery import signals

from observability import metrics

log = logging.getLogger(__name__)

# Stamped on every task message when it is published (a retry is a new publish),
# so a worker can tell how long the message waited once it was due.
PUBLISHED_AT_HEADER = "plumb_published_at"

# task id -> monotonic start, for the tasks this process is running.
_started: dict[str, float] = {}

_AUDIT_OUTCOMES = {"SUCCESS": "succeeded", "RETRY": "retried", "FAILURE": "failed"}


def retry_reason(exc: BaseException | None) -> str:
    """Why a retry was scheduled. An exception may say so itself (`retry_reason`);
    a downstream answering 429 is rate limiting us; anything else is an error."""
    reason = getattr(exc, "retry_reason", None)
    if reason in metrics.RETRY_REASONS:
        return reason
    if getattr(exc, "status_code", None) == 429:
        return "rate_limited"
    return "error"


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


@signals.before_task_publish.connect
def stamp_published_at(headers=None, **kwargs):
    if headers is not None:
        headers[PUBLISHED_AT_HEADER] = time.time()


@signals.task_prerun.connect
def count_attempt(task_id=None, task=None, **kwargs):
    now = time.time()
    _started[task_id] = time.monotonic()
    request = task.request
    first = not request.retries
    waited = queue_wait(request, now)
    log.info(
        "task.started",
        extra={
            "task": task.name,
            "task_id": task_id,
            "attempt": request.retries + 1,
            "queue_wait_seconds": None if waited is None else round(waited, 3),
        },
    )
    metrics.record_task_attempt(task.name, first=first, job_id=task_id, queue_wait=waited)


@signals.task_retry.connect
def count_retry(sender=None, reason=None, **kwargs):
    metrics.record_retry(sender.name, retry_reason(reason))


@signals.task_failure.connect
def count_failure(sender=None, **kwargs):
    metrics.record_failure(sender.name)


@signals.task_postrun.connect
def count_outcome(task_id=None, task=None, state=None, **kwargs):
    started = _started.pop(task_id, None)
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
    if state == "SUCCESS":
        metrics.record_completion(task.name)
    if task.name == metrics.AUDIT_TASK and seconds is not None and state in _AUDIT_OUTCOMES:
        metrics.record_audit_duration(seconds, outcome=_AUDIT_OUTCOMES[state])
