"""Pages and nights for the re-audit tests."""

from __future__ import annotations

from datetime import date, timedelta

from audits.models import Page
from reaudit.models import FanOut, Placement
from reaudit.offsets import domain_offset

DAY = date(2030, 1, 15)


def make_pages(
    counts: dict[str, int], *, base_url: str = "http://127.0.0.1:9", marked: bool = True
) -> list[Page]:
    """`counts[domain]` pages for each domain, all pointing at `base_url` (distinct queries)."""
    pages = [
        Page(url=f"{base_url}/?d={domain}&p={n}", domain=domain, reaudit_nightly=marked)
        for domain, count in counts.items()
        for n in range(count)
    ]
    return Page.objects.bulk_create(pages)


def domain_due_between(low: float, high: float, *, window: float, day: date = DAY) -> str:
    """A domain name whose offset on `day` falls in [low, high): pins a test's timing."""
    for n in range(10_000_000):
        name = f"d{n}.test"
        if low <= domain_offset(name, day, window) < high:
            return name
    raise AssertionError("no domain found")


def due_at(placement: Placement, night: FanOut):
    """When a placement is due if no slice runs late."""
    return night.window_start + timedelta(seconds=placement.offset_seconds)
