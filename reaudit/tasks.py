"""The re-audit's tasks, all on the `reaudit` queue; the work is in reaudit.services.

A night's chain publishes these tasks (a slice publishes the next slice and its
placements), so the services that publish are handed them as NIGHT_TASKS.
"""

from __future__ import annotations

from datetime import date, datetime

from celery import shared_task
from django.conf import settings

from jobs.deadlines import Deadline
from jobs.policy import RetryPolicy
from jobs.task import PlumbTask
from reaudit import services

# A fan-out of 100,000 pages is one transaction of 8 to 10 s, a slice publishes its
# placements, a placement creates one audit: the limits leave ten times that for a slow
# database, stay far inside REAUDIT_VISIBILITY_TIMEOUT_SECONDS (1,800 s; a reaudit worker
# also holds a slice's messages for up to REAUDIT_SLICE_SECONDS before running them) and
# inside the workers' stop grace in docker-compose.yml (120 s).
# (jobs.deadlines: soft = work + 30 s, hard = soft + 30 s.)
NIGHT_DEADLINE = Deadline(work=50)
PLACEMENT_DEADLINE = Deadline(work=30)


class ReauditTask(PlumbTask):
    # Placing tonight's work is housekeeping: the audit it creates is the job.
    policy = RetryPolicy(counts_as_job=False)


@shared_task(
    base=ReauditTask,
    name="reaudit.fan_out",
    queue=settings.REAUDIT_QUEUE,
    deadline=NIGHT_DEADLINE,
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
    deadline=NIGHT_DEADLINE,
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
    deadline=PLACEMENT_DEADLINE,
)
def place(page_id: int, day: str) -> None:
    services.fire_placement(page_id, date.fromisoformat(day))


NIGHT_TASKS = services.NightTasks(publish_slice=publish_slice, place=place)
