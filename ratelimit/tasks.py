from __future__ import annotations

from celery import shared_task
from django.conf import settings

from ratelimit import deferred as parking


@shared_task(name="ratelimit.wake_parked", queue=settings.AUDIT_QUEUE)
def wake_parked() -> None:
    """Publish parked (deferred) tasks as they fall due; beat runs this every few seconds."""
    parking.wake_due()
