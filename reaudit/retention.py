"""What the re-audit lets go of: the placements of closed nights past
REAUDIT_PLACEMENT_RETENTION_DAYS, and the nights themselves (with their slices) past
REAUDIT_NIGHT_RETENTION_DAYS (jobs.retention prunes them).

A night's placements are most of its rows (one per page); they are walked by
(night, page), the unique index's order, so a batch starts where the last one ended.
A night goes only once its placements are gone, so its own delete never cascades
into millions of rows in one transaction. Only closed nights (finished or superseded)
are touched: an open night's chain still reads its rows.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Exists, OuterRef, Q, QuerySet

from jobs.retention import PrunableKind
from reaudit.models import FanOut, Placement


def closed_nights_before(cutoff: datetime) -> QuerySet:
    return FanOut.objects.filter(day__lt=cutoff.date()).filter(
        Q(finished_at__isnull=False) | Q(superseded_at__isnull=False)
    )


def aged_out_placements(cutoff: datetime) -> QuerySet:
    return Placement.objects.filter(fan_out__in=closed_nights_before(cutoff).values("id"))


def aged_out_nights(cutoff: datetime) -> QuerySet:
    placements = Placement.objects.filter(fan_out_id=OuterRef("id"))
    return closed_nights_before(cutoff).exclude(Exists(placements))


KINDS = [
    PrunableKind(
        name="reaudit_placements",
        horizon_setting="REAUDIT_PLACEMENT_RETENTION_DAYS",
        aged_out=aged_out_placements,
        walk=("fan_out", "page"),
        description="placements of closed nights",
    ),
    PrunableKind(
        name="reaudit_nights",
        horizon_setting="REAUDIT_NIGHT_RETENTION_DAYS",
        aged_out=aged_out_nights,
        walk=("day",),
        description="closed nights and their slices, once their placements are gone",
    ),
]
