"""Pages as the API shows them: listing, history, settings and removal.

A removed page keeps its audits (their ids were handed out, and each stays readable by
its id); it leaves the listing, is no longer re-audited nightly and loses its page
callback. Submitting its URL again brings it back (audits.submission).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import BooleanField, Prefetch, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from audits.findings import CHECK_IDS
from audits.models import Audit, Page

log = logging.getLogger(__name__)

_LATEST_AUDIT = Prefetch(
    "audits",
    queryset=Audit.objects.order_by("-created_at", "-id")[:1],
    to_attr="latest_audits",
)


def listed(
    user,
    *,
    domain: str | None = None,
    reaudit_nightly: str | None = None,
    changed_since: datetime | None = None,
) -> QuerySet[Page]:
    """The current pages `user` may read (its own; staff, all), by URL, each with its
    newest audit prefetched."""
    pages = (
        Page.objects.current()
        .readable_by(user)
        .prefetch_related(_LATEST_AUDIT)
        .order_by("url", "id")
    )
    if domain is not None:
        pages = pages.filter(domain=domain.strip().lower())
    if reaudit_nightly is not None:
        pages = pages.filter(reaudit_nightly=reaudit_nightly == "true")
    if changed_since is not None:
        pages = pages.filter(last_changed_at__gte=changed_since)
    return pages


def readable(user, public_id) -> Page | None:
    """The current page of that public id if `user` may read it; None for a page that is
    not there and one that is not theirs alike, so the answer says nothing of others'."""
    return Page.objects.current().readable_by(user).filter(public_id=public_id).first()


def audits_listed(user, **filters) -> QuerySet[Audit]:
    """The audits `user` lists, newest first: those it submitted and those of its pages
    (their nightly re-audits, others' audits of them); staff, all.

    A union of the two, each read through its own index (the submitter's, the page's),
    so a client's listing costs its own audits, not the table's.
    """
    audits = Audit.objects.select_related("page").filter(**filters)
    if not user.is_staff:
        audits = audits.order_by()  # the union is ordered, never its parts (SQLite refuses)
        submitted = audits.filter(submitter=user)
        its_pages = Page.objects.filter(owner=user).values("id")
        others_of_its_pages = audits.filter(page__in=its_pages).exclude(submitter=user)
        audits = submitted.union(others_of_its_pages, all=True)
    return audits.order_by("-created_at", "-id")


def with_latest_audit(page: Page) -> Page:
    return Page.objects.prefetch_related(_LATEST_AUDIT).get(id=page.id)


def history(page: Page) -> QuerySet[Audit]:
    """The page's audits, newest first."""
    return page.audits.select_related("page").order_by("-created_at", "-id")


def update(page: Page, **fields) -> Page:
    """Apply validated settings: `reaudit_nightly`, and the page callback as a pair
    (`callback_url` and `callback_secret`, both None to remove it)."""
    changed = {}
    if "reaudit_nightly" in fields:
        changed["reaudit_nightly"] = fields["reaudit_nightly"]
    if "callback_url" in fields:
        changed["callback_url"] = fields["callback_url"] or ""
        changed["callback_secret"] = fields["callback_secret"] or ""
    if changed:
        Page.objects.current().filter(id=page.id).update(**changed)
        log.info(
            "page.updated",
            extra={
                "page_id": str(page.public_id),
                "fields": sorted(changed),
                "callback": bool(changed.get("callback_url", page.callback_url)),
            },
        )
    return with_latest_audit(page)


def remove(page: Page) -> bool:
    """Stop re-auditing the page and forget its callback; its audits stay."""
    removed = (
        Page.objects.current()
        .filter(id=page.id)
        .update(
            removed_at=timezone.now(), reaudit_nightly=False, callback_url="", callback_secret=""
        )
    )
    if removed:
        log.info("page.removed", extra={"page_id": str(page.public_id)})
    return bool(removed)


def change_counts(*, now: datetime | None = None) -> dict[str, int]:
    """Pages an audit found changed in the last day, and how many of them got worse
    (audits.changes.got_worse): the dashboard's headline and two gauges in /metrics."""
    since = (now or timezone.now()) - timedelta(days=1)
    current = Page.objects.current()
    return {
        "pages_changed": current.filter(last_changed_at__gte=since).count(),
        "pages_worse": current.filter(last_worse_at__gte=since).count(),
    }


def failing(pages: QuerySet[Page], check_id: str) -> QuerySet[Page]:
    """Those of `pages` whose latest succeeded audit fails `check_id` (Page.failing_checks):
    the admin's filter. Django has no JSON `contains` on SQLite, so there it is a
    membership test over json_each."""
    if connection.vendor == "postgresql":
        return pages.filter(failing_checks__contains=[check_id])
    member = RawSQL(
        f"EXISTS (SELECT 1 FROM json_each({Page._meta.db_table}.failing_checks) WHERE value = %s)",
        [check_id],
        output_field=BooleanField(),
    )
    return pages.alias(fails_check=member).filter(fails_check=True)


def failing_check_counts() -> list[tuple[str, int]]:
    """Current pages whose latest succeeded audit fails each check (Page.failing_checks),
    every check listed, most failed first: the dashboard's table. One grouped scan of the
    pages that fail something."""
    table = Page._meta.db_table
    if connection.vendor == "postgresql":
        sql = (
            f"SELECT check_id, count(*) FROM {table}, "
            f"jsonb_array_elements_text({table}.failing_checks) AS check_id "
            f"WHERE {table}.removed_at IS NULL AND {table}.failing_checks <> '[]'::jsonb "
            "GROUP BY check_id"
        )
    else:
        sql = (
            f"SELECT each.value, count(*) FROM {table}, json_each({table}.failing_checks) AS each "
            f"WHERE {table}.removed_at IS NULL GROUP BY each.value"
        )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        counts = dict(cursor.fetchall())
    return sorted(
        ((check, int(counts.get(check, 0))) for check in CHECK_IDS),
        key=lambda row: (-row[1], CHECK_IDS.index(row[0])),
    )
