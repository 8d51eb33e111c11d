"""The nightly re-audit run by real reaudit (and audits) workers on the real Redis."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

import pytest
from django.utils import timezone

from audits.models import Audit
from reaudit import services
from reaudit.models import FanOut, Placement, SliceRun
from reaudit.tasks import NIGHT_TASKS, place
from tests.broker import backlog, held, queued
from tests.reaudit_factories import DAY, domain_due_between, due_at, make_pages
from tests.workers import module_worker, reaudit_as_make_run, wait_for

pytestmark = pytest.mark.slow

# A reaudit worker as `make run` starts it, shared by the tests that neither kill nor stop it.
reaudit_worker = module_worker("reaudit", **reaudit_as_make_run())


def start_reaudit(start_worker, **options):
    """A reaudit worker of the test's own, as `make run` starts it."""
    return start_worker("reaudit", **reaudit_as_make_run(), **options)


def unfired(night: FanOut) -> int:
    return Placement.objects.filter(fan_out=night, fired_at=None).count()


def wait_until_all_fired(night: FanOut, *workers, timeout: float = 45) -> None:
    wait_for(
        lambda: unfired(night) == 0, timeout=timeout, message="every placement to fire",
        show=workers,
    )  # fmt: skip


def assert_one_reaudit_per_page_each_at_or_after_its_offset(night: FanOut) -> None:
    night.refresh_from_db()
    placements = list(Placement.objects.filter(fan_out=night))
    audits = {a.page_id: a for a in Audit.objects.filter(trigger="reaudit")}
    assert sorted(audits) == sorted(p.page_id for p in placements)
    assert Audit.objects.filter(trigger="reaudit").count() == len(placements)
    for placement in placements:
        audit = audits[placement.page_id]
        assert audit.idempotency_key == services.placement_key(placement.page_id, DAY)
        assert placement.fired_at >= due_at(placement, night)
        # The audit row is created when its placement fires, not at the fan-out.
        assert audit.created_at >= due_at(placement, night)


def test_a_short_night_places_every_page_once_spaced_and_each_at_or_after_its_offset(
    site, reaudit_worker, start_worker, redis_client
):
    make_pages({"alpha.test": 3, "beta.test": 2, "gamma.test": 1}, base_url=site.base_url)
    make_pages({"unmarked.test": 2}, base_url=site.base_url, marked=False)
    start_worker("audits", concurrency=2)
    reaudit = reaudit_worker

    night = services.fan_out(
        DAY, window_seconds=6, slice_seconds=2, spacing_seconds=1, night_tasks=NIGHT_TASKS
    ).fan_out
    assert not Audit.objects.filter(created_at__lt=night.window_start).exists()

    wait_until_all_fired(night, reaudit)
    assert_one_reaudit_per_page_each_at_or_after_its_offset(night)
    assert not Audit.objects.filter(page__domain="unmarked.test").exists()
    # Exactly once: every placement ran one time, none was a duplicate.
    placed = [line for line in reaudit.lines if "reaudit.placed" in line]
    assert len(placed) == 6 and all("new_audit=True" in line for line in placed), reaudit.output()
    assert list(SliceRun.objects.filter(fan_out=night).values_list("index", flat=True)) == [0, 1, 2]

    fired = defaultdict(list)
    for placement in Placement.objects.filter(fan_out=night).select_related("page"):
        fired[placement.page.domain].append(placement.fired_at)
    for domain in ("alpha.test", "beta.test"):
        times = sorted(fired[domain])
        gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]
        # Due one second apart (and none before its time); the slack is the worker's
        # own timing on a busy machine.
        assert all(gap >= 0.5 for gap in gaps), (domain, gaps)

    wait_for(
        lambda: not Audit.objects.exclude(status__in=Audit.FINISHED).exists(),
        timeout=45,
        message="the re-audits to run",
    )
    assert set(Audit.objects.values_list("status", flat=True)) == {"succeeded"}
    assert services.count_scheduled() == 0


def test_a_second_fan_out_and_a_placement_delivered_twice_leave_one_audit_per_page(
    reaudit_worker, redis_client
):
    pages = make_pages({"alpha.test": 2, "beta.test": 2})
    reaudit = reaudit_worker

    night = services.fan_out(
        DAY, window_seconds=3, slice_seconds=1, spacing_seconds=0.5, night_tasks=NIGHT_TASKS
    ).fan_out
    assert not services.fan_out(
        DAY, window_seconds=3, slice_seconds=1, night_tasks=NIGHT_TASKS
    ).created  # a second beat
    duplicated = Placement.objects.get(fan_out=night, page=pages[0])
    for _ in range(2):  # as a redelivery would: the same placement, task id and ETA
        place.apply_async(
            args=[pages[0].id, DAY.isoformat()],
            task_id=services.placement_key(pages[0].id, DAY),
            eta=due_at(duplicated, night),
            queue="reaudit",
        )

    wait_until_all_fired(night, reaudit)

    def placed(page_id: int | None = None) -> list[str]:
        return [
            line
            for line in reaudit.lines
            if "reaudit.placed" in line and (page_id is None or f"page_id={page_id} " in line)
        ]

    wait_for(lambda: len(placed(pages[0].id)) >= 2, timeout=20, message="both duplicates to run")
    assert_one_reaudit_per_page_each_at_or_after_its_offset(night)
    assert sum("new_audit=True" in line for line in placed()) == 4, reaudit.output()
    # One run_audit per page on the audits queue: the duplicates enqueued nothing.
    assert sorted(m.args[0] for m in queued(redis_client, "audits")) == sorted(
        str(a.id) for a in Audit.objects.all()
    )


