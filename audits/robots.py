"""Each origin's robots.txt, read once per freshness window and shared by every worker.

One `RobotsTxt` row per origin (`outbound.urls.origin_key`). A link check (or an
audit's robots checks) finding it stale claims it with a conditional update, as a
shared link's check is claimed: the one worker whose update took the row fetches the
file inline (`outbound.integrations.robots`, under the host's link-check slots, rate and
admission), stores it and lets the claim go; the others requesting nothing meanwhile
(a link check is deferred like a check whose host is busy; an audit waits for the
file a little, then goes without). Inline rather than a job of its own: the fetch is
one small request under the same slots as the check that needed it, and a claim that
expires (a worker killed mid-fetch) is taken again by the next check, so nothing needs
a reconciler (DECISIONS.md, "robots.txt before link checks").
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import connections, router
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from audits.models import RobotsTxt
from jobs.errors import RateLimited
from jobs.sql import fetch_one
from outbound.guard import TargetNotAllowed
from outbound.integrations import robots
from outbound.integrations.links import LinkVerdict
from outbound.integrations.robots import RobotsInfo
from outbound.urls import InvalidURL, origin_key
from ratelimit.admission import admit
from ratelimit.observations import DEFAULT_RESOURCE, host_key

# The bucket resource a check waiting on another worker's fetch names.
ROBOTS_RESOURCE = "robots"
# How often an audit waiting on another worker's fetch looks again.
POLL_SECONDS = 0.1
# A check deferred behind another worker's fetch runs again this soon (or when the claim
# ends, if sooner): a fetch takes a round trip, or ends at once when the host's bucket is
# closed; waiting out the whole claim would hold a host's checks 15 s for nothing.
BUSY_RETRY_SECONDS = 1.0


class Busy(Exception):
    """Another worker is reading the origin's robots.txt until `until` (epoch seconds)."""

    def __init__(self, until: float):
        self.until = until


def claim_seconds() -> float:
    """A claim outlives any fetch (whose every hop and wait is within the fetch timeout)."""
    return settings.AUDIT_FETCH_TIMEOUT_SECONDS + 5


# The files this process read last, by origin, with the `fetched_at` they were read at (as
# the database returns it): a host's links are checked one after the other, every audit
# reads its page's origin's, and a file may be 500 KiB.
_recent: dict[str, tuple[object, RobotsInfo]] = {}
RECENT_MAX = 1024

# When the origin's stored file was read, if it was (and is fresh, with the second):
# written once, as the audit's own statements are (audits.models), because every audit
# asks it and Django compiling the filter cost more than running it (DECISIONS.md,
# "robots.txt's freshness is one statement written once").
_ROBOTS = RobotsTxt._meta
_ROBOTS_READ_SQL = (
    f'SELECT "fetched_at" FROM "{_ROBOTS.db_table}" WHERE "origin" = %s AND "availability" <> \'\''
)
_ROBOTS_FRESH_SQL = _ROBOTS_READ_SQL + ' AND "fresh_until" > %s'
# The file itself, as read at that `fetched_at`: nothing when it was read again meanwhile.
_ROBOTS_FILE_SQL = (
    'SELECT "status_code", "body", "availability", "truncated", "error" '
    f'FROM "{_ROBOTS.db_table}" WHERE "origin" = %s AND "fetched_at" = %s'
)


def stored(origin: str, *, fresh_only: bool = True) -> RobotsInfo | None:
    """The origin's robots.txt as stored, if it was ever read (and is fresh, by default)."""
    connection = connections[router.db_for_read(RobotsTxt)]
    if fresh_only:
        now = _ROBOTS.get_field("fresh_until").get_db_prep_value(timezone.now(), connection)
        read = fetch_one(connection, _ROBOTS_FRESH_SQL, [origin, now])
    else:
        read = fetch_one(connection, _ROBOTS_READ_SQL, [origin])
    if read is None or read[0] is None:
        return None
    fetched_at = read[0]
    recent = _recent.get(origin)
    if recent is not None and recent[0] == fetched_at:
        return recent[1]
    row = fetch_one(connection, _ROBOTS_FILE_SQL, [origin, fetched_at])
    if row is None:
        return None  # read again meanwhile: the caller claims or waits
    status_code, body, availability, truncated, error = row
    info = RobotsInfo(
        url=robots.robots_url(origin),
        status_code=status_code,
        body=body,
        availability=availability,
        truncated=bool(truncated),  # SQLite answers 0 or 1
        error=error,
    )
    if len(_recent) >= RECENT_MAX:
        _recent.clear()
    _recent[origin] = (fetched_at, info)
    return info


