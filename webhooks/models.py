from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from audits.secrets import without_password
from jobs.deadlines import Deadline
from jobs.lifecycle import Job
from jobs.models import JobRow


class Delivery(JobRow):
    """One event about an audit POSTed to a callback URL, over as many attempts as it takes.

    `audit.finished` goes to the submission's own callback URL; `audit.changed` to the
    page callback, when the audit found changes. At most one of each per audit.
    """

    class Event(models.TextChoices):
        FINISHED = "audit.finished"
        CHANGED = "audit.changed"

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERING = "delivering"
        RETRYING = "retrying"
        DELIVERED = "delivered"
        FAILED = "failed"

    FINISHED = (Status.DELIVERED, Status.FAILED)

    # Also the Standard Webhooks `webhook-id`: the same on every attempt, so a
    # receiver can drop a repeat.
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Not indexed alone: the unique (audit, event) leads with it (DECISIONS.md, "No index
    # another one already covers").
    audit = models.ForeignKey(
        "audits.Audit", on_delete=models.CASCADE, related_name="deliveries", db_index=False
    )
    event = models.CharField(max_length=32, choices=Event.choices, default=Event.FINISHED)
    url = models.CharField(max_length=2048)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "deliveries"
        constraints = [
            models.UniqueConstraint(fields=["audit", "event"], name="delivery_audit_event_unique")
        ]
        indexes = [
            models.Index(fields=["status", "-created_at"], name="delivery_status_idx"),
            # The reconciler's look at what is owed (jobs.lifecycle).
            models.Index(
                fields=["published_at"],
                condition=models.Q(status__in=["pending", "delivering", "retrying"]),
                name="delivery_owed_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{without_password(self.url)} ({self.status})"

    @property
    def webhook_id(self) -> str:
        return f"msg_{self.id.hex}"


# A delivery as a job (jobs.lifecycle): one POST, bounded by its whole deadline
# (WEBHOOK_TIMEOUT_SECONDS, outbound.bounded).
DELIVERY_JOB = Job(
    name="webhook_deliveries",
    model=Delivery,
    task="webhooks.deliver",
    queue=settings.WEBHOOK_QUEUE,
    deadline=Deadline(work=settings.WEBHOOK_TIMEOUT_SECONDS),
    queued=Delivery.Status.PENDING,
    running=Delivery.Status.DELIVERING,
    waiting=Delivery.Status.RETRYING,
    done=Delivery.FINISHED,
)
