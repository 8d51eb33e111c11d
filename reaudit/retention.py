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


def placements_of_closed_nights_before(cutoff: datetime) -> QuerySet:
    # The nights' ids as values, not a subquery: the walk is then a range of the
    # (night, page) index, whatever the statistics.
    nights = list(closed_nights_before(cutoff).values_list("id", flat=True))
    return Placement.objects.filter(fan_out_id__in=nights)


def nights_without_placements(nights: QuerySet) -> QuerySet:
    return nights.exclude(Exists(Placement.objects.filter(fan_out_id=OuterRef("id"))))


KINDS = [
    PrunableKind(
        name="reaudit_placements",
        horizon_setting="REAUDIT_PLACEMENT_RETENTION_DAYS",
        old_enough=placements_of_closed_nights_before,
        walk=("fan_out", "page"),
        description="placements of closed nights",
    ),
    PrunableKind(
        name="reaudit_nights",
        horizon_setting="REAUDIT_NIGHT_RETENTION_DAYS",
        old_enough=closed_nights_before,
        walk=("day",),
        may_go=nights_without_placements,
        description="closed nights and their slices, once their placements are gone",
    ),
]
