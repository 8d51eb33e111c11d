"""The fan-out, its slices and its placements, called directly against real Redis and the DB."""

from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.apps import apps
from django.core.management import call_command
from django.utils import timezone
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from audits.models import Audit, Page
from reaudit import services
from reaudit.models import FanOut, Placement, SliceRun
from reaudit.offsets import domain_offset
from reaudit.tasks import NIGHT_TASKS
from tests.broker import queued
from tests.reaudit_factories import DAY, domain_due_between, make_pages
from tests.reconciling import reconciled_now
from tests.workers import ROOT

pytestmark = pytest.mark.usefixtures("transactional_db")

WINDOW, SLICE, SPACING = 3600, 600, 10.0


def run_fan_out(**overrides):
    options = {"window_seconds": WINDOW, "slice_seconds": SLICE, "spacing_seconds": SPACING}
    return services.fan_out(DAY, night_tasks=NIGHT_TASKS, **{**options, **overrides})


def slice_messages(redis_client):
    return [m for m in queued(redis_client, "reaudit") if m.task == "reaudit.publish_slice"]


def placement_messages(redis_client):
    return [m for m in queued(redis_client, "reaudit") if m.task == "reaudit.place"]


def test_a_fan_out_places_each_marked_page_once_and_creates_no_audit(redis_client):
    make_pages({"a.test": 3, "b.test": 2, "c.test": 1})
    make_pages({"unmarked.test": 2}, marked=False)

    result = run_fan_out()

    night = result.fan_out
    assert result.created
    placed = Placement.objects.filter(fan_out=night)
    assert sorted(p.page.domain for p in placed) == sorted(
        ["a.test"] * 3 + ["b.test"] * 2 + ["c.test"]
    )
    assert night.pages == 6
    assert sum(night.slice_sizes) == 6 and len(night.slice_sizes) == WINDOW // SLICE
    assert all(0 <= p.offset_seconds < WINDOW for p in placed)
    assert not Audit.objects.exists()
    # Only slice 0 is on the broker; the placements are rows until their slice comes.
    assert [m.args for m in slice_messages(redis_client)] == [
        [DAY.isoformat(), 0, night.window_start.isoformat()]
    ]
    assert placement_messages(redis_client) == []


def test_a_domains_pages_are_spaced_after_its_offset_in_page_id_order(redis_client):
    pages = make_pages({"a.test": 4})

    night = run_fan_out().fan_out

    first = domain_offset("a.test", DAY, WINDOW)
    offsets = [Placement.objects.get(fan_out=night, page=page).offset_seconds for page in pages]
    assert offsets == [pytest.approx((first + n * SPACING) % WINDOW) for n in range(4)]


def test_a_second_fan_out_of_the_same_day_places_nothing_and_keeps_the_offsets(redis_client):
    make_pages({"a.test": 3, "b.test": 2})
    first = run_fan_out()
    offsets = dict(Placement.objects.values_list("page_id", "offset_seconds"))
    make_pages({"late.test": 1})

    second = run_fan_out(window_seconds=60)

    assert not second.created
    assert second.fan_out.id == first.fan_out.id
    assert second.fan_out.window_seconds == WINDOW
    assert dict(Placement.objects.values_list("page_id", "offset_seconds")) == offsets
    assert FanOut.objects.count() == 1


def test_a_slice_publishes_its_own_placements_each_due_at_its_offset(redis_client):
    early = domain_due_between(0, 300, window=WINDOW)
    late = domain_due_between(1800, 3000, window=WINDOW)
    make_pages({early: 3, late: 2})
    night = run_fan_out().fan_out
    redis_client.delete("reaudit")

    run = services.publish_slice(DAY, 0, night.window_start, night_tasks=NIGHT_TASKS)

    assert run.placements == 3
    # On time: the slice starts when its task runs, a moment after it was planned.
    assert timedelta(0) <= run.starts_at - night.window_start < timedelta(seconds=1)
    published = {m.id: m.eta for m in placement_messages(redis_client)}
    expected = {
        services.placement_key(p.page_id, DAY): run.starts_at + timedelta(seconds=p.offset_seconds)
        for p in Placement.objects.filter(fan_out=night, page__domain=early)
    }
    assert published == expected
    assert max(published.values()) < run.starts_at + timedelta(seconds=SLICE)
    (next_slice,) = slice_messages(redis_client)
    assert next_slice.id == f"reaudit-slice-{DAY.isoformat()}-1"
    assert next_slice.eta == run.starts_at + timedelta(seconds=SLICE)


