"""Retention: what `manage.py prune` and the daily jobs.prune delete, and what they keep.

The one test that runs a worker asks for the module's shared reaudit worker."""

from __future__ import annotations

import io
import time
from datetime import timedelta

import pytest
from celery.schedules import crontab
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from audits.models import Audit, LinkCheck, Page, RobotsTxt, SharedLink
from jobs import retention
from jobs.models import DeadLetter
from ratelimit.observations import RateLimitObservation
from reaudit.models import FanOut, Placement, SliceRun
from tests.workers import module_worker, wait_for
from webhooks.models import Delivery

pytestmark = pytest.mark.django_db

NOW = timezone.now()
OLD = NOW - timedelta(days=200)

reaudit_worker = module_worker("reaudit")


def make_page(name: str = "a") -> Page:
    return Page.objects.create(url=f"https://{name}.test/", domain=f"{name}.test")


def make_audit(page: Page, status: str, *, days_ago: float, result: dict | None = None) -> Audit:
    """An audit created `days_ago` days ago (and finished a minute later, if finished)."""
    created = NOW - timedelta(days=days_ago)
    audit = Audit.objects.create(page=page, status=status, result=result)
    finished = created + timedelta(minutes=1) if status in Audit.FINISHED else None
    Audit.objects.filter(id=audit.id).update(created_at=created, finished_at=finished)
    return Audit.objects.get(id=audit.id)


def make_link_checks(audit: Audit, count: int, *, days_ago: float) -> None:
    LinkCheck.objects.bulk_create(
        LinkCheck(audit=audit, url=f"https://links.test/{n}", status="ok") for n in range(count)
    )
    LinkCheck.objects.filter(audit=audit).update(created_at=NOW - timedelta(days=days_ago))


def prune(name: str, **options) -> retention.Pruned:
    return retention.prune(retention.kind(name), now=NOW, **options)


# --- audits ------------------------------------------------------------------------


def test_aged_out_audits_go_and_each_pages_latest_success_stays():
    page, other = make_page("a"), make_page("b")
    oldest_success = make_audit(page, "succeeded", days_ago=120)
    latest_success = make_audit(page, "succeeded", days_ago=100)  # old, but the latest
    failed = make_audit(page, "failed", days_ago=95)
    queued = make_audit(page, "queued", days_ago=150)
    running = make_audit(page, "running", days_ago=150)
    checking = make_audit(page, "checking_links", days_ago=150)
    recent_failed = make_audit(page, "failed", days_ago=10)
    superseded = make_audit(other, "succeeded", days_ago=91)
    recent_success = make_audit(other, "succeeded", days_ago=1)

    pruned = prune("audits")

    kept = set(Audit.objects.values_list("id", flat=True))
    assert kept == {
        latest_success.id, queued.id, running.id, checking.id, recent_failed.id,
        recent_success.id,
    }  # fmt: skip
    assert {oldest_success.id, failed.id, superseded.id}.isdisjoint(kept)
    assert pruned.deleted == 3


def test_the_next_success_still_compares_with_the_kept_latest_success():
    page = make_page()
    make_audit(page, "succeeded", days_ago=120, result={"status_code": 200, "title": "Old"})
    make_audit(page, "succeeded", days_ago=100, result={"status_code": 200, "title": "Before"})
    prune("audits")
    assert Audit.objects.filter(page=page).count() == 1

    audit = Audit.objects.create(page=page, status="running")
    Audit.objects.finish(audit.id, status="succeeded", result={"status_code": 200, "title": "Now"})

    audit.refresh_from_db()
    assert audit.changes == [{"field": "title", "before": "Before", "after": "Now"}]


def test_an_audit_goes_with_its_link_checks_and_finished_deliveries():
    page = make_page()
    make_audit(page, "succeeded", days_ago=1)
    old = make_audit(page, "succeeded", days_ago=100)
    make_link_checks(old, 3, days_ago=1)  # younger than their horizon: they go with it
    Delivery.objects.create(audit=old, url="https://hooks.test/", status="delivered")

    pruned = prune("audits")

    assert not Audit.objects.filter(id=old.id).exists()
    assert not LinkCheck.objects.exists() and not Delivery.objects.exists()
    assert pruned.cascaded == {"audits.LinkCheck": 3, "webhooks.Delivery": 1}


