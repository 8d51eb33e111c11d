"""The re-audit's tasks, all on the `reaudit` queue; the work is in reaudit.services.

A night's chain publishes these tasks (a slice publishes the next slice and its
placements), so the services that publish are handed them as NIGHT_TASKS.
"""

from __future__ import annotations

from datetime import date, datetime

import kombu.exceptions
import redis.exceptions
from celery import shared_task
from django import db
from django.conf import settings

from jobs.policy import RetryPolicy
from jobs.task import PlumbTask
from reaudit import services

# Lost connections are worth another attempt; anything else is a bug to see.
TRANSIENT_ERRORS = (
    db.OperationalError,
    db.InterfaceError,
    kombu.exceptions.OperationalError,
    redis.exceptions.ConnectionError,
)


class ReauditTask(PlumbTask):
    # Placing tonight's work is housekeeping: the audit it creates is the job.
    policy = RetryPolicy(retry_on=TRANSIENT_ERRORS, counts_as_job=False)


@shared_task(
    base=ReauditTask,
    name="reaudit.fan_out",
    queue=settings.REAUDIT_QUEUE,
)
def fan_out(day: str | None = None, window_seconds: int | None = None) -> None:
    services.fan_out(
        date.fromisoformat(day) if day else None,
        window_seconds=window_seconds,
        night_tasks=NIGHT_TASKS,
    )


@shared_task(
    base=ReauditTask,
    name="reaudit.publish_slice",
    queue=settings.REAUDIT_QUEUE,
)
def publish_slice(day: str, index: int, planned_at: str) -> None:
    services.publish_slice(
        date.fromisoformat(day),
        index,
        datetime.fromisoformat(planned_at),
        night_tasks=NIGHT_TASKS,
    )


@shared_task(
    base=ReauditTask,
    name="reaudit.place",
    queue=settings.REAUDIT_QUEUE,
)
def place(page_id: int, day: str) -> None:
    services.fire_placement(page_id, date.fromisoformat(day))


NIGHT_TASKS = services.NightTasks(publish_slice=publish_slice, place=place)
