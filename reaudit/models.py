"""The nightly re-audit's records: one fan-out per day, its placements and its slices."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from audits.models import Page


class FanOut(models.Model):
    """One night's re-audit: which pages it placed, over which window, in how many slices.

    The window, slice and spacing are frozen here when the fan-out starts, so a
    settings change (or another worker's settings) never reshapes a night in progress.
    """

    day = models.DateField(unique=True)
    window_start = models.DateTimeField(help_text="Offsets count from here.")
    window_seconds = models.PositiveIntegerField()
    slice_seconds = models.PositiveIntegerField()
    spacing_seconds = models.FloatField()
    pages = models.PositiveIntegerField(default=0, help_text="Placements created.")
    slice_sizes = models.JSONField(default=list, help_text="Placements per slice.")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(
        null=True, blank=True, help_text="When the last slice was published."
    )
    superseded_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="A later night's fan-out started first; this one publishes no further slice.",
    )

    class Meta:
        ordering = ["-day"]

    def __str__(self) -> str:
        return f"re-audit of {self.day}"

    @property
    def slice_count(self) -> int:
        return len(self.slice_sizes)

    @property
    def is_open(self) -> bool:
        return self.finished_at is None and self.superseded_at is None


class Placement(models.Model):
    """One page's re-audit in one night: due at `offset_seconds` into the window.

    The row is the schedule, not the audit: the audit row is created only when
    the placement fires (`fired_at`).
    """

    # Not indexed alone: the unique (fan_out, page) and the index (fan_out, slice_index)
    # lead with it (DECISIONS.md, "No index another one already covers").
    fan_out = models.ForeignKey(
        FanOut, on_delete=models.CASCADE, related_name="placements", db_index=False
    )
    page = models.ForeignKey(Page, on_delete=models.CASCADE, related_name="+")
    offset_seconds = models.FloatField()
    slice_index = models.PositiveIntegerField()
    fired_at = models.DateTimeField(null=True, blank=True)
    # Set when the reconciler published the placement again (reaudit.reconcile).
    requeued_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["fan_out", "offset_seconds"]
        constraints = [
            models.UniqueConstraint(fields=["fan_out", "page"], name="placement_once_per_night"),
        ]
        indexes = [
            models.Index(fields=["fan_out", "slice_index"], name="placement_slice_idx"),
            # count_scheduled() counts through this: it holds only the placements
            # still to fire, so it shrinks through the night. The page is in it so a
            # placement firing finds its own row in it: keyed by the night alone, the
            # planner (whose statistics predate the night's bulk insert) chose it for
            # that lookup and walked every unfired placement of the night, each time.
            models.Index(
                fields=["fan_out", "page"],
                condition=Q(fired_at__isnull=True),
                name="placement_unfired_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"page {self.page_id} at +{self.offset_seconds:.0f}s"


class SliceRun(models.Model):
    """The one publication of slice `index` of a fan-out: its idempotency record."""

    # Not indexed alone: the unique (fan_out, index) leads with it (DECISIONS.md, "No
    # index another one already covers").
    fan_out = models.ForeignKey(
        FanOut, on_delete=models.CASCADE, related_name="slice_runs", db_index=False
    )
    index = models.PositiveIntegerField()
    planned_at = models.DateTimeField(help_text="When the chain meant this slice to start.")
    starts_at = models.DateTimeField(
        help_text="When it did start: later than planned after an outage, and the rest "
        "of the night shifts with it."
    )
    published_at = models.DateTimeField(null=True, blank=True)
    placements = models.PositiveIntegerField(default=0)
    next_scheduled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["fan_out", "index"]
        constraints = [
            models.UniqueConstraint(fields=["fan_out", "index"], name="slice_once_per_night"),
        ]

    def __str__(self) -> str:
        return f"slice {self.index} of {self.fan_out_id}"

    @property
    def late_seconds(self) -> float:
        return (self.starts_at - self.planned_at).total_seconds()
