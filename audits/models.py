from __future__ import annotations

import uuid

from django.db import models


class Page(models.Model):
    """A URL Plumb knows about, stored normalized so each page is one row."""

    url = models.CharField(max_length=2048, unique=True)
    domain = models.CharField(max_length=255, db_index=True)
    reaudit_nightly = models.BooleanField(
        default=True, help_text="Audited again every night by the re-audit fan-out."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["url"]
        indexes = [models.Index(fields=["reaudit_nightly", "id"], name="page_reaudit_idx")]

    def __str__(self) -> str:
        return self.url


class Audit(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        RETRYING = "retrying"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    class Trigger(models.TextChoices):
        SUBMITTED = "submitted"
        REAUDIT = "reaudit"

    FINISHED = (Status.SUCCEEDED, Status.FAILED)

    # Unguessable, so holding an audit's id is what lets a client read it.
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    page = models.ForeignKey(Page, on_delete=models.CASCADE, related_name="audits")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    trigger = models.CharField(max_length=16, choices=Trigger.choices, default=Trigger.SUBMITTED)
    attempts = models.PositiveIntegerField(default=0)
    task_id = models.CharField(max_length=255, blank=True)
    # NULL, not "", when absent: the unique constraint must allow many audits without a key.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    # Where the finished audit is POSTed (webhooks app), signed with the secret.
    # The secret is write-only: never in API responses, admin pages or logs.
    callback_url = models.CharField(max_length=2048, blank=True)
    callback_secret = models.CharField(max_length=128, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["idempotency_key"], name="audit_idempotency_key_unique"
            ),
        ]
        indexes = [
            models.Index(fields=["status", "-created_at"], name="audit_status_created_idx"),
            models.Index(fields=["trigger", "-created_at"], name="audit_trigger_created_idx"),
            models.Index(fields=["page", "-created_at"], name="audit_page_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.page.url} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED
