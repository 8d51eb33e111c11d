"""What the audits app lets go of: audits past AUDIT_RETENTION_DAYS, link-check rows
and distinct links not checked within LINK_CHECK_RETENTION_DAYS, and origins' robots.txt
files stale for ROBOTS_RETENTION_WINDOWS freshness windows (jobs.retention
prunes them).

An audit is kept, whatever its age, while it is unfinished, and while it is its page's
latest succeeded audit: the page's next success compares with it (audits.changes,
`AuditQuerySet._previous_success`). A link-check row is the working copy of one check:
once its audit finishes, `result["links"]` holds what it found, so the rows can go
sooner than the audit, and go with it when the audit goes.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from audits.models import Audit, LinkCheck, RobotsTxt, SharedLink
from jobs.retention import PrunableKind


def audits_created_before(cutoff: datetime) -> QuerySet:
    return Audit.objects.filter(created_at__lt=cutoff)


def audits_that_may_go(audits: QuerySet) -> QuerySet:
    """The finished ones, but never a page's latest success.

    "Latest" as the finish reads it, by `finished_at`: a success goes only once a later
    success of its page exists (one probe of audit_page_success_idx); two successes
    finished at the same instant both stay.
    """
    later_success = Audit.objects.filter(
        page_id=OuterRef("page_id"),
        status=Audit.Status.SUCCEEDED,
        finished_at__gt=OuterRef("finished_at"),
    )
    return audits.filter(status__in=Audit.FINISHED).filter(
        Q(status=Audit.Status.FAILED) | Exists(later_success)
    )


def link_checks_created_before(cutoff: datetime) -> QuerySet:
    return LinkCheck.objects.filter(created_at__lt=cutoff)


UNFINISHED = [status for status in Audit.Status if status not in Audit.FINISHED]


def link_checks_that_may_go(link_checks: QuerySet) -> QuerySet:
    """Those whose audit has finished. Asked as "no unfinished audit", which reads the few
    unfinished audits by their status index, not every finished one (a hash of them all,
    for each batch, on a table not analyzed since the night)."""
    unfinished_audit = Audit.objects.filter(id=OuterRef("audit_id"), status__in=UNFINISHED)
    return link_checks.exclude(Exists(unfinished_audit))


def shared_links_checked_before(cutoff: datetime) -> QuerySet:
    return SharedLink.objects.filter(checked_at__lt=cutoff)


def shared_links_that_may_go(links: QuerySet) -> QuerySet:
    """Those no check is in flight for and no audit waits on: a link seen again later is
    simply checked again (its outcome was long stale)."""
    waiting = LinkCheck.objects.filter(link_id=OuterRef("pk"), status__in=LinkCheck.UNFINISHED)
    return links.filter(check_status=SharedLink.CheckStatus.IDLE).exclude(Exists(waiting))


# A robots.txt row goes once it has been stale this many freshness windows
# (ROBOTS_FRESH_SECONDS): a week by default after its last read, no check of its origin
# having needed it since. Losing it costs nothing a stale row would not: the next check
# of the origin reads the file again either way; only the last copy that an audit falls
# back on while the host's bucket is closed goes, and a week-old copy is a poor one.
ROBOTS_RETENTION_WINDOWS = 6
# ...and never sooner than a day after it went stale, whatever the window.
ROBOTS_RETENTION_MIN_DAYS = 1.0


def robots_retention_days(fresh_seconds: float) -> float:
    return max(ROBOTS_RETENTION_WINDOWS * fresh_seconds / 86400, ROBOTS_RETENTION_MIN_DAYS)


def robots_txt_stale_before(cutoff: datetime) -> QuerySet:
    return RobotsTxt.objects.filter(fresh_until__lt=cutoff)


def robots_txt_that_may_go(rows: QuerySet) -> QuerySet:
    """Not one a worker is reading right now (its update would find no row, and the next
    check would read the file a second time)."""
    return rows.exclude(claimed_until__gt=timezone.now())


KINDS = [
    PrunableKind(
        name="link_checks",
        horizon_setting="LINK_CHECK_RETENTION_DAYS",
        old_enough=link_checks_created_before,
        walk=("created_at", "id"),
        may_go=link_checks_that_may_go,
        description="link-check rows of finished audits, whose result keeps them",
    ),
    PrunableKind(
        name="shared_links",
        horizon_setting="LINK_CHECK_RETENTION_DAYS",
        old_enough=shared_links_checked_before,
        walk=("checked_at", "id"),
        may_go=shared_links_that_may_go,
        description="distinct links not checked since, with nothing waiting on them",
    ),
    PrunableKind(
        name="robots_txt",
        horizon_setting="ROBOTS_FRESH_SECONDS",
        horizon=robots_retention_days,
        old_enough=robots_txt_stale_before,
        walk=("fresh_until", "id"),
        may_go=robots_txt_that_may_go,
        description="origins' robots.txt files stale for six freshness windows (a week)",
    ),
    PrunableKind(
        name="audits",
        horizon_setting="AUDIT_RETENTION_DAYS",
        old_enough=audits_created_before,
        walk=("created_at", "id"),
        may_go=audits_that_may_go,
        description="finished audits, except each page's latest success",
    ),
]
