"""The nightly re-audit as plain functions: fan-out, slices, placements, and what is scheduled.

The fan-out writes one `Placement` row per page (its offset in the night) and starts
slice 0. Each slice publishes the placements due in the next REAUDIT_SLICE_SECONDS
with ETAs at most one slice ahead, then schedules the next slice, so no broker message
ever waits hours: a worker holds at most about one slice of placements
(DECISIONS.md, "Re-audit"). A placement, when it fires, creates the audit and
enqueues it on `audits` with no delay.

What publishes takes the tasks it publishes as `night_tasks` (reaudit.tasks.NIGHT_TASKS):
reaudit.tasks runs these functions, so this module cannot import it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from itertools import islice

from celery import Task
from django.conf import settings
from django.db import connections, router, transaction
from django.utils import timezone

from audits.models import Audit, Page
from audits.submission import create_and_enqueue_audit
from jobs.sql import column, fetch_one, preparing_cursor
from reaudit.models import FanOut, Placement, SliceRun
from reaudit.offsets import domain_offset, page_offset, slice_count, slice_of

log = logging.getLogger(__name__)

# Rows read and written per round trip: keeps the fan-out's memory flat in the number of pages.
BATCH_SIZE = 2000


def placement_key(page_id: int, day: date) -> str:
    """A placement's task id, and the idempotency key of the audit it creates."""
    return f"reaudit-{page_id}-{day.isoformat()}"


@dataclass(frozen=True)
class NightTasks:
    """The tasks a night's chain publishes: a slice, and a placement when it is due."""

    publish_slice: Task
    place: Task


@dataclass(frozen=True)
class FanOutResult:
    fan_out: FanOut
    created: bool
    resumed_slice: int | None = None


def fan_out(
    day: date | None = None,
    *,
    night_tasks: NightTasks,
    window_seconds: int | None = None,
    slice_seconds: int | None = None,
    spacing_seconds: float | None = None,
) -> FanOutResult:
    """Place every page marked for re-audit into `day`'s night, once.

    A second fan-out of the same day places nothing: it finds the night's record
    and only makes sure its slice chain is moving (`resume`). Older nights still
    in progress are superseded: they publish no further slice, since tonight
    places their pages again.
    """
    day = day or timezone.now().date()
    existing = FanOut.objects.filter(day=day).first()
    if existing is not None:
        resumed = resume(existing, night_tasks=night_tasks)
        return FanOutResult(existing, created=False, resumed_slice=resumed)

    window = window_seconds or settings.REAUDIT_WINDOW_SECONDS
    slice_length = slice_seconds or settings.REAUDIT_SLICE_SECONDS
    spacing = (
        settings.REAUDIT_DOMAIN_SPACING_SECONDS if spacing_seconds is None else spacing_seconds
    )

    # One transaction: a fan-out that dies half-way leaves no record, and the
    # next run (a retry, a second beat, the command) starts it afresh.
    with transaction.atomic():
        night, created = FanOut.objects.get_or_create(
            day=day,
            defaults={
                "window_start": timezone.now(),
                "window_seconds": window,
                "slice_seconds": slice_length,
                "spacing_seconds": spacing,
            },
        )
        if not created:  # a concurrent fan-out of the same day committed first
            return FanOutResult(night, created=False)
        superseded = FanOut.objects.filter(
            day__lt=day, finished_at=None, superseded_at=None
        ).update(superseded_at=timezone.now())

        sizes = [0] * slice_count(window, slice_length)
        for batch in _batched(_placements(night), BATCH_SIZE):
            Placement.objects.bulk_create(batch)
            for placement in batch:
                sizes[placement.slice_index] += 1
        night.pages = sum(sizes)
        night.slice_sizes = sizes
        # The window opens once every placement is written, so slice 0 is not late.
        night.window_start = timezone.now()
        night.save(update_fields=["pages", "slice_sizes", "window_start"])
        planned = night.window_start
        transaction.on_commit(lambda: schedule_slice(night_tasks, day, 0, planned_at=planned))

    log.info(
        "reaudit.fanned_out",
        extra={
            "day": day.isoformat(),
            "pages": night.pages,
            "window_seconds": window,
            "slices": len(sizes),
            "busiest_slice": max(sizes),
            "superseded": superseded,
        },
    )
    return FanOutResult(night, created=True)


def _placements(night: FanOut) -> Iterator[Placement]:
    """The night's placements, streamed from the pages in (domain, id) order."""
    pages = (
        Page.objects.reaudited_nightly()
        .order_by("domain", "id")
        .values_list("id", "domain")
        .iterator(chunk_size=BATCH_SIZE)
    )
    slices = slice_count(night.window_seconds, night.slice_seconds)
    domain, first, rank = None, 0.0, 0
    for page_id, page_domain in pages:
        if page_domain != domain:
            domain, rank = page_domain, 0
            first = domain_offset(domain, night.day, night.window_seconds)
        offset = page_offset(
            first, rank, spacing_seconds=night.spacing_seconds, window_seconds=night.window_seconds
        )
        rank += 1
        yield Placement(
            fan_out=night,
            page_id=page_id,
            offset_seconds=offset,
            slice_index=slice_of(offset, night.slice_seconds, slices),
        )