@pytest.mark.parametrize("status", ["pending", "delivering", "retrying"])
def test_an_audit_still_owed_a_delivery_stays(status):
    page = make_page()
    make_audit(page, "succeeded", days_ago=1)
    owed = make_audit(page, "failed", days_ago=100)
    Delivery.objects.create(audit=owed, url="https://hooks.test/", status=status)

    assert prune("audits").deleted == 0
    assert Audit.objects.filter(id=owed.id).exists()


def test_a_pruned_audit_answers_404_like_any_unknown_id():
    page = make_page()
    kept = make_audit(page, "succeeded", days_ago=100)  # the page's latest success
    old = make_audit(page, "failed", days_ago=100)
    api = APIClient()
    assert api.get(f"/api/audits/{old.id}").status_code == 200
    unknown = api.get("/api/audits/00000000-0000-4000-8000-000000000000")

    prune("audits")

    response = api.get(f"/api/audits/{old.id}")
    assert response.status_code == 404
    assert response.json() == unknown.json()
    assert api.get(f"/api/audits/{kept.id}").status_code == 200


# --- link checks -------------------------------------------------------------------


def test_link_checks_of_finished_audits_go_after_their_own_horizon():
    page = make_page()
    finished = make_audit(page, "succeeded", days_ago=30)
    checking = make_audit(page, "checking_links", days_ago=30)
    recent = make_audit(page, "succeeded", days_ago=2)
    make_link_checks(finished, 4, days_ago=30)
    make_link_checks(checking, 2, days_ago=30)
    make_link_checks(recent, 3, days_ago=2)

    assert prune("link_checks").deleted == 4

    assert set(LinkCheck.objects.values_list("audit_id", flat=True)) == {checking.id, recent.id}
    assert Audit.objects.count() == 3  # the audits keep their result, links included


def test_distinct_links_not_checked_lately_go_unless_a_check_waits_on_them():
    long_ago, lately = NOW - timedelta(days=30), NOW - timedelta(days=2)
    stale = SharedLink.objects.create(url="https://stale.test/", status="ok", checked_at=long_ago)
    fresh = SharedLink.objects.create(url="https://fresh.test/", status="ok", checked_at=lately)
    in_flight = SharedLink.objects.create(
        url="https://in-flight.test/", status="ok", checked_at=long_ago, check_status="running"
    )
    awaited = SharedLink.objects.create(
        url="https://awaited.test/", status="ok", checked_at=long_ago
    )
    checking = make_audit(make_page(), "checking_links", days_ago=0)
    LinkCheck.objects.create(audit=checking, url=awaited.url, link=awaited)

    assert prune("shared_links").deleted == 1

    assert not SharedLink.objects.filter(id=stale.id).exists()
    assert set(SharedLink.objects.values_list("id", flat=True)) == {
        fresh.id, in_flight.id, awaited.id
    }  # fmt: skip


def test_robots_txt_files_go_six_freshness_windows_after_they_went_stale(settings):
    settings.ROBOTS_FRESH_SECONDS = 86400
    assert retention.kind("robots_txt").horizon_days == 6

    def row(origin: str, *, stale_days: float, **fields) -> RobotsTxt:
        return RobotsTxt.objects.create(
            origin=origin, availability="rules", fresh_until=NOW - timedelta(days=stale_days),
            **fields,
        )  # fmt: skip

    gone = row("https://gone.test", stale_days=7)
    kept = row("https://kept.test", stale_days=5)
    being_read = row(
        "https://being-read.test", stale_days=30, claim_token="t",
        claimed_until=timezone.now() + timedelta(seconds=30),
    )  # fmt: skip
    never_read = RobotsTxt.objects.create(origin="https://never-read.test")  # fetched_at empty

    assert prune("robots_txt").deleted == 1

    assert not RobotsTxt.objects.filter(id=gone.id).exists()
    assert set(RobotsTxt.objects.values_list("id", flat=True)) == {
        kept.id, being_read.id, never_read.id
    }  # fmt: skip


def test_the_robots_txt_horizon_follows_the_freshness_window(settings):
    settings.ROBOTS_FRESH_SECONDS = 7 * 86400
    assert retention.kind("robots_txt").horizon_days == 42
    settings.ROBOTS_FRESH_SECONDS = 0  # read every time: a stale copy kept a day still
    assert retention.kind("robots_txt").horizon_days == 1


# --- batches -----------------------------------------------------------------------


