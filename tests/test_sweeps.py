"""Periodic sweeps (jobs.sweeps) are ticks of the workers' own threads: a backlog on the
queue does not hold them back, and one worker an interval runs each."""

from __future__ import annotations

import threading
from datetime import timedelta
from importlib import import_module

import pytest
from django.apps import apps
from django.conf import settings
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from audits import linkcheck, submission
from audits.models import Audit
from jobs import sweeps
from outbound.urls import normalize_url
from tests.workers import wait_for

entry_removed = import_module("audits.migrations.0018_link_check_deadline_entry_removed")


def overdue_audit(site) -> Audit:
    """An audit checking its links whose link-check deadline has passed."""
    page = submission.get_or_create_page(normalize_url(f"{site.base_url}/"))
    return Audit.objects.create(
        page=page, task_id="overdue", status=Audit.Status.CHECKING_LINKS,
        link_checks_deadline=timezone.now() - timedelta(seconds=1),
    )  # fmt: skip


@pytest.mark.slow
def test_an_overdue_audit_is_finished_behind_a_backlog_longer_than_the_sweep_interval(
    site, start_worker, redis_client
):
    # One worker thread, and 20 audits of a page that answers in 2 s ahead of everything:
    # 40 s of backlog, four times the old beat message's 10 s expiry.
    for n in range(20):
        submission.submit_audit(normalize_url(f"{site.base_url}/slow?delay=2&n={n}"))
    worker = start_worker("audits", concurrency=1)
    audit = overdue_audit(site)
    started = timezone.now()

    done = wait_for(
        lambda: (found := Audit.objects.get(id=audit.id)).status == Audit.Status.SUCCEEDED
        and found,
        timeout=25, message="the overdue audit finished by the sweep", show=[worker],
    )  # fmt: skip
    # Within about one sweep interval, while the queue still holds most of its backlog.
    assert (
        timezone.now() - started
    ).total_seconds() < 2 * linkcheck.DEADLINE_SWEEP.interval_seconds
    assert redis_client.llen(settings.AUDIT_QUEUE) >= 5
    assert done.result["link_check"]["deadline_passed"] is True


def test_the_link_check_deadline_is_a_registered_sweep_and_no_beat_entry():
    assert linkcheck.DEADLINE_SWEEP in sweeps.sweeps()
    assert not [
        entry
        for entry in settings.CELERY_BEAT_SCHEDULE.values()
        if entry["task"].startswith("audits.")
    ]


@pytest.fixture
def only_test_sweeps(monkeypatch):
    monkeypatch.setattr(sweeps, "_sweeps", {})


def test_one_worker_an_interval_runs_a_sweep(redis_client, only_test_sweeps):
    runs = []
    lock = threading.Lock()

    def run():
        with lock:
            runs.append(1)

    sweeps.register(sweeps.Sweep(name="test.counting", interval_seconds=60.0, run=run))
    # Eight workers ticking at once, three times each, within one interval.
    ticks = [threading.Thread(target=sweeps.tick, args=(redis_client,)) for _ in range(24)]
    for thread in ticks:
        thread.start()
    for thread in ticks:
        thread.join()
    assert len(runs) == 1
    # Once the interval has passed (its lock lapsed), the next tick runs it again.
    redis_client.delete(f"{sweeps.LOCK_PREFIX}test.counting")
    assert "test.counting" in sweeps.tick(redis_client)
    assert len(runs) == 2


def test_a_sweep_that_fails_does_not_keep_the_others_from_running(redis_client, only_test_sweeps):
    ran = []

    def fail():
        raise RuntimeError("database away")

    sweeps.register(sweeps.Sweep(name="test.failing", interval_seconds=60.0, run=fail))
    sweeps.register(
        sweeps.Sweep(name="test.after", interval_seconds=60.0, run=lambda: ran.append(1))
    )
    assert sweeps.tick(redis_client) == ["test.after"]
    assert ran == [1]


@pytest.mark.django_db
def test_the_upgrade_deletes_the_beat_entry_of_the_removed_task():
    every_ten = IntervalSchedule.objects.create(every=10, period="seconds")
    PeriodicTask.objects.create(
        name="finish-overdue-link-checks", task="audits.finish_overdue_link_checks",
        interval=every_ten, queue="audits", expire_seconds=10,
    )  # fmt: skip
    # Another entry of its own: a transactional test before this one may have flushed
    # the rows the migrations wrote (the nightly fan-out, reaudit 0002).
    PeriodicTask.objects.get_or_create(
        name="nightly-reaudit-fan-out",
        defaults={"task": "reaudit.fan_out", "interval": every_ten, "queue": "reaudit"},
    )
    before = set(PeriodicTask.objects.values_list("name", flat=True))
    entry_removed.delete_entry(apps, None)
    # Only that entry: every other stays.
    after = set(PeriodicTask.objects.values_list("name", flat=True))
    assert before - after == {"finish-overdue-link-checks"}
    assert "nightly-reaudit-fan-out" in after