def test_a_slice_delivered_twice_publishes_once_and_schedules_the_next_once(redis_client):
    make_pages({domain_due_between(0, 300, window=WINDOW): 2})
    night = run_fan_out().fan_out
    redis_client.delete("reaudit")

    services.publish_slice(DAY, 0, night.window_start, night_tasks=NIGHT_TASKS)
    services.publish_slice(DAY, 0, night.window_start, night_tasks=NIGHT_TASKS)

    assert len(placement_messages(redis_client)) == 2
    assert len(slice_messages(redis_client)) == 1
    assert SliceRun.objects.get(fan_out=night, index=0).placements == 2


def test_a_late_slice_shifts_the_rest_of_the_night_instead_of_bursting(redis_client):
    make_pages({domain_due_between(SLICE + 100, SLICE + 200, window=WINDOW): 3})
    night = run_fan_out().fan_out
    redis_client.delete("reaudit")
    # As if the worker was down for the first hour and this message waited for it.
    FanOut.objects.filter(id=night.id).update(window_start=night.window_start - timedelta(hours=1))
    night.refresh_from_db()
    planned = night.window_start + timedelta(seconds=SLICE)
    before = timezone.now()

    run = services.publish_slice(DAY, 1, planned, night_tasks=NIGHT_TASKS)

    assert run.late_seconds >= 3000
    etas = sorted(m.eta for m in placement_messages(redis_client))
    # Spread from now as they were planned inside their slice, not all due at once.
    assert etas[0] >= before + timedelta(seconds=99)
    assert [round((b - a).total_seconds(), 3) for a, b in zip(etas, etas[1:], strict=False)] == [
        SPACING
    ] * 2
    (next_slice,) = slice_messages(redis_client)
    assert next_slice.eta == run.starts_at + timedelta(seconds=SLICE)


def test_the_last_slice_finishes_the_night(redis_client):
    make_pages({"a.test": 1})
    night = run_fan_out(window_seconds=SLICE * 2).fan_out
    services.publish_slice(DAY, 0, night.window_start, night_tasks=NIGHT_TASKS)
    redis_client.delete("reaudit")

    services.publish_slice(
        DAY, 1, night.window_start + timedelta(seconds=SLICE), night_tasks=NIGHT_TASKS
    )

    night.refresh_from_db()
    assert night.finished_at is not None
    assert slice_messages(redis_client) == []
    assert services.resume(night, night_tasks=NIGHT_TASKS) is None


def test_a_superseded_night_publishes_no_further_slice(redis_client):
    make_pages({"a.test": 2})
    old = run_fan_out().fan_out
    services.fan_out(
        DAY + timedelta(days=1), window_seconds=WINDOW, slice_seconds=SLICE, night_tasks=NIGHT_TASKS
    )
    redis_client.delete("reaudit")

    assert (
        services.publish_slice(
            DAY, 1, old.window_start + timedelta(seconds=SLICE), night_tasks=NIGHT_TASKS
        )
        is None
    )

    old.refresh_from_db()
    assert old.superseded_at is not None
    assert queued(redis_client, "reaudit") == []


def test_resume_republishes_the_slice_a_lost_chain_was_waiting_for(redis_client):
    make_pages({"a.test": 2})
    night = run_fan_out().fan_out
    first = services.publish_slice(DAY, 0, night.window_start, night_tasks=NIGHT_TASKS)
    redis_client.delete("reaudit")  # the chain's message is lost

    assert run_fan_out().resumed_slice == 1

    (message,) = slice_messages(redis_client)
    assert message.id == f"reaudit-slice-{DAY.isoformat()}-1"
    assert message.eta == first.starts_at + timedelta(seconds=SLICE)