def make_dead_letters(count: int, *, replayed_days_ago: float | None) -> None:
    replayed = None if replayed_days_ago is None else NOW - timedelta(days=replayed_days_ago)
    DeadLetter.objects.bulk_create(
        DeadLetter(
            task_name="audits.run_audit",
            reason="failed",
            first_failed_at=OLD,
            last_failed_at=OLD,
            replayed_at=replayed,
        )
        for _ in range(count)
    )


def test_rows_go_in_batches_of_the_batch_size():
    make_dead_letters(25, replayed_days_ago=40)
    make_dead_letters(5, replayed_days_ago=None)  # never replayed: still owed
    make_dead_letters(5, replayed_days_ago=2)

    pruned = prune("dead_letters", batch_size=10)

    assert (pruned.deleted, pruned.batches, pruned.finished) == (25, 3, True)
    assert DeadLetter.objects.count() == 10


def test_a_run_past_its_deadline_stops_between_batches_and_the_next_run_goes_on():
    make_dead_letters(25, replayed_days_ago=40)

    first = prune("dead_letters", batch_size=10, deadline=time.monotonic() - 1)
    assert (first.deleted, first.batches, first.finished) == (10, 1, False)

    second = prune("dead_letters", batch_size=10)
    assert (second.deleted, second.finished) == (15, True)
    assert not DeadLetter.objects.exists()


def test_a_batch_deletes_only_rows_that_still_qualify():
    # A row read into a batch and then needed again (a delivery retried meanwhile) stays:
    # the delete re-applies the kind's conditions to the batch's ids.
    page = make_page()
    make_audit(page, "succeeded", days_ago=1)
    audit = make_audit(page, "failed", days_ago=100)
    rows = retention.aged_out(retention.kind("audits"), NOW)
    assert list(rows.values_list("id", flat=True)) == [audit.id]
    Delivery.objects.create(audit=audit, url="https://hooks.test/", status="retrying")

    assert rows.filter(pk__in=[audit.id]).only("pk").delete()[0] == 0


# --- dead letters of refused deliveries ----------------------------------------------


def make_delivery_dead_letters(
    count: int, *, reason: str, days_ago: float, task_name: str = "webhooks.deliver"
) -> None:
    failed = NOW - timedelta(days=days_ago)
    DeadLetter.objects.bulk_create(
        DeadLetter(task_name=task_name, task_id=f"d{n}", args=[f"delivery-{n}"], reason=reason,
                   first_failed_at=failed, last_failed_at=failed)
        for n in range(count)
    )  # fmt: skip


def test_dead_letters_of_refused_deliveries_age_out_and_others_stay():
    make_delivery_dead_letters(12, reason="failed", days_ago=40)  # a receiver's 4xx
    make_delivery_dead_letters(3, reason="attempts_exhausted", days_ago=40)
    make_delivery_dead_letters(2, reason="failed", days_ago=10)  # within the horizon
    make_delivery_dead_letters(1, reason="malformed", days_ago=40)  # an operator's to read
    make_dead_letters(4, replayed_days_ago=None)  # another task's, never replayed: owed

    pruned = prune("webhook_dead_letters", batch_size=5)

    # Every refused callback was a dead letter kept forever: 22 here, one per audit of a
    # callback that answers 4xx.
    assert (pruned.deleted, pruned.batches, pruned.finished) == (15, 4, True)
    kept = DeadLetter.objects.values_list("task_name", "reason")
    assert sorted(kept) == sorted(
        [("webhooks.deliver", "failed")] * 2
        + [("webhooks.deliver", "malformed")]
        + [("audits.run_audit", "failed")] * 4
    )


def test_the_horizon_of_refused_deliveries_dead_letters_is_its_own_setting(settings):
    make_delivery_dead_letters(2, reason="failed", days_ago=10)
    settings.WEBHOOK_DEAD_LETTER_RETENTION_DAYS = 7
    assert prune("webhook_dead_letters").deleted == 2


# --- the re-audit's nights -----------------------------------------------------------


def make_night(days_ago: int, *, closed: bool, pages: list[Page]) -> FanOut:
    night = FanOut.objects.create(
        day=(NOW - timedelta(days=days_ago)).date(),
        window_start=NOW,
        window_seconds=60,
        slice_seconds=30,
        spacing_seconds=0,
        slice_sizes=[len(pages), 0],
        finished_at=NOW if closed else None,
    )
    Placement.objects.bulk_create(
        Placement(fan_out=night, page=page, offset_seconds=0, slice_index=0) for page in pages
    )
    SliceRun.objects.create(fan_out=night, index=0, planned_at=NOW, starts_at=NOW)
    return night


