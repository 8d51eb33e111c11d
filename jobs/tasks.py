"""The job runtime's own task: the daily prune of what has aged out (jobs.retention)."""

from __future__ import annotations

import logging
import time

from celery import shared_task
from django.conf import settings

from jobs import retention
from jobs.deadlines import Deadline
from jobs.policy import RetryPolicy
from jobs.task import PlumbTask

log = logging.getLogger(__name__)


class RetentionTask(PlumbTask):
    # Housekeeping, not the product's work: not counted as jobs.
    policy = RetryPolicy(counts_as_job=False)


@shared_task(
    base=RetentionTask,
    name="jobs.prune",
    queue=settings.RETENTION_QUEUE,
    # A run stops itself at RETENTION_RUN_SECONDS (60 s); the limits (80 / 110 s) only catch
    # a stuck batch, and stay within the workers' 120 s stop grace.
    deadline=Deadline(work=settings.RETENTION_RUN_SECONDS - 10),
)
def prune() -> None:
    """Prune every kind for up to RETENTION_RUN_SECONDS; publish the rest as a new run."""
    deadline = time.monotonic() + settings.RETENTION_RUN_SECONDS
    results = retention.prune_all(deadline=deadline)
    if not all(result.finished for result in results):
        log.info(
            "retention.continued",
            extra={"unfinished": [result.kind for result in results if not result.finished]},
        )
        prune.apply_async(queue=settings.RETENTION_QUEUE)
