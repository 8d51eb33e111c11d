"""Log in to a running Plumb as staff and photograph its dashboard in headless Chromium.

Used by the browser test, `bench/dashboard_screenshot.py` and `bench/retry_storm.py`. Needs the
dev extra (playwright) and Debian's chromium; Playwright's own browser downloads are never used.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # the dev extra is not installed: missing_browser() says so
    sync_playwright = None

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def missing_browser() -> str | None:
    """Why a screenshot cannot be taken here, or None if it can."""
    if sync_playwright is None:
        return "the playwright package is not installed (pip install '.[dev]')"
    if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
        return f"no chromium at {CHROMIUM} (Debian: apt-get install chromium)"
    return None


@contextmanager
def dashboard_page(base_url: str, username: str, password: str, *, width: int = 1280):
    """A logged-in browser page showing `base_url`/dashboard/."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
            args=CHROMIUM_ARGS,
        )
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(f"{base_url.rstrip('/')}/admin/login/?next=/dashboard/")
            page.fill("#id_username", username)
            page.fill("#id_password", password)
            with page.expect_navigation():
                page.click("input[type=submit]")
            if not urlsplit(page.url).path.endswith("/dashboard/"):
                raise RuntimeError(f"login as {username!r} did not reach the dashboard: {page.url}")
            yield page
        finally:
            browser.close()


def screenshot(page, out: Path, *, selector: str | None = None, rows: int | None = None) -> Path:
    """The whole page, only the element `selector` (e.g. the first row: `.row`), or the
    page from its top down to the end of its first `rows` rows of plots."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if selector:
        page.locator(selector).first.screenshot(path=str(out))
    elif rows:
        last = page.locator("section.row").nth(rows - 1).bounding_box()
        width = page.viewport_size["width"]
        bottom = last["y"] + last["height"] + 16
        page.screenshot(
            path=str(out), full_page=True, clip={"x": 0, "y": 0, "width": width, "height": bottom}
        )
    else:
        page.screenshot(path=str(out), full_page=True)
    return out