def _batched(items: Iterable, size: int) -> Iterator[list]:
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch


def schedule_slice(night_tasks: NightTasks, day: date, index: int, *, planned_at: datetime) -> None:
    """Publish slice `index` of `day` to start at `planned_at` (at most one slice ahead)."""
    night_tasks.publish_slice.apply_async(
        args=[day.isoformat(), index, planned_at.isoformat()],
        eta=planned_at,
        task_id=f"reaudit-slice-{day.isoformat()}-{index}",
        queue=settings.REAUDIT_QUEUE,
    )


def publish_slice(
    day: date, index: int, planned_at: datetime, *, night_tasks: NightTasks
) -> SliceRun | None:
    """Publish slice `index`'s placements once, then schedule the next slice once.

    Runs under a lock on the slice's row, so a duplicate delivery (a redelivery,
    a resume) waits and then finds the work done. A slice that starts late (its
    worker was down) starts from now and the rest of the night shifts with it:
    the missed placements come late, spread as planned, not as one burst.
    Publishing happens inside the transaction, before the row says so: a crash in
    between republishes (harmless: placements are idempotent) rather than losing.
    """
    night = FanOut.objects.filter(day=day).first()
    if night is None or index >= night.slice_count:
        log.warning("reaudit.slice_unknown", extra={"day": day.isoformat(), "slice": index})
        return None
    if night.superseded_at is not None:
        log.info("reaudit.slice_superseded", extra={"day": day.isoformat(), "slice": index})
        return None

    with transaction.atomic():
        run, _ = SliceRun.objects.select_for_update().get_or_create(
            fan_out=night,
            index=index,
            defaults={"planned_at": planned_at, "starts_at": max(planned_at, timezone.now())},
        )
        if run.published_at is None:
            run.placements = _publish_placements(night_tasks, night, run)
            run.published_at = timezone.now()
            run.save(update_fields=["placements", "published_at"])
            log.info(
                "reaudit.slice_published",
                extra={
                    "day": day.isoformat(),
                    "slice": index,
                    "placements": run.placements,
                    "late_seconds": round(run.late_seconds, 3),
                },
            )
        if run.next_scheduled_at is None:
            if index + 1 < night.slice_count:
                next_start = run.starts_at + timedelta(seconds=night.slice_seconds)
                schedule_slice(night_tasks, day, index + 1, planned_at=next_start)
            else:
                FanOut.objects.filter(id=night.id, finished_at=None).update(
                    finished_at=timezone.now()
                )
            run.next_scheduled_at = timezone.now()
            run.save(update_fields=["next_scheduled_at"])
    return run


def _publish_placements(night_tasks: NightTasks, night: FanOut, run: SliceRun) -> int:
    """Publish the slice's unfired placements, each due at its offset, pipelined.

    One producer, and kombu's publish batch: a message's Redis commands (an LPUSH
    and its task-sent event) are pipelined, BATCH_SIZE commands a round trip,
    instead of two round trips a message (BENCHMARKS.md: 3,000 placements in
    about a third of the time).
    """
    placements = (
        Placement.objects.filter(fan_out=night, slice_index=run.index, fired_at=None)
        .values_list("page_id", "offset_seconds")
        .iterator(chunk_size=BATCH_SIZE)
    )
    published = 0
    app = night_tasks.place.app
    with app.producer_or_acquire() as producer, producer.batch(max_size=BATCH_SIZE):
        for page_id, offset in placements:
            publish_placement(
                night_tasks, page_id, night.day, eta=due_time(night, run, offset), producer=producer
            )
            published += 1
    return published


def publish_placement(
    night_tasks: NightTasks, page_id: int, day: date, *, eta: datetime | None, producer=None
) -> None:
    night_tasks.place.apply_async(
        args=[page_id, day.isoformat()],
        task_id=placement_key(page_id, day),
        eta=eta,
        queue=settings.REAUDIT_QUEUE,
        producer=producer,
    )


def due_time(night: FanOut, run: SliceRun, offset_seconds: float) -> datetime:
    """When a placement of `run`'s slice is due: its offset, shifted by the slice's lateness."""
    return run.starts_at + timedelta(seconds=offset_seconds - run.index * night.slice_seconds)


def next_slice(night: FanOut) -> tuple[int, datetime] | None:
    """The slice an open night's chain is waiting for, and when it is planned to start."""
    if not night.is_open:
        return None
    last = night.slice_runs.order_by("-index").first()
    if last is None:
        index, planned = 0, night.window_start
    elif last.published_at is None or last.next_scheduled_at is None:
        index, planned = last.index, last.planned_at
    else:
        index, planned = last.index + 1, last.starts_at + timedelta(seconds=night.slice_seconds)
    return (index, planned) if index < night.slice_count else None