def test_placements_of_closed_nights_go_in_batches_and_then_the_nights(settings):
    settings.REAUDIT_NIGHT_RETENTION_DAYS = 3
    pages = [make_page(f"p{n}") for n in range(5)]
    old = make_night(5, closed=True, pages=pages)
    still_open = make_night(6, closed=False, pages=pages)
    yesterday = make_night(1, closed=True, pages=pages)
    today = make_night(0, closed=False, pages=pages)

    results = {r.kind: r for r in retention.prune_all(now=NOW, batch_size=2)}

    assert (results["reaudit_placements"].deleted, results["reaudit_placements"].batches) == (5, 3)
    assert set(Placement.objects.values_list("fan_out_id", flat=True)) == {
        still_open.id, yesterday.id, today.id,
    }  # fmt: skip
    # The old night went in the same run, once its placements had; its slice with it.
    assert results["reaudit_nights"].deleted == 1
    assert not SliceRun.objects.filter(fan_out_id=old.id).exists()
    assert results["reaudit_nights"].cascaded == {"reaudit.SliceRun": 1}
    assert set(FanOut.objects.values_list("id", flat=True)) == {
        still_open.id, yesterday.id, today.id,
    }  # fmt: skip


# --- observations ------------------------------------------------------------------


def test_old_rate_limit_observations_go_unless_their_block_still_reaches_past_the_cutoff():
    def observe(days_ago: float, **fields) -> RateLimitObservation:
        return RateLimitObservation.objects.create(
            key="host:a.test", resource="default", observed_at=NOW - timedelta(days=days_ago),
            **fields,
        )  # fmt: skip

    observe(10)
    observe(9, blocked_until=NOW - timedelta(days=9))
    blocked = observe(10, blocked_until=NOW + timedelta(days=1))
    recent = observe(1)

    assert prune("ratelimit_observations").deleted == 2
    assert set(RateLimitObservation.objects.values_list("id", flat=True)) == {
        blocked.id, recent.id,
    }  # fmt: skip


# --- the command and the beat entry --------------------------------------------------


def test_the_dry_run_prints_each_kind_with_its_count_and_deletes_nothing():
    page = make_page()
    make_audit(page, "succeeded", days_ago=1)
    make_audit(page, "failed", days_ago=100)
    make_audit(page, "failed", days_ago=100)
    make_dead_letters(3, replayed_days_ago=40)
    out = io.StringIO()

    call_command("prune", "--dry-run", stdout=out)

    lines = out.getvalue().splitlines()
    counts = {line.split(":")[0]: line for line in lines[:-1]}
    assert set(counts) == {kind.name for kind in retention.kinds()}
    assert counts["audits"].startswith("audits: would delete 2 (")
    assert "AUDIT_RETENTION_DAYS" in counts["audits"]
    assert counts["dead_letters"].startswith("dead_letters: would delete 3 (")
    assert counts["link_checks"].startswith("link_checks: would delete 0 (")
    assert lines[-1] == "5 row(s) would be deleted; nothing was."
    assert Audit.objects.count() == 3 and DeadLetter.objects.count() == 3


def test_the_command_deletes_and_reports_each_kind():
    page = make_page()
    make_audit(page, "succeeded", days_ago=1)
    old = make_audit(page, "failed", days_ago=100)
    make_link_checks(old, 2, days_ago=100)
    out = io.StringIO()

    call_command("prune", "--kind", "audits", stdout=out)

    assert out.getvalue().splitlines() == [
        "audits: deleted 1 in 1 batch(es) (with them: 2 audits.LinkCheck)"
    ]


def test_the_daily_beat_entry_runs_jobs_prune_on_the_reaudit_queue():
    from config.celery_app import app

    app.loader.import_default_modules()
    entry = settings.CELERY_BEAT_SCHEDULE["prune-aged-out-rows"]
    assert entry["task"] == "jobs.prune" and "jobs.prune" in app.tasks
    assert entry["schedule"] == crontab(minute=0, hour=settings.RETENTION_HOUR)
    # Not `audits`: admission weighs that queue's backlog.
    assert entry["options"]["queue"] == settings.REAUDIT_QUEUE
    assert app.tasks["jobs.prune"].queue == settings.REAUDIT_QUEUE


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_beat_entry_prunes_through_a_reaudit_worker(reaudit_worker):
    from config.celery_app import app

    page = make_page()
    make_audit(page, "succeeded", days_ago=1)
    old = make_audit(page, "failed", days_ago=100)

    entry = settings.CELERY_BEAT_SCHEDULE["prune-aged-out-rows"]
    app.send_task(entry["task"], **entry["options"])

    wait_for(
        lambda: not Audit.objects.filter(id=old.id).exists(),
        timeout=30, message="the reaudit worker to prune the old audit",
    )  # fmt: skip
    assert Audit.objects.count() == 1


