"""What the audits app lets go of: audits past AUDIT_RETENTION_DAYS and link-check rows
past LINK_CHECK_RETENTION_DAYS (jobs.retention prunes them).

An audit is kept, whatever its age, while it is unfinished, and while it is its page's
latest succeeded audit: the page's next success compares with it (audits.changes,
`AuditQuerySet._previous_success`). A link-check row is the working copy of one check:
once its audit finishes, `result["links"]` holds what it found, so the rows can go
sooner than the audit, and go with it when the audit goes.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Exists, OuterRef, Q, QuerySet

from audits.models import Audit, LinkCheck
from jobs.retention import PrunableKind


def aged_out_audits(cutoff: datetime) -> QuerySet:
    """Finished audits created before `cutoff`, but never a page's latest success.

    "Latest" as the finish reads it, by `finished_at`: a success goes only once a later
    success of its page exists (one probe of audit_page_success_idx); two successes
    finished at the same instant both stay.
    """
    later_success = Audit.objects.filter(
        page_id=OuterRef("page_id"),
        status=Audit.Status.SUCCEEDED,
        finished_at__gt=OuterRef("finished_at"),
    )
    return Audit.objects.filter(created_at__lt=cutoff, status__in=Audit.FINISHED).filter(
        Q(status=Audit.Status.FAILED) | Exists(later_success)
    )


def aged_out_link_checks(cutoff: datetime) -> QuerySet:
    """Link-check rows created before `cutoff` whose audit has finished."""
    return LinkCheck.objects.filter(created_at__lt=cutoff, audit__status__in=Audit.FINISHED)


KINDS = [
    PrunableKind(
        name="link_checks",
        horizon_setting="LINK_CHECK_RETENTION_DAYS",
        aged_out=aged_out_link_checks,
        walk=("created_at", "id"),
        description="link-check rows of finished audits, whose result keeps them",
    ),
    PrunableKind(
        name="audits",
        horizon_setting="AUDIT_RETENTION_DAYS",
        aged_out=aged_out_audits,
        walk=("created_at", "id"),
        description="finished audits, except each page's latest success",
    ),
]
