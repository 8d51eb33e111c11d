"""The dashboard in a real browser after a small run with forced retries.

Headless Debian chromium driven by Playwright, a real worker, the demo site as a
flaky downstream. The screenshot lands in test-output/dashboard.png.
"""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from django.contrib.auth import get_user_model

from audits.models import Audit
from tests.screenshot import dashboard_page, missing_browser, screenshot
from tests.workers import wait_for

pytestmark = pytest.mark.slow

OUTPUT = Path(__file__).resolve().parent.parent / "test-output"


@pytest.fixture
def browser_available():
    reason = missing_browser()
    if reason:
        pytest.skip(f"browser test skipped: {reason}")


def test_the_dashboard_plots_a_run_with_forced_retries(
    browser_available, live_server, site, start_worker
):
    # Breaker off: three failing pages on one host would open it, and its parked
    # retries would change the counts this test pins.
    worker = start_worker(
        "audits", env={"RETRY_BACKOFF_BASE_SECONDS": "0.2", "BREAKER_ENABLED": "false"}
    )
    # Three pages that fail twice before answering, two that answer at once:
    # 5 jobs, 6 retry attempts, 12 downstream requests: 11 for the pages and one robots.txt,
    # read once for their one host (the robots-txt and is-crawlable findings, issue 34).
    urls = [f"{site.base_url}/flaky?key=browser-{i}&fail=2" for i in range(3)]
    # Pages without links, so no link-check tasks join the counts.
    urls += [f"{site.base_url}/no-security-headers", f"{site.base_url}/noindex"]
    for url in urls:
        response = httpx2.post(f"{live_server.url}/api/audits", json={"url": url}, timeout=10)
        assert response.status_code == 202, response.text

    def all_done():
        return Audit.objects.filter(status="succeeded").count() == len(urls)

    wait_for(all_done, timeout=60, message="every audit to succeed", show=[worker])
    # The postrun signal counts a completion just after the row is finished.
    wait_for(
        lambda: (
            httpx2.get(f"{live_server.url}/api/stats", timeout=10).json()["totals"]["completions"]
            == len(urls)
        ),
        timeout=10,
        message="every completion to be counted",
        show=[worker],
    )
    totals = httpx2.get(f"{live_server.url}/api/stats?window=1h", timeout=10).json()["totals"]
    assert (totals["retry_attempts"], totals["downstream_requests"], totals["unique_jobs"]) == (
        6,
        12,
        5,
    )
    assert totals["admissions"]["admitted"] == 5

    get_user_model().objects.create_user("ops", password="dashboard-pw", is_staff=True)
    with dashboard_page(live_server.url, "ops", "dashboard-pw") as page:
        first = page.locator("svg.chart").first
        assert first.get_attribute("data-chart") == "work-1h"
        for series in ("completions", "retry_attempts"):
            drawn = first.locator(f'g[data-series="{series}"] polyline, '
                                  f'g[data-series="{series}"] circle')  # fmt: skip
            assert drawn.count() >= 1, f"{series} is not drawn"
            box = drawn.first.bounding_box()
            assert box is not None and box["width"] > 0
        assert page.locator('[data-total="completions"]').inner_text() == "5"
        assert page.locator('[data-total="retry_attempts"]').inner_text() == "6"
        assert (
            page.locator('[data-total="amplification"]').inner_text() == "2.4×"
        )  # 12 requests for 5 jobs
        amplification = page.locator('svg[data-chart="amplification-1h"]')
        assert amplification.locator('g[data-series="amplification"] > *').count() >= 1
        backlog = page.locator('svg[data-chart="backlog-1h"]')
        for part in ("waiting", "retrying", "scheduled"):
            assert backlog.locator(f'g[data-series="{part}"] > *').count() >= 1, part
        for chart in ("admissions-1h", "breakers-1h", "dead_letters-1h"):
            assert page.locator(f'svg[data-chart="{chart}"]').is_visible()
        saved = screenshot(page, OUTPUT / "dashboard.png")
    assert saved.stat().st_size > 10_000
