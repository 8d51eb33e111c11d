"""Dead letters: tasks that will not run again on their own, kept for an operator to replay."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from celery import current_app
from celery.utils import uuid
from django.db import transaction
from django.utils import timezone
from kombu.utils.json import dumps, loads

from jobs.errors import CannotReplay, MalformedTaskMessage
from jobs.models import DeadLetter
from jobs.retention import PrunableKind
from observability import metrics

log = logging.getLogger(__name__)

# Enough of an undecodable message to see what it was.
RAW_MESSAGE_LIMIT = 64 * 1024


def record_task_failure(
    *,
    task,
    task_id: str,
    args,
    kwargs,
    exc: BaseException,
    traceback: str,
    attempts: int,
    first_failed_at: float | None,
    exhausted: bool,
    queue: str,
):
    """Dead-letter a task that failed for the last time (called from its on_failure)."""
    if isinstance(exc, MalformedTaskMessage):
        reason = DeadLetter.Reason.MALFORMED
    elif exhausted:
        reason = DeadLetter.Reason.ATTEMPTS_EXHAUSTED
    else:
        reason = DeadLetter.Reason.FAILED
    now = timezone.now()
    return _create(
        task_name=task.name,
        task_id=task_id or "",
        queue=queue,
        args=_jsonable(list(args or [])),
        kwargs=_jsonable(dict(kwargs or {})),
        reason=reason,
        exception=f"{exc.__class__.__name__}: {exc}",
        traceback=traceback,
        attempts=attempts,
        first_failed_at=datetime.fromtimestamp(first_failed_at, tz=UTC) if first_failed_at else now,
        last_failed_at=now,
    )


def record_rejected_message(
    *, task_name: str, task_id: str, queue: str, args, kwargs, raw_message: str, problem: str
):
    """Dead-letter a message the worker could not run at all (jobs.consumer, jobs.transport)."""
    now = timezone.now()
    return _create(
        task_name=task_name,
        task_id=task_id,
        queue=queue,
        args=_jsonable(args),
        kwargs=_jsonable(kwargs),
        raw_message=raw_message[:RAW_MESSAGE_LIMIT],
        reason=DeadLetter.Reason.MALFORMED,
        exception=problem,
        attempts=0,
        first_failed_at=now,
        last_failed_at=now,
    )


def _create(**fields):
    dead_letter = DeadLetter.objects.create(**fields)
    metrics.record_dead_letter(fields["task_name"] or "unknown")
    log.warning(
        "task.dead_lettered",
        extra={
            "dead_letter_id": dead_letter.id,
            "task": dead_letter.task_name,
            "task_id": dead_letter.task_id,
            "reason": dead_letter.reason,
            "attempts": dead_letter.attempts,
            "error": dead_letter.exception,
        },
    )
    return dead_letter


def _jsonable(value):
    """Arguments as JSON can store them; None stays None (an undecodable body)."""
    if value is None:
        return None
    return loads(dumps(value))


@dataclass
class ReplayReport:
    replayed: list = field(default_factory=list)
    skipped: list[tuple] = field(default_factory=list)  # (dead letter, why)


def replay(dead_letters: Iterable, *, by: str, include_replayed: bool = False) -> ReplayReport:
    """Enqueue each dead letter's task again and record who did it and when.

    A dead letter is replayed once unless `include_replayed`: a bulk replay
    that catches rows replayed before must not run their tasks twice. The
    replay is claimed with a conditional update in the same transaction as
    the task's own bookkeeping; the message goes out on commit.
    """
    report = ReplayReport()
    for dead_letter in dead_letters:
        task = current_app.tasks.get(dead_letter.task_name)
        if task is None:
            report.skipped.append((dead_letter, f"no task named {dead_letter.task_name!r}"))
            continue
        if dead_letter.args is None or dead_letter.kwargs is None:
            report.skipped.append((dead_letter, "its message could not be decoded"))
            continue
        try:
            with transaction.atomic():
                rows = DeadLetter.objects.filter(id=dead_letter.id)
                if not include_replayed:
                    rows = rows.filter(replayed_at__isnull=True)
                if not rows.update(replayed_at=timezone.now(), replayed_by=by):
                    raise CannotReplay("already replayed")
                replay_task = getattr(task, "replay_dead_letter", None)
                if replay_task is not None:
                    new_task_id = replay_task(list(dead_letter.args), dict(dead_letter.kwargs))
                else:
                    new_task_id = send_on_commit(task, dead_letter.args, dead_letter.kwargs)
                DeadLetter.objects.filter(id=dead_letter.id).update(replay_task_id=new_task_id)
        except CannotReplay as exc:
            report.skipped.append((dead_letter, str(exc)))
            continue
        dead_letter.refresh_from_db()
        log.info(
            "task.replayed",
            extra={
                "dead_letter_id": dead_letter.id,
                "task": dead_letter.task_name,
                "task_id": new_task_id,
                "by": by,
            },
        )
        report.replayed.append(dead_letter)
    return report


def send_on_commit(task, args, kwargs) -> str:
    """Publish the task once the surrounding transaction commits; return its new id."""
    task_id = uuid()
    transaction.on_commit(lambda: task.apply_async(args=args, kwargs=kwargs, task_id=task_id))
    return task_id


def replayed_before(cutoff: datetime):
    """Dead letters replayed before `cutoff`: their task ran again and has its own record
    (a new dead letter if it failed again). One never replayed stays: it is still owed."""
    return DeadLetter.objects.filter(replayed_at__lt=cutoff)


RETENTION = PrunableKind(
    name="dead_letters",
    horizon_setting="DEAD_LETTER_RETENTION_DAYS",
    old_enough=replayed_before,
    walk=("replayed_at", "id"),
    description="dead letters replayed that long ago",
)
