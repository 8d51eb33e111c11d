"""Shared pieces of the webhook tests: finished audits with a callback, a webhooks worker."""

from __future__ import annotations

import base64

from django.utils import timezone

from audits.models import Audit, Page
from tests.workers import module_worker
from webhooks import tasks
from webhooks.models import Delivery

SECRET = "whsec_" + base64.b64encode(b"plumb-test-secret-0123456789ab").decode()

# Fast retries so a test sees several attempts in seconds.
FAST_RETRIES = {"WEBHOOK_BACKOFF_BASE_SECONDS": "0.1", "WEBHOOK_BACKOFF_MAX_SECONDS": "0.5"}


def finished_audit_with_callback(url: str, *, number: int = 0) -> Audit:
    page, _ = Page.objects.get_or_create(
        url=f"https://example.org/page-{number}", defaults={"domain": "example.org"}
    )
    return Audit.objects.create(
        page=page,
        status=Audit.Status.SUCCEEDED,
        finished_at=timezone.now(),
        result={"status_code": 200},
        callback_url=url,
        callback_secret=SECRET,
    )


def schedule(url: str, *, number: int = 0) -> Delivery:
    """A finished audit's delivery, created and enqueued (outside a transaction: at once)."""
    return tasks.schedule_delivery(audit_id=finished_audit_with_callback(url, number=number).id)


# A webhooks worker as deployed: thread pool, concurrency from its own settings.
WEBHOOKS_WORKER = {"concurrency": None, "pool": "threads"}


def start_webhooks_worker(start_worker, **env):
    """A webhooks worker of the test's own."""
    return start_worker("webhooks", **WEBHOOKS_WORKER, env={k: str(v) for k, v in env.items()})


def module_webhooks_worker(**env):
    """A webhooks worker shared by the module's tests that ask for it (module_worker)."""
    return module_worker("webhooks", **WEBHOOKS_WORKER, env={k: str(v) for k, v in env.items()})


def delivery(row: Delivery) -> Delivery:
    return Delivery.objects.get(id=row.id)
