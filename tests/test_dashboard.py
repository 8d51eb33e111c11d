"""GET /api/stats (the per-minute series) and /dashboard/ (the same series as SVG plots)."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from audits import admission
from audits.models import Audit, Page
from observability import metrics
from observability.charts import Series, line_chart
from observability.sampler import sample_once
from observability.series import stats
from tests.test_metrics import scrape

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]

NOW = 1_800_000_000.0 - 1_800_000_000.0 % 3600 + 30  # half a minute into an hour


def storm(now: float) -> None:
    """One minute of a retry storm: 2 jobs, 8 attempts, 8 downstream requests, 1 completion."""
    for job in ("a", "b"):
        metrics.record_task_attempt("audits.run_audit", first=True, job_id=job, now=now)
        for _ in range(3):
            metrics.record_task_attempt("audits.run_audit", first=False, job_id=job, now=now)
            metrics.record_retry("audits.run_audit", "error", now=now)
    for _ in range(8):
        metrics.record_downstream_request("host", 503, "transient_status", 0.1, now=now)
    metrics.record_completion("audits.run_audit", now=now)


def test_the_hour_has_one_point_per_minute_with_retries_apart_from_completions(redis_client):
    storm(NOW - 120)
    metrics.record_task_attempt("audits.run_audit", first=True, job_id="c", now=NOW)
    metrics.record_downstream_request("host", 200, "ok", 0.1, now=NOW)
    metrics.record_completion("audits.run_audit", now=NOW)

    hour = stats("1h", now=NOW)
    assert hour["step_seconds"] == 60 and len(hour["t"]) == 60
    assert hour["t"][-1] == NOW - 30
    series = hour["series"]
    assert series["completions"][-3:] == [1, 0, 1]
    assert series["retry_attempts"][-3:] == [6, 0, 0]
    assert series["retries_scheduled"]["error"][-3:] == [6, 0, 0]
    assert series["downstream_requests"][-3:] == [8, 0, 1]
    assert series["unique_jobs"][-3:] == [2, 0, 1]
    assert series["amplification"][-3:] == [4.0, None, 1.0]
    totals = hour["totals"]
    assert (totals["downstream_requests"], totals["unique_jobs"], totals["amplification"]) == (
        9,
        3,
        3.0,
    )


def test_the_day_is_shown_in_ten_minute_steps_counting_each_job_once_per_step(redis_client):
    # Minutes 3 and 4 of the hour: the same ten-minute step (steps follow the clock).
    storm(NOW + 180)
    # The same two jobs retried in the next minute: still two jobs in the step.
    storm(NOW + 240)
    day = stats("1d", now=NOW + 300)
    assert day["step_seconds"] == 600
    assert 144 <= len(day["t"]) <= 145
    assert day["series"]["retry_attempts"][-1] == 12
    assert day["series"]["unique_jobs"][-1] == 2
    assert day["series"]["amplification"][-1] == 8.0


def test_a_gauge_sample_is_taken_once_a_minute_and_missing_minutes_stay_empty(redis_client):
    assert sample_once(now=NOW) is True
    assert sample_once(now=NOW + 5) is False  # another process already took this minute
    backlog = stats("1h", now=NOW)["series"]["backlog"]
    assert backlog["waiting"][-1] == 0 and backlog["retrying"][-1] == 0
    assert backlog["waiting"][-2] is None  # no sample: no point, not a fake zero


def test_admissions_and_refusals_are_series_with_those_made_during_backoff(redis_client, settings):
    settings.AUDIT_QUEUE_MAX_DEPTH = 1
    assert admission.admit_submission("192.0.2.1").admitted
    redis_client.hset("unacked:audits", "in-backoff", "m")  # an audit waiting to retry
    assert not admission.admit_submission("192.0.2.1").admitted
    assert not admission.admit_submission("192.0.2.2").admitted
    hour = stats("1h")
    assert hour["series"]["admissions"]["refused_backlog"][-1] == 2
    assert hour["totals"]["admissions_in_backoff"] == {
        "admitted": 0,
        "refused_ip": 0,
        "refused_client": 0,
        "refused_backlog": 2,
    }


def test_stats_rejects_an_unknown_window(client, redis_client):
    response = client.get("/api/stats?window=1y")
    assert response.status_code == 400
    assert "window" in response.json()["fields"]


def test_stats_returns_the_series_as_json(client, redis_client):
    storm(time.time())
    body = client.get("/api/stats?window=1h").json()
    assert body["window"] == "1h"
    assert body["totals"]["retry_attempts"] == 6
    assert body["totals"]["amplification"] == 4.0
    assert len(body["series"]["completions"]) == len(body["t"])


def test_the_dashboard_needs_a_staff_login(client, redis_client):
    response = client.get("/dashboard/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    user = get_user_model().objects.create_user("viewer", password="pw-not-staff")
    client.force_login(user)
    assert client.get("/dashboard/").status_code == 302


def test_the_dashboard_plots_retries_vs_completions_first_then_amplification(client, redis_client):
    storm(time.time())
    staff = get_user_model().objects.create_user("ops", password="pw", is_staff=True)
    client.force_login(staff)
    response = client.get("/dashboard/")
    assert response.status_code == 200
    html = response.content.decode()
    charts = re.findall(r'<svg class="chart" data-chart="([\w-]+)"', html)
    assert charts[:4] == ["work-1h", "work-1d", "amplification-1h", "amplification-1d"]
    assert set(charts) == {
        f"{row}-{window}"
        for row in ("work", "amplification", "backlog", "admissions", "breakers", "dead_letters")
        for window in ("1h", "1d")
    }
    first_chart = html[html.index('data-chart="work-1h"') : html.index("</svg>")]
    assert 'data-series="completions"' in first_chart
    assert 'data-series="retry_attempts"' in first_chart
    assert re.search(r'data-total="amplification">4(\.0)?×', html)
    assert 'href="/admin/jobs/deadletter/"' in html


def test_a_missing_value_breaks_the_line_instead_of_drawing_zero():
    svg = line_chart("c", "t", [0, 60, 120, 180], [Series("s", "S", [1, 2, None, 3], "#000")])
    assert svg.count("<polyline") == 1  # the first two points
    assert svg.count("<circle") == 1  # the lone last point


def finished_with(page: Page, result: dict, *, at, monkeypatch) -> None:
    """An audit of `page` finished at `at`, as a worker finishes it."""
    audit = Audit.objects.create(page=page, task_id=f"{page.id}-{at.timestamp()}")
    with monkeypatch.context() as patch:
        patch.setattr(timezone, "now", lambda: at)
        Audit.objects.finish(audit.id, status=Audit.Status.SUCCEEDED, result=result)


def test_the_dashboard_counts_pages_changed_in_the_last_day_and_those_that_got_worse(
    client, redis_client, monkeypatch
):
    now = timezone.now()
    worse, better, stale, removed, worse_then_better = (
        Page.objects.create(url=f"https://example.org/{name}", domain="example.org")
        for name in ("worse", "better", "stale", "removed", "worse-then-better")
    )
    ok = {"status_code": 200, "title": "a"}
    for page, results in (
        (worse, [(ok, 5), ({"status_code": 500, "title": "a"}, 3)]),
        (better, [(ok, 5), ({"status_code": 200, "title": "b"}, 1)]),
        (stale, [(ok, 72), ({"status_code": 500, "title": "a"}, 48)]),  # before the last day
        (removed, [(ok, 5), ({"status_code": 404, "title": "a"}, 2)]),
        # Worse within the day, then changed again without getting worse: still worse today.
        (worse_then_better, [(ok, 5), ({"status_code": 500}, 4), ({"status_code": 500}, 3),
                             ({"status_code": 500, "title": "c"}, 1)]),
    ):  # fmt: skip
        for result, hours_ago in results:
            finished_with(
                page, result, at=now - timedelta(hours=hours_ago), monkeypatch=monkeypatch
            )
    Page.objects.filter(id=removed.id).update(removed_at=now)

    client.force_login(get_user_model().objects.create_user("ops", password="pw", is_staff=True))
    html = client.get("/dashboard/").content.decode()
    assert 'data-total="pages_changed">3<' in html
    assert 'data-total="pages_worse">2<' in html
    assert 'href="/admin/audits/audit/?got_worse__exact=1"' in html
    samples = scrape()
    assert samples[("plumb_pages_changed", ())] == 3
    assert samples[("plumb_pages_worse", ())] == 2


def test_the_dashboard_counts_current_pages_failing_each_check(client, redis_client, monkeypatch):
    from audits.findings import CHECK_IDS, finding

    def findings(*failing):
        return [finding(check, "fail" if check in failing else "pass") for check in CHECK_IDS]

    now = timezone.now()
    one, two, fixed, removed = (
        Page.objects.create(url=f"https://example.org/{name}", domain="example.org")
        for name in ("one", "two", "fixed", "removed")
    )
    for page, runs in (
        (one, [findings("canonical", "image-alt")]),
        (two, [findings(), findings("canonical")]),  # started failing
        (fixed, [findings("canonical"), findings()]),  # stopped failing
        (removed, [findings("canonical")]),
    ):
        for hours_ago, run in zip(range(len(runs), 0, -1), runs, strict=True):
            finished_with(
                page, {"status_code": 200, "findings": run}, at=now - timedelta(hours=hours_ago),
                monkeypatch=monkeypatch,
            )  # fmt: skip
    Page.objects.filter(id=removed.id).update(removed_at=now)

    client.force_login(get_user_model().objects.create_user("ops", password="pw", is_staff=True))
    html = client.get("/dashboard/").content.decode()
    assert re.search(r'data-failing="canonical"><a href="[^"]*\?failing_check=canonical">2<', html)
    assert (
        'data-failing="image-alt"><a href="/admin/audits/page/?failing_check=image-alt">1<' in html
    )
    assert 'data-failing="viewport"><a href="/admin/audits/page/?failing_check=viewport">0<' in html
    admin = get_user_model().objects.create_superuser("root", password="pw")
    client.force_login(admin)
    listed = client.get("/admin/audits/page/?failing_check=canonical").content.decode()
    assert "example.org/one" in listed and "example.org/two" in listed
    assert "example.org/fixed" not in listed