def test_placements_the_broker_lost_are_published_again_once_overdue(redis_client):
    make_pages({domain_due_between(0, 200, window=WINDOW): 3})
    night = run_fan_out().fan_out
    run = services.publish_slice(DAY, 0, night.window_start, night_tasks=NIGHT_TASKS)
    last_due = max(m.eta for m in placement_messages(redis_client))
    redis_client.delete("reaudit")  # lost: a worker killed between BRPOP and recording them

    # 14 s after the last was due: the two due 10 and 20 s earlier are overdue, it is not yet.
    first = reconciled_now(last_due + timedelta(seconds=14), overdue_after=15)
    assert first.republished.get("reaudit_placements") == 2

    redis_client.delete("reaudit")
    caught = reconciled_now(last_due + timedelta(seconds=16), overdue_after=15)
    assert caught.republished == {"reaudit_placements": 3}
    republished = placement_messages(redis_client)
    assert sorted(m.id for m in republished) == sorted(
        services.placement_key(p.page_id, DAY) for p in Placement.objects.filter(fan_out=night)
    )
    assert {m.eta for m in republished} == {None}  # overdue: due at once
    assert run.starts_at + timedelta(seconds=SLICE) > last_due + timedelta(seconds=16)


def test_a_slice_chain_whose_next_slice_is_overdue_is_restarted(redis_client):
    make_pages({"a.test": 2})
    night = run_fan_out().fan_out
    run = services.publish_slice(DAY, 0, night.window_start, night_tasks=NIGHT_TASKS)
    redis_client.delete("reaudit")  # the message of slice 1 is gone
    next_start = run.starts_at + timedelta(seconds=SLICE)

    early = reconciled_now(next_start + timedelta(seconds=14), overdue_after=15)
    assert "reaudit_slices" not in early.republished
    late = reconciled_now(next_start + timedelta(seconds=16), overdue_after=15)
    assert late.republished["reaudit_slices"] == 1

    (message,) = slice_messages(redis_client)
    assert (message.args[1], message.eta) == (1, next_start)


def test_nothing_is_published_again_on_a_healthy_night(redis_client):
    pages = make_pages({domain_due_between(0, 200, window=WINDOW): 2, "b.test": 3})
    night = run_fan_out().fan_out
    run = services.publish_slice(DAY, 0, night.window_start, night_tasks=NIGHT_TASKS)
    for page in pages[:2]:
        services.fire_placement(page.id, DAY)
    redis_client.delete("reaudit")

    caught = reconciled_now(run.starts_at + timedelta(seconds=SLICE - 1), overdue_after=15)

    # (Ten minutes on, the two audits the placements created count as overdue: not the night's.)
    assert not [name for name in caught.republished if name.startswith("reaudit")]
    assert queued(redis_client, "reaudit") == []


def test_after_redis_came_back_empty_a_night_gets_its_chain_and_placements_back_on_time(
    redis_client,
):
    pages = make_pages({domain_due_between(100, 200, window=WINDOW): 3})
    night = run_fan_out().fan_out
    run = services.publish_slice(DAY, 0, night.window_start, night_tasks=NIGHT_TASKS)
    services.fire_placement(pages[0].id, DAY)
    # What a worker would hold now: slice 1, due when slice 0 ends, and slice 0's placements.
    before = {m.id: m.eta for m in queued(redis_client, "reaudit")}
    del before[f"reaudit-slice-{DAY.isoformat()}-0"]

    redis_client.flushdb()  # Redis lost every message of the night
    caught = reconciled_now(redis_lost=True)

    unfired = Placement.objects.filter(fan_out=night, slice_index=0, fired_at=None)
    # The audit the fired placement created had lost its message too.
    assert caught.republished == {
        "audits": 1, "reaudit_slices": 1, "reaudit_placements": unfired.count(),
    }  # fmt: skip
    after = {m.id: m.eta for m in queued(redis_client, "reaudit")}
    # The chain's next slice and each placement due when it was due before, not at once.
    assert after == {key: eta for key, eta in before.items()
                     if key != services.placement_key(pages[0].id, DAY)}  # fmt: skip
    assert run.next_scheduled_at is not None


