"""Photograph a running Plumb's dashboard: for BENCHMARKS.md, after a benchmark has run.

    .venv/bin/python bench/dashboard_screenshot.py --url http://127.0.0.1:8000 \\
        --username admin --password '...' --out bench/results/dashboard.png

Logs in through the admin login page as a staff user and saves a PNG of the whole
dashboard, or of one element (`--selector '.row'` is the first row: completions vs
retry attempts, last hour and last day). Needs the dev extra (playwright) and
Debian's chromium (`apt-get install chromium`); starts nothing else.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.screenshot import dashboard_page, missing_browser, screenshot  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the web process")
    parser.add_argument("--username", default="admin", help="a staff user")
    parser.add_argument("--password", required=True)
    parser.add_argument("--out", type=Path, default=ROOT / "test-output" / "dashboard.png")
    parser.add_argument("--selector", help="CSS selector of one element to photograph")
    parser.add_argument("--width", type=int, default=1280, help="viewport width in pixels")
    args = parser.parse_args()

    reason = missing_browser()
    if reason:
        print(f"cannot take a screenshot: {reason}", file=sys.stderr)
        return 2
    try:
        with dashboard_page(args.url, args.username, args.password, width=args.width) as page:
            saved = screenshot(page, args.out, selector=args.selector)
    except RuntimeError as exc:
        print(f"cannot take a screenshot: {exc}", file=sys.stderr)
        return 1
    print(f"saved {saved}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
