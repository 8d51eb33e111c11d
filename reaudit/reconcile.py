"""What a night owes, for the one reconciler (jobs.reconcile).

A night's chain lives in Redis as ETA messages a reaudit worker holds: the next slice,
and the placements of the current one. A worker SIGKILLed between taking a message off
the list and recording it unacked, or a Redis that comes back empty or behind, loses
them; the rows say what is owed:

- the slice an open night's chain waits for (`services.next_slice`), due at its
  planned start;
- every unfired placement of a published slice, due at its offset (shifted by the
  slice's lateness), or since it was last published again (`requeued_at`);
- the night itself, when beat sent its fan-out (django-celery-beat records the send as
  the entry's `last_run_at` in PostgreSQL) and no night of that day exists: the message
  died before a reaudit worker ran it.

After Redis lost data each goes back with its own due time (an ETA at most one slice
ahead, as the slice published it), so the night still re-audits every page once, on
its schedule. Otherwise they are published again once RECONCILE_AFTER_SECONDS overdue,
due at once. Slices and placements are idempotent: a duplicate finds the work done.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from config.redis import redis_client
from jobs.lifecycle import BATCH, Window
from jobs.reconcile import PUBLISH_ERRORS, OwedWork
from reaudit import services
from reaudit.models import FanOut, Placement
from reaudit.tasks import NIGHT_TASKS, fan_out


def nights(window: Window) -> Iterable[FanOut]:
    """Nights that may still owe work: open ones, and those finished lately (a last
    slice's placements fire up to a slice after it was published)."""
    recent = (
        window.now
        - timedelta(seconds=settings.RECONCILE_AFTER_SECONDS)
        - timedelta(seconds=settings.REAUDIT_SLICE_SECONDS)
    )
    return FanOut.objects.filter(superseded_at=None).filter(
        Q(finished_at=None) | Q(finished_at__gte=recent)
    )


@dataclass(frozen=True)
class OwedSlice:
    day: date
    index: int
    planned_at: datetime


def owed_slices(window: Window) -> Iterator[OwedSlice]:
    for night in nights(window):
        waiting_for = services.next_slice(night)
        if waiting_for is None:
            continue
        index, planned = waiting_for
        if window.redis_lost or planned < window.overdue_before:
            yield OwedSlice(night.day, index, planned)


def republish_slice(owed: OwedSlice) -> bool:
    # Held as an ETA until its planned start, as the chain would have.
    try:
        services.schedule_slice(NIGHT_TASKS, owed.day, owed.index, planned_at=owed.planned_at)
    except PUBLISH_ERRORS:
        return False  # the broker is down: the next tick tries again
    return True


@dataclass(frozen=True)
class OwedPlacement:
    page_id: int
    day: date
    due_at: datetime
    overdue: bool


def owed_placements(window: Window) -> Iterator[OwedPlacement]:
    for night in nights(window):
        runs = {run.index: run for run in night.slice_runs.filter(published_at__isnull=False)}
        if not runs:
            continue
        unfired = Placement.objects.filter(fan_out=night, fired_at=None, slice_index__in=list(runs))
        if window.redis_lost:
            if window.lost_since is not None:
                published_since = [
                    i for i, run in runs.items() if run.published_at >= window.lost_since
                ]
                unfired = unfired.filter(
                    Q(slice_index__in=published_since) | Q(requeued_at__gte=window.lost_since)
                )
        else:
            unfired = unfired.filter(Q(requeued_at=None) | Q(requeued_at__lt=window.overdue_before))
        rows = unfired.values_list("page_id", "slice_index", "offset_seconds")
        for page_id, index, offset in rows[: window.limit].iterator(chunk_size=BATCH):
            due = services.due_time(night, runs[index], offset)
            overdue = due < window.overdue_before
            if window.redis_lost or overdue:
                yield OwedPlacement(page_id, night.day, due, overdue)


def republish_placement(owed: OwedPlacement) -> bool:
    # Overdue: at once. Otherwise (Redis lost it) held until it is due, as its slice had it.
    eta = None if owed.overdue or owed.due_at <= timezone.now() else owed.due_at
    try:
        services.publish_placement(NIGHT_TASKS, owed.page_id, owed.day, eta=eta)
    except PUBLISH_ERRORS:
        return False
    if owed.overdue:
        # Not again by the age rule for RECONCILE_AFTER_SECONDS. (One due later, put back
        # after a loss, needs no stamp: it is not overdue before it is due.)
        Placement.objects.filter(fan_out__day=owed.day, page_id=owed.page_id, fired_at=None).update(
            requeued_at=timezone.now()
        )
    return True


@dataclass(frozen=True)
class OwedFanOut:
    day: date


def owed_fan_outs(window: Window) -> Iterator[OwedFanOut]:
    """A nightly fan-out beat sent within the last day whose night does not exist."""
    sent = PeriodicTask.objects.filter(
        task=fan_out.name, enabled=True, last_run_at__gte=window.now - timedelta(days=1)
    )
    if window.redis_lost:
        sent = sent.filter(window.since("last_run_at"))
    else:
        sent = sent.filter(last_run_at__lt=window.overdue_before)
    for last_run_at in sent.values_list("last_run_at", flat=True):
        day = timezone.localdate(last_run_at)
        if not FanOut.objects.filter(day=day).exists():
            yield OwedFanOut(day)


def republish_fan_out(owed: OwedFanOut) -> bool:
    # Once per RECONCILE_AFTER_SECONDS while its night is missing (a reaudit worker down
    # for an hour is not sent a fan-out every tick); a Redis that forgot the stamp has
    # forgotten the message too. Idempotent anyway: a fan-out that finds its night only
    # resumes it.
    try:
        if not redis_client().set(
            f"reconcile:fan-out:{owed.day.isoformat()}", 1, nx=True,
            ex=max(1, int(settings.RECONCILE_AFTER_SECONDS)),
        ):  # fmt: skip
            return True
        fan_out.apply_async(kwargs={"day": owed.day.isoformat()}, queue=settings.REAUDIT_QUEUE)
    except PUBLISH_ERRORS:
        return False
    return True


SOURCES = (
    OwedWork("reaudit_fan_outs", owed_fan_outs, republish_fan_out),
    OwedWork("reaudit_slices", owed_slices, republish_slice),
    OwedWork("reaudit_placements", owed_placements, republish_placement),
)
