"""GET /metrics (Prometheus), GET /api/stats (JSON series), /dashboard/ (plots, staff only)."""

from __future__ import annotations

import hmac
import logging

import redis
from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from observability import dashboard as plots
from observability import gauges
from observability.collector import exposition
from observability.sampler import sample_once
from observability.series import WINDOWS, stats

log = logging.getLogger(__name__)


def operator_may_read(request: HttpRequest) -> bool:
    """Open unless METRICS_BEARER_TOKEN is set; then that token, or a staff session."""
    token = settings.METRICS_BEARER_TOKEN
    if not token:
        return True
    if request.user.is_authenticated and request.user.is_staff:
        return True
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    return hmac.compare_digest(given.encode(), token.encode())


def _forbidden() -> JsonResponse:
    return JsonResponse(
        {"error": "forbidden", "detail": "Send Authorization: Bearer <METRICS_BEARER_TOKEN>."},
        status=403,
    )


def _redis_away(view: str, exc: redis.RedisError) -> JsonResponse:
    """The totals live in Redis: while it is away the scrape fails with a 503 the scraper
    retries, not a 500 (bench/outages.py found one a scrape every 2 s of a Redis outage)."""
    log.warning("metrics.unavailable", extra={"view": view, "error": exc.__class__.__name__})
    response = JsonResponse(
        {"error": "metrics_unavailable", "detail": "Redis, which keeps the metrics, is away."},
        status=503,
    )
    response["Retry-After"] = "5"
    return response


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not operator_may_read(request):
        return _forbidden()
    try:
        body = exposition()
    except redis.RedisError as exc:
        return _redis_away("metrics", exc)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)


@require_GET
def api_stats(request: HttpRequest) -> JsonResponse:
    if not operator_may_read(request):
        return _forbidden()
    window = request.GET.get("window", "1h")
    if window not in WINDOWS:
        return JsonResponse(
            {"error": "invalid_request", "fields": {"window": [f"One of {', '.join(WINDOWS)}."]}},
            status=400,
        )
    try:
        sample_once()
        return JsonResponse(stats(window))
    except redis.RedisError as exc:
        return _redis_away("api_stats", exc)


def dead_letter_admin_url() -> str:
    """Where an operator reviews (and replays) dead letters."""
    return reverse("admin:jobs_deadletter_changelist")


def worse_audits_admin_url() -> str:
    """Where an operator reads the audits that found a page worse, newest first."""
    return reverse("admin:audits_audit_changelist") + "?got_worse__exact=1"


def page_changes() -> dict[str, int] | None:
    """Pages changed in the last day and how many got worse (the `audits` app's reading);
    None, shown as a dash, when it cannot be read."""
    try:
        return gauges.read("page_changes")
    except Exception:
        log.exception("dashboard.page_changes_unavailable")
        return None


def pages_failing() -> list[tuple[str, int]] | None:
    """Current pages failing each SEO check (the `audits` app's report); None, shown as a
    dash, when it cannot be read."""
    try:
        return gauges.read_report("pages_failing")
    except Exception:
        log.exception("dashboard.pages_failing_unavailable")
        return None


def failing_pages_admin_url() -> str:
    """Where an operator reads the pages (their latest audits fail the check in the query)."""
    return reverse("admin:audits_page_changelist")


@staff_member_required
@require_GET
def dashboard(request: HttpRequest) -> HttpResponse:
    sample_once()
    windows = [stats(name) for name in WINDOWS]
    hour = windows[0]
    return render(
        request,
        "observability/dashboard.html",
        {
            "rows": plots.rows(windows),
            "hour": hour,
            "windows": [WINDOWS[w["window"]] for w in windows],
            "dead_letters_all_time": hour["dead_letters_all_time"],
            "dead_letter_admin_url": dead_letter_admin_url(),
            "page_changes": page_changes(),
            "worse_audits_admin_url": worse_audits_admin_url(),
            "pages_failing": pages_failing(),
            "failing_pages_admin_url": failing_pages_admin_url(),
        },
    )