def resume(night: FanOut, *, night_tasks: NightTasks) -> int | None:
    """Make sure an open night's slice chain is moving: (re)publish its next slice.

    Harmless when the chain is alive (the duplicate finds the slice done and the
    next one scheduled); it restarts a chain whose message was lost. Returns the
    slice published, or None for a finished or superseded night.
    """
    waiting_for = next_slice(night)
    if waiting_for is None:
        return None
    index, planned = waiting_for
    schedule_slice(night_tasks, night.day, index, planned_at=planned)
    log.info("reaudit.resumed", extra={"day": night.day.isoformat(), "slice": index})
    return index


# A placement's read of its page and its write of `fired_at`, written once from the models
# (as an audit's own statements are, jobs.sql): the ORM compiling them was most of a
# placement's CPU (DECISIONS.md, "A placement's statements are written once").
_PAGE, _PLACEMENT, _FAN_OUT = Page._meta, Placement._meta, FanOut._meta
_REMOVED_AT, _REAUDITED = column(Page, "removed_at"), column(Page, "reaudit_nightly")
_FIRED_AT, _FAN_OUT_ID, _PAGE_ID = (
    column(Placement, name) for name in ("fired_at", "fan_out", "page")
)
_NIGHT_OF_DAY = (
    f'SELECT "{_FAN_OUT.pk.column}" FROM "{_FAN_OUT.db_table}" WHERE {column(FanOut, "day")} = %s'
)
PAGE_REAUDITED_SQL = (
    f'SELECT 1 FROM "{_PAGE.db_table}" WHERE "{_PAGE.pk.column}" = %s '
    f"AND {_REMOVED_AT} IS NULL AND {_REAUDITED} = %s"
)
PLACEMENT_FIRED_SQL = (
    f'UPDATE "{_PLACEMENT.db_table}" SET {_FIRED_AT} = %s '
    f"WHERE {_FAN_OUT_ID} = ({_NIGHT_OF_DAY}) AND {_PAGE_ID} = %s AND {_FIRED_AT} IS NULL"
)


def fire_placement(page_id: int, day: date) -> Audit | None:
    """A placement's moment: create the page's re-audit for `day` and enqueue it, once.

    A duplicate (a redelivery, a second fan-out, two beats) finds the audit by its
    idempotency key and creates and enqueues nothing. A page deleted or no longer
    marked for re-audit since the fan-out (or removed through the API) is skipped.
    """
    connection = connections[router.db_for_write(Placement)]
    reaudited = fetch_one(connection, PAGE_REAUDITED_SQL, [page_id, True]) is not None
    with transaction.atomic(using=connection.alias):
        with preparing_cursor(connection) as cursor:
            cursor.execute(PLACEMENT_FIRED_SQL, [
                _PLACEMENT.get_field("fired_at").get_db_prep_value(timezone.now(), connection),
                _FAN_OUT.get_field("day").get_db_prep_value(day, connection),
                page_id,
            ])  # fmt: skip
        if not reaudited:
            log.info("reaudit.placement_skipped", extra={"page_id": page_id, "day": str(day)})
            return None
        # The page is known by its id: the audit needs nothing else of it.
        audit, created = create_and_enqueue_audit(
            Page(pk=page_id), trigger=Audit.Trigger.REAUDIT,
            idempotency_key=placement_key(page_id, day),
        )  # fmt: skip
    log.info(
        "reaudit.placed",
        extra={
            "page_id": page_id,
            "day": str(day),
            "audit_id": str(audit.id),
            "new_audit": created,
        },
    )
    return audit


def count_scheduled() -> int:
    """Pages whose placement in the current night has not fired yet.

    Counts placements of slices not yet published as well as those a worker
    holds. Two indexed queries: the count walks an index holding only unfired
    placements (BENCHMARKS.md has its cost at 100,000 pages).
    """
    night_id = FanOut.objects.order_by("-day").values_list("id", flat=True).first()
    if night_id is None:
        return 0
    return Placement.objects.filter(fan_out_id=night_id, fired_at__isnull=True).count()


def night_progress(now: datetime | None = None) -> dict[str, float]:
    """The current night against its plan, for the gauges (reaudit.apps).

    `reaudit_placements_due` counts the placements of the slices whose planned window has
    ended (from the night's frozen slice sizes, no scan of the placements), and
    `reaudit_placements_fired` those that fired: in a night on schedule fired >= due. The
    fan-out's time says whether a night started at all. Nothing is reported before the
    first fan-out.
    """
    night = FanOut.objects.order_by("-day").first()
    if night is None:
        return {}
    now = now or timezone.now()
    elapsed = (now - night.window_start).total_seconds()
    slices_ended = max(0, min(len(night.slice_sizes), int(elapsed // night.slice_seconds)))
    return {
        "reaudit_fanout_timestamp": night.created_at.timestamp(),
        "reaudit_placements": night.pages,
        "reaudit_placements_due": sum(night.slice_sizes[:slices_ended]),
        # count_scheduled()'s count, through the same index, for the night already read.
        "reaudit_placements_fired": night.pages
        - Placement.objects.filter(fan_out=night, fired_at__isnull=True).count(),
    }
