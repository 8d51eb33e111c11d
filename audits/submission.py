"""Creating audits: a submission from the API, or a nightly re-audit's placement.

The row is written first and the message published on commit, so a worker never
receives an id it cannot see yet; a row whose publish failed stays `queued` with
its task id, for the reconciler to publish again.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import IntegrityError, transaction

from audits.models import Audit, Page
from audits.tasks import enqueue_audit
from outbound.urls import NormalizedURL


def get_or_create_page(target: NormalizedURL, *, reaudit_nightly: bool | None = None) -> Page:
    """The page of `target`, created if new. A page removed through the API comes back
    (with its history) as a new page would: listed, re-audited as REAUDIT_NEW_PAGES says."""
    if reaudit_nightly is None:
        reaudit_nightly = settings.REAUDIT_NEW_PAGES
    page, created = Page.objects.get_or_create(
        url=target.url, defaults={"domain": target.domain, "reaudit_nightly": reaudit_nightly}
    )
    if not created and page.removed_at is not None:
        Page.objects.filter(id=page.id, removed_at__isnull=False).update(
            removed_at=None, reaudit_nightly=reaudit_nightly
        )
        page.refresh_from_db()
    return page


def submit_audit(
    target: NormalizedURL, *, callback_url: str = "", callback_secret: str = ""
) -> Audit:
    """Create the page (if new) and a queued audit, and enqueue it once committed.

    With a callback URL the finished audit is POSTed there (webhooks app).
    """
    with transaction.atomic():
        page = get_or_create_page(target)
        audit, _ = create_and_enqueue_audit(
            page,
            trigger=Audit.Trigger.SUBMITTED,
            callback_url=callback_url,
            callback_secret=callback_secret,
        )
    return audit


def create_and_enqueue_audit(
    page: Page,
    *,
    trigger: str,
    idempotency_key: str | None = None,
    callback_url: str = "",
    callback_secret: str = "",
) -> tuple[Audit, bool]:
    """Create a queued audit of `page` and enqueue it on commit; (audit, created).

    With an `idempotency_key` a second call creates nothing and enqueues nothing:
    the unique constraint turns the second insert into a lookup of the first
    audit, even when two callers race.
    """
    try:
        with transaction.atomic():
            audit = Audit.objects.create(
                page=page,
                trigger=trigger,
                idempotency_key=idempotency_key,
                task_id=str(uuid.uuid4()),
                callback_url=callback_url,
                callback_secret=callback_secret,
            )
    except IntegrityError:
        if idempotency_key is None:
            raise
        return Audit.objects.get(idempotency_key=idempotency_key), False
    transaction.on_commit(lambda: enqueue_audit(audit))
    return audit, True