def current(origin: str) -> RobotsInfo | None:
    """The origin's fresh robots.txt, read now if it is stale and nobody else is reading it.

    None: the guard refuses the origin (nothing there is fetched anyway). Raises Busy
    (another worker's claim) and RateLimited (the host's slots or bucket say wait).
    """
    info = stored(origin)
    if info is not None:
        return info
    # A host whose bucket is closed past an inline wait is asked nothing: refused here, as
    # the fetch would be, before a claim that every other check of the host would meet.
    admission = admit(host_key(origin), DEFAULT_RESOURCE)
    if not admission.go and admission.wait_seconds() > settings.RATELIMIT_INLINE_MAX_WAIT_SECONDS:
        raise RateLimited(host_key(origin), DEFAULT_RESOURCE, admission.until, reason="admission")
    now = timezone.now()
    if not RobotsTxt.objects.filter(origin=origin).exists():
        RobotsTxt.objects.bulk_create([RobotsTxt(origin=origin)], ignore_conflicts=True)
    token = uuid.uuid4().hex
    claimed = (
        RobotsTxt.objects.filter(origin=origin)
        .filter(Q(fresh_until__isnull=True) | Q(fresh_until__lte=now))
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lte=now))
        .update(claim_token=token, claimed_until=now + timedelta(seconds=claim_seconds()))
    )
    if not claimed:
        info = stored(origin)  # read by another worker in between
        if info is not None:
            return info
        until = (
            RobotsTxt.objects.filter(origin=origin).values_list("claimed_until", flat=True).first()
        )
        raise Busy(until.timestamp() if until else time.time() + claim_seconds())
    mine = RobotsTxt.objects.filter(origin=origin, claim_token=token)
    # Let go unread, the row stays stale; a row never read gets a time it went stale
    # from, so it ages out like any other (audits.retention walks `fresh_until`).
    let_go = {
        "claim_token": "",
        "claimed_until": None,
        "fresh_until": Coalesce(F("fresh_until"), Value(now)),
    }
    try:
        info = robots.fetch_robots(origin)
    except TargetNotAllowed:
        mine.update(**let_go)
        return None
    except BaseException:
        mine.update(**let_go)
        raise
    fetched_at = timezone.now()
    mine.update(
        availability=info.availability,
        status_code=info.status_code,
        body=info.body,
        truncated=info.truncated,
        error=info.error[:2000],
        crawl_delay=robots.crawl_delay(info, settings.AUDIT_USER_AGENT),
        fetched_at=fetched_at,
        fresh_until=fetched_at + timedelta(seconds=info.fresh_seconds),
        claim_token="",
        claimed_until=None,
    )
    return info


def link_verdict(url: str) -> LinkVerdict | None:
    """Whether a link check may request `url`, and its origin's Crawl-delay.

    None: no verdict (a URL with no origin, or one the guard refuses): the check goes on
    and says what it finds. Raises RateLimited while another worker reads the file or the
    host says wait, so the check is deferred without an attempt spent.
    """
    try:
        origin = origin_key(url)
    except InvalidURL:
        return None
    try:
        info = current(origin)
    except Busy as busy:
        raise RateLimited(
            host_key(origin),
            ROBOTS_RESOURCE,
            min(busy.until, time.time() + BUSY_RETRY_SECONDS),
            reason=f"{robots.robots_url(origin)} is being read by another worker",
        ) from None
    if info is None:
        return None
    return robots.verdict(info, url, settings.AUDIT_USER_AGENT)


def robots_for(url: str, *, wait_seconds: float | None = None) -> RobotsInfo | None:
    """The robots.txt of `url`'s origin, for an audit's `robots-txt` and `is-crawlable`
    checks: the stored copy while fresh, else read now under the host's link-check
    politeness (never gating the audit itself).

    None when it cannot be known now: the guard refuses the origin, the host's bucket is
    closed, or another worker's read did not end within `wait_seconds` (default: the
    claim's length) and there is no earlier copy.
    """
    try:
        origin = origin_key(url)
    except InvalidURL:
        return None
    deadline = time.monotonic() + (claim_seconds() if wait_seconds is None else wait_seconds)
    while True:
        try:
            return current(origin)
        except RateLimited:
            return stored(origin, fresh_only=False)
        except Busy:
            if time.monotonic() >= deadline:
                return stored(origin, fresh_only=False)
            time.sleep(POLL_SECONDS)