def test_a_placement_fired_twice_creates_one_audit_and_enqueues_it_once(redis_client):
    (page,) = make_pages({"a.test": 1})
    run_fan_out()

    first = services.fire_placement(page.id, DAY)
    second = services.fire_placement(page.id, DAY)

    assert first.id == second.id
    audit = Audit.objects.get()
    assert (audit.trigger, audit.status) == ("reaudit", "queued")
    assert audit.idempotency_key == f"reaudit-{page.id}-{DAY.isoformat()}"
    assert [(m.task, m.args, m.eta) for m in queued(redis_client, "audits")] == [
        ("audits.run_audit", [str(audit.id)], None)
    ]
    assert Placement.objects.get(page=page).fired_at is not None


def test_a_placement_for_a_page_no_longer_marked_creates_no_audit(redis_client):
    (page,) = make_pages({"a.test": 1})
    run_fan_out()
    Page.objects.filter(id=page.id).update(reaudit_nightly=False)

    assert services.fire_placement(page.id, DAY) is None

    assert not Audit.objects.exists()
    assert services.count_scheduled() == 0


def test_count_scheduled_counts_every_unfired_placement_of_the_current_night(
    redis_client, django_assert_max_num_queries
):
    pages = make_pages({"a.test": 3, "b.test": 2})
    assert services.count_scheduled() == 0
    run_fan_out()
    services.fire_placement(pages[0].id, DAY)
    services.fire_placement(pages[0].id, DAY)  # a duplicate counts once

    with django_assert_max_num_queries(2):
        scheduled = services.count_scheduled()

    # Four left, although only slice 0 has been published.
    assert scheduled == 4
    services.fan_out(
        DAY + timedelta(days=1), window_seconds=WINDOW, slice_seconds=SLICE, night_tasks=NIGHT_TASKS
    )
    assert services.count_scheduled() == 5


def test_the_command_runs_a_fan_out_and_prints_what_it_placed(redis_client):
    make_pages({"a.test": 3})
    out = io.StringIO()

    call_command("reaudit_fanout", "--day", DAY.isoformat(), "--window", "120", stdout=out)
    call_command("reaudit_fanout", "--day", DAY.isoformat(), stdout=out)

    night = FanOut.objects.get(day=DAY)
    assert (night.window_seconds, night.pages) == (120, 3)
    first, second = out.getvalue().splitlines()
    assert first.startswith(f"Placed 3 page(s) for {DAY} over 120 s")
    assert second.startswith(f"{DAY} already has a fan-out (3 page(s) over 120 s")
    assert "placed nothing new" in second


def test_migrating_creates_the_nightly_fan_out_and_removes_the_old_catch_up(settings):
    # The migration's own function: transactional tests flush the rows migrations made.
    migration = importlib.import_module("reaudit.migrations.0002_beat_entries")
    migration.delete_entries(apps, None)
    settings.REAUDIT_HOUR = 5

    migration.create_entries(apps, None)
    PeriodicTask.objects.filter(task="reaudit.catch_up").update(enabled=False)  # an admin's edit
    migration.create_entries(apps, None)  # migrating again keeps the entries as edited

    fan_out = PeriodicTask.objects.get(task="reaudit.fan_out")
    assert (fan_out.enabled, fan_out.queue) == (True, "reaudit")
    assert (fan_out.crontab.minute, fan_out.crontab.hour, fan_out.crontab.day_of_week) == (
        "0",
        "5",
        "*",
    )
    assert str(fan_out.crontab.timezone) == "UTC"
    catch_up = PeriodicTask.objects.get(task="reaudit.catch_up")
    assert (catch_up.enabled, catch_up.queue) == (False, "reaudit")
    assert (catch_up.interval.every, catch_up.interval.period) == (60, "seconds")
    assert catch_up.expire_seconds == 60
    # The reconciler (jobs.reconcile) does what the catch-up did: its entry goes.
    importlib.import_module("reaudit.migrations.0005_catch_up_entry_removed").delete_catch_up(
        apps, None
    )
    assert list(PeriodicTask.objects.filter(task__startswith="reaudit.").values_list(
        "task", flat=True)) == ["reaudit.fan_out"]  # fmt: skip
    migration.delete_entries(apps, None)
    assert not PeriodicTask.objects.filter(task__startswith="reaudit.").exists()


