"""What the audits app lets go of: audits past AUDIT_RETENTION_DAYS, and link-check rows
and distinct links not checked within LINK_CHECK_RETENTION_DAYS (jobs.retention prunes
them).

An audit is kept, whatever its age, while it is unfinished, and while it is its page's
latest succeeded audit: the page's next success compares with it (audits.changes,
`AuditQuerySet._previous_success`). A link-check row is the working copy of one check:
once its audit finishes, `result["links"]` holds what it found, so the rows can go
sooner than the audit, and go with it when the audit goes.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Exists, OuterRef, Q, QuerySet

from audits.models import Audit, LinkCheck, SharedLink
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
        name="audits",
        horizon_setting="AUDIT_RETENTION_DAYS",
        old_enough=audits_created_before,
        walk=("created_at", "id"),
        may_go=audits_that_may_go,
        description="finished audits, except each page's latest success",
    ),
]
