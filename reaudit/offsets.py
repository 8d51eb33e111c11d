"""Where in the night each page is re-audited: deterministic offsets, no random calls.

A domain's offset is a hash of the domain and the day, so domains spread over the
window, a domain moves from night to night, and a re-run of the same night's fan-out
computes the same offsets. A domain's pages follow its offset one spacing apart (in
page-id order), so a site never gets a burst.
"""

from __future__ import annotations

import hashlib
import math
from datetime import date

_HASH_SPAN = 2**64


def domain_offset(domain: str, day: date, window_seconds: float) -> float:
    """Seconds into the window at which `domain`'s first page is due on `day`."""
    digest = hashlib.sha256(f"{day.isoformat()}|{domain}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / _HASH_SPAN * window_seconds


def page_offset(
    first_offset: float, rank: int, *, spacing_seconds: float, window_seconds: float
) -> float:
    """Offset of a domain's page number `rank` (0 for its first page).

    A domain with more pages than fit in the window at this spacing wraps round
    to the start of the window, and then gets up to one page per lap in each
    spacing interval instead of one. That is accepted: the night stays one window long.
    """
    return (first_offset + rank * spacing_seconds) % window_seconds


def slice_count(window_seconds: float, slice_seconds: float) -> int:
    return max(1, math.ceil(window_seconds / slice_seconds))


def slice_of(offset: float, slice_seconds: float, slices: int) -> int:
    # min(): a float offset a hair below the window must not land past the last slice.
    return min(int(offset // slice_seconds), slices - 1)