def load_settings(**env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env={**os.environ, "DEBUG": "true", **env},
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    ("visibility_timeout", "slice_seconds", "refused"),
    [("600", "600", True), ("300", "600", True), ("601", "600", False)],
)
def test_a_visibility_timeout_not_above_the_slice_refuses_to_start(
    visibility_timeout, slice_seconds, refused
):
    loaded = load_settings(
        REAUDIT_VISIBILITY_TIMEOUT_SECONDS=visibility_timeout,
        REAUDIT_SLICE_SECONDS=slice_seconds,
    )
    assert (loaded.returncode != 0) == refused, loaded.stderr
    if refused:
        assert "ImproperlyConfigured" in loaded.stderr
        assert "must exceed REAUDIT_SLICE_SECONDS" in loaded.stderr


def test_a_reaudit_hour_outside_the_day_refuses_to_start():
    loaded = load_settings(REAUDIT_HOUR="24")
    assert loaded.returncode != 0
    assert "REAUDIT_HOUR must be an hour of the day (0-23), got 24" in loaded.stderr


def test_the_admin_shows_a_nights_progress_and_its_placements(redis_client, admin_client):
    pages = make_pages({domain_due_between(0, 200, window=WINDOW): 2, "b.test": 2})
    night = run_fan_out().fan_out
    services.publish_slice(DAY, 0, night.window_start, night_tasks=NIGHT_TASKS)
    services.fire_placement(pages[0].id, DAY)

    nights = admin_client.get("/admin/reaudit/fanout/")
    placements = admin_client.get(f"/admin/reaudit/placement/?fan_out__id__exact={night.id}")
    fired = Placement.objects.get(page=pages[0])
    detail = admin_client.get(f"/admin/reaudit/placement/{fired.id}/change/")

    assert nights.status_code == placements.status_code == detail.status_code == 200
    row = nights.content.decode()
    assert '<td class="field-scheduled">3</td>' in row
    assert f'<td class="field-slices_published">1 / {WINDOW // SLICE}</td>' in row
    listed = placements.content.decode()
    assert all(page.url.replace("&", "&amp;") in listed for page in pages)
    assert services.placement_key(pages[0].id, DAY) in detail.content.decode()


def test_a_fan_out_beat_sent_whose_message_was_lost_is_sent_again_once(redis_client):
    # Beat sent tonight's fan-out (it records the send in PostgreSQL) and the message died
    # with Redis before a reaudit worker ran it: no night exists.
    # The entry as the migration makes it (a transactional test elsewhere may have
    # flushed the migration's rows).
    PeriodicTask.objects.filter(task="reaudit.fan_out").delete()
    sent_at = timezone.now() - timedelta(minutes=20)
    PeriodicTask.objects.create(
        name="reaudit: nightly fan-out",
        task="reaudit.fan_out",
        crontab=CrontabSchedule.objects.create(minute="0", hour="0"),
        queue="reaudit",
        last_run_at=sent_at,
    )
    day = timezone.localdate(sent_at)

    first = reconciled_now(overdue_after=600)
    assert first.republished.get("reaudit_fan_outs") == 1
    assert [m.task for m in queued(redis_client, "reaudit")] == ["reaudit.fan_out"]

    # Not again every tick while the night is still missing ...
    reconciled_now(overdue_after=600)
    assert [m.task for m in queued(redis_client, "reaudit")] == ["reaudit.fan_out"]
    # ... and nothing once the night exists.
    services.fan_out(day, night_tasks=NIGHT_TASKS, window_seconds=WINDOW)
    redis_client.flushdb()
    assert reconciled_now(overdue_after=600).republished.get("reaudit_fan_outs") is None