# --- plans ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "index", "statistics"),
    [
        ("audits", "audits_audit_created_at", "as they are"),
        ("audits", "audits_audit_created_at", "fresh"),
        ("link_checks", "link_check_created_idx", "as they are"),
        ("link_checks", "link_check_created_idx", "fresh"),
        # Not "as they are": unanalyzed, PostgreSQL reads the night's placements by the
        # slice index and sorts them (DECISIONS.md, "Retention").
        ("reaudit_placements", "placement_once_per_night", "fresh"),
        ("webhook_dead_letters", "deadletter_task_failed_idx", "as they are"),
        ("webhook_dead_letters", "deadletter_task_failed_idx", "fresh"),
        ("robots_txt", "robots_txt_fresh_until_idx", "as they are"),
        ("robots_txt", "robots_txt_fresh_until_idx", "fresh"),
    ],
)
def test_each_batch_is_read_by_one_index_range(kind, index, statistics):
    """On tables never analyzed since their rows came (a night's), a batch read with the
    kind's conditions sorted every aged-out row, for each batch; read by its index alone,
    it starts where the last batch ended."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    if connection.vendor != "postgresql":
        pytest.skip("the plans are PostgreSQL's")
    # Enough rows that reading them all is never the cheap plan (a night has millions).
    pages = Page.objects.bulk_create(
        Page(url=f"https://p{n}.test/", domain=f"p{n}.test") for n in range(2000)
    )
    audits = Audit.objects.bulk_create(
        Audit(page=page, status="succeeded", finished_at=OLD)
        for page in pages[:200]
        for _ in range(5)
    )
    LinkCheck.objects.bulk_create(
        LinkCheck(audit=audit, url=f"https://l.test/{n}", status="ok")
        for audit in audits
        for n in range(4)
    )
    with connection.cursor() as cursor:  # a day of rows, each created at its own instant
        for table in ("audits_audit", "audits_linkcheck"):
            cursor.execute(
                f"UPDATE {table} SET created_at = %s + random() * interval '1 day'", [OLD]
            )
    make_night(5, closed=True, pages=pages)
    for task_name in ("webhooks.deliver", "audits.run_audit"):
        make_delivery_dead_letters(1000, reason="failed", days_ago=40, task_name=task_name)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobs_deadletter SET last_failed_at = %s + random() * interval '1 day'", [OLD]
        )
    RobotsTxt.objects.bulk_create(
        RobotsTxt(origin=f"https://r{n}.test", availability="rules", fresh_until=OLD)
        for n in range(2000)
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE audits_robotstxt SET fresh_until = %s + random() * interval '1 day'", [OLD]
        )
    if statistics == "fresh":
        with connection.cursor() as cursor:
            cursor.execute(
                "ANALYZE audits_audit, audits_linkcheck, reaudit_placement, jobs_deadletter, "
                "audits_robotstxt"
            )

    with CaptureQueriesContext(connection) as queries:
        prune(kind, batch_size=100)

    walks = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("SELECT") and " > (" in q["sql"]
    ]
    assert walks, [q["sql"] for q in queries.captured_queries]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + walks[-1])
        chosen = "\n".join(row for (row,) in cursor.fetchall())
    assert index in chosen and "Index Cond" in chosen, chosen
    assert "Seq Scan" not in chosen and "Hash" not in chosen, chosen


def test_a_daily_run_out_of_time_queues_its_continuation_on_the_reaudit_queue(
    settings, redis_client
):
    from jobs.tasks import prune as prune_task

    settings.RETENTION_BATCH_SIZE = 10
    settings.RETENTION_RUN_SECONDS = -1  # out of time after the first batch
    make_dead_letters(25, replayed_days_ago=40)

    prune_task.run()

    assert DeadLetter.objects.count() == 15
    assert redis_client.llen(settings.REAUDIT_QUEUE) == 1
    assert redis_client.llen(settings.AUDIT_QUEUE) == 0