def test_placements_due_hours_ahead_are_not_in_the_audit_backlog_nor_held_by_a_worker(
    reaudit_worker, redis_client
):
    window, slice_seconds = 6 * 3600, 60
    soon = domain_due_between(0, 2, window=window)
    make_pages({soon: 1})
    later = [domain_due_between(3600 * h, 3600 * h + 1800, window=window) for h in range(1, 6)]
    make_pages({domain: 20 for domain in later})
    reaudit = reaudit_worker

    night = services.fan_out(
        DAY,
        window_seconds=window,
        slice_seconds=slice_seconds,
        spacing_seconds=10,
        night_tasks=NIGHT_TASKS,
    ).fan_out
    assert services.count_scheduled() == 101

    wait_for(
        lambda: unfired(night) == 100, timeout=20, message="the first page's placement",
        show=[reaudit],
    )  # fmt: skip
    wait_for(
        lambda: [m.task for m in held(redis_client, "reaudit")] == ["reaudit.publish_slice"],
        timeout=20,
        message="the worker to hold only the next slice",
        show=[reaudit],
    )
    # Once placed, the audit is in the backlog, runnable at once.
    (audit,) = Audit.objects.all()
    assert [(m.task, m.args, m.eta) for m in queued(redis_client, "audits")] == [
        ("audits.run_audit", [str(audit.id)], None)
    ]
    assert backlog(redis_client, "audits") == 1
    # The hundred placements due in hours are rows in the database, not messages.
    assert queued(redis_client, "reaudit") == []
    (next_slice,) = held(redis_client, "reaudit")
    assert next_slice.eta <= timezone.now() + timedelta(seconds=slice_seconds)
    assert services.count_scheduled() == 100


def test_a_sigkilled_reaudit_worker_loses_no_placement(start_worker, redis_client):
    # The slice shorter than the visibility timeout, both short enough for a test.
    # The reconciler ticking every second publishes again what is 10 s overdue.
    env = {"REAUDIT_VISIBILITY_TIMEOUT_SECONDS": "6", "REAUDIT_SLICE_SECONDS": "3",
           "RECONCILE_INTERVAL_SECONDS": "1", "RECONCILE_AFTER_SECONDS": "10"}  # fmt: skip
    make_pages({"alpha.test": 4, "beta.test": 4, "gamma.test": 4})
    doomed = start_reaudit(start_worker, env=env)

    night = services.fan_out(
        DAY, window_seconds=9, slice_seconds=3, spacing_seconds=0.5, night_tasks=NIGHT_TASKS
    ).fan_out
    wait_for(
        lambda: any(m.task == "reaudit.place" for m in held(redis_client, "reaudit")),
        timeout=20,
        message="the worker to hold scheduled placements",
    )
    doomed.kill()
    assert unfired(night) > 0
    assert held(redis_client, "reaudit"), "the killed worker's messages are still recorded"

    survivor = start_reaudit(start_worker, env=env)
    # The survivor's reconciler recovers a message the kill caught between leaving the
    # queue and being recorded as unacked.
    wait_until_all_fired(night, doomed, survivor, timeout=60)
    assert_one_reaudit_per_page_each_at_or_after_its_offset(night)
    assert services.count_scheduled() == 0


def test_a_stopped_reaudit_worker_puts_its_placements_back_and_the_missed_slice_runs_late(
    start_worker, redis_client
):
    make_pages({"alpha.test": 4, "beta.test": 4, "gamma.test": 4})
    first = start_reaudit(start_worker)

    night = services.fan_out(
        DAY, window_seconds=9, slice_seconds=3, spacing_seconds=0.5, night_tasks=NIGHT_TASKS
    ).fan_out
    wait_for(
        lambda: any(m.task == "reaudit.place" for m in held(redis_client, "reaudit")),
        timeout=20,
        message="the worker to hold scheduled placements",
    )
    first.stop()  # a graceful restart: what it held goes back on the queue at once
    assert held(redis_client, "reaudit") == []
    assert any(m.task == "reaudit.publish_slice" for m in queued(redis_client, "reaudit"))
    stopped_until = night.window_start + timedelta(seconds=5)
    wait_for(lambda: timezone.now() > stopped_until, timeout=10, message="slice 1 to be missed")

    second = start_reaudit(start_worker)
    wait_until_all_fired(night, first, second)
    assert_one_reaudit_per_page_each_at_or_after_its_offset(night)
    # The missed slice ran when a worker came back, and the rest of the night moved with it.
    late = SliceRun.objects.get(fan_out=night, index=1)
    assert late.late_seconds > 1
    assert SliceRun.objects.get(fan_out=night, index=2).planned_at == late.starts_at + timedelta(
        seconds=3
    )
