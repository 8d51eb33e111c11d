"""The job runtime's records: each job's row (declared by the apps), dead letters, and
the last known state of each breaker."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class JobRow(models.Model):
    """A job's record in PostgreSQL: what the runtime knows of one job, whatever its kind.

    Audits, shared link checks and webhook deliveries each inherit it and declare their
    states once (a jobs.lifecycle.Job); claim, wait, finish, fail and what is owed are
    derived from that declaration. Redis carries the job's message; this row is what
    the reconciler rebuilds it from.
    """

    # The task id its current message carries (a replay gives it a new one).
    task_id = models.CharField(max_length=255, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    # When its latest attempt began (claim): older than its deadline's `dead_after`,
    # no attempt is alive.
    attempt_started_at = models.DateTimeField(null=True, blank=True)
    # While it waits: when the wait (held in Redis) is due.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # When its current message was published: created, claimed, replayed, or published
    # again by the reconciler (never again within RECONCILE_AFTER_SECONDS of this).
    published_at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True


class DeadLetter(models.Model):
    """A task that will not run again on its own: out of attempts, failed for good, or malformed."""

    class Reason(models.TextChoices):
        ATTEMPTS_EXHAUSTED = "attempts_exhausted", "attempts exhausted"
        FAILED = "failed", "failed (not retryable)"
        MALFORMED = "malformed", "malformed message"

    task_name = models.CharField(max_length=255, blank=True)
    # Indexed through Meta (audits.models.Page.url says why).
    task_id = models.CharField(max_length=255, blank=True)
    queue = models.CharField(max_length=255, blank=True)
    # None when the message body could not be decoded; `raw_message` has it then.
    args = models.JSONField(null=True, blank=True)
    kwargs = models.JSONField(null=True, blank=True)
    raw_message = models.TextField(blank=True)
    reason = models.CharField(max_length=32, choices=Reason.choices)
    exception = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    attempts = models.PositiveIntegerField(
        default=0, help_text="Times the task ran (0: the worker could not run it at all)."
    )
    first_failed_at = models.DateTimeField()
    last_failed_at = models.DateTimeField()
    replayed_at = models.DateTimeField(null=True, blank=True)
    replayed_by = models.CharField(max_length=255, blank=True)
    replay_task_id = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["-last_failed_at"]
        indexes = [
            # The admin's list of one task (read backwards) and the retention of one task's
            # dead letters (webhooks.retention), walked in this order.
            models.Index(
                fields=["task_name", "last_failed_at", "id"], name="deadletter_task_failed_idx"
            ),
            models.Index(fields=["replayed_at", "-last_failed_at"], name="deadletter_replayed_idx"),
            models.Index(fields=["task_id"], name="deadletter_task_id_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.task_name or 'unknown task'} {self.task_id} ({self.get_reason_display()})"


class CircuitBreaker(models.Model):
    """The last known state of one breaker, for the admin; the live state is in Redis."""

    class State(models.TextChoices):
        CLOSED = "closed"
        OPEN = "open"
        HALF_OPEN = "half_open", "half-open"

    task_name = models.CharField(max_length=255)
    # Named `host` from before breakers were per origin (outbound.urls.origin_key).
    host = models.CharField(
        "origin",
        max_length=255,
        help_text="The origin the breaker guards: scheme://host[:port].",
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.CLOSED)
    last_transition = models.CharField(max_length=32, blank=True)
    changed_at = models.DateTimeField()
    open_until = models.DateTimeField(null=True, blank=True)
    times_opened = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["task_name", "host"]
        constraints = [
            models.UniqueConstraint(fields=["task_name", "host"], name="breaker_task_host_unique")
        ]
        # Retention walks it (jobs.breakers.RETENTION).
        indexes = [models.Index(fields=["changed_at", "id"], name="breaker_changed_idx")]

    def __str__(self) -> str:
        return f"{self.task_name} → {self.host}"


class ReconcileMark(models.Model):
    """The mark the reconciler last left in Redis (jobs.reconcile), kept here too: a Redis
    without a mark it was given has forgotten, where one that was never given one is new."""

    server = models.CharField(max_length=64, blank=True, help_text="The Redis server's run_id.")
    at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.server or 'unknown server'} at {self.at.isoformat()}"
