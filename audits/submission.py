"""Creating audits: a submission from the API, or a nightly re-audit's placement.

The row is written first and the message published on commit, so a worker never
receives an id it cannot see yet; a row whose publish failed stays `queued` with
its task id, for the reconciler to publish again.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import IntegrityError, router, transaction
from django.db.models.constants import OnConflict

from audits.models import Audit, Page
from audits.tasks import enqueue_audit
from outbound.urls import NormalizedURL

PAGE_FIELDS = Page._meta.concrete_fields
PAGE_WRITTEN_FIELDS = [field for field in PAGE_FIELDS if not field.primary_key]


def get_or_create_page(target: NormalizedURL, *, reaudit_nightly: bool = False, owner=None) -> Page:
    """The page of `target`, created if new: one upsert that returns the row as it is.

    INSERT ... ON CONFLICT (url) DO UPDATE ... RETURNING every column: a new page is
    written as given, an existing one (or one another submission created meanwhile)
    comes back as stored, in the one statement where a lookup, an insert and a re-read
    took three (DECISIONS.md, "A submission's page is one upsert"). A page removed
    through the API comes back (with its history) as a new page would: listed,
    re-audited as `reaudit_nightly` says, owned by `owner`: its previous owner let it
    go. An existing page keeps its choice and its owner (None: anonymous, staff's).
    """
    written = Page(url=target.url, domain=target.domain, reaudit_nightly=reaudit_nightly,
                   owner=owner)  # fmt: skip
    # On a conflict the row keeps everything but its domain, which follows from the URL.
    (values,) = Page.objects._insert(
        [written], fields=PAGE_WRITTEN_FIELDS, returning_fields=PAGE_FIELDS,
        on_conflict=OnConflict.UPDATE, update_fields=[Page._meta.get_field("domain")],
        unique_fields=[Page._meta.get_field("url")],
    )  # fmt: skip
    page = Page.from_db(router.db_for_write(Page), [f.attname for f in PAGE_FIELDS], values)
    if page.removed_at is not None:
        Page.objects.filter(id=page.id, removed_at__isnull=False).update(
            removed_at=None, reaudit_nightly=reaudit_nightly, owner=owner
        )
        page.refresh_from_db()
    return page


def submit_audit(
    target: NormalizedURL,
    *,
    callback_url: str = "",
    callback_secret: str = "",
    trusted: bool = False,
    submitter=None,
    client: str = "",
) -> Audit:
    """Create the page (if new) and a queued audit, and enqueue it once committed.

    With a callback URL the finished audit is POSTed there (webhooks app). A new page
    joins the nightly re-audit only when a `trusted` caller (a staff user, an API token)
    submitted it and REAUDIT_NEW_PAGES is on: anyone may submit, and an anonymous
    submission's cost ends with its audit. The `submitter` (a user, None when anonymous)
    owns a page it creates, and is the only one ever shown the audit's callback URL.
    `client` (audits.admission.client_key) is who the audit counts against until it
    finishes.
    """
    with transaction.atomic():
        page = get_or_create_page(
            target, reaudit_nightly=trusted and settings.REAUDIT_NEW_PAGES, owner=submitter
        )
        audit, _ = create_and_enqueue_audit(
            page,
            trigger=Audit.Trigger.SUBMITTED,
            callback_url=callback_url,
            callback_secret=callback_secret,
            submitter=submitter,
            client=client,
        )
    return audit


def create_and_enqueue_audit(
    page: Page,
    *,
    trigger: str,
    idempotency_key: str | None = None,
    callback_url: str = "",
    callback_secret: str = "",
    submitter=None,
    client: str = "",
) -> tuple[Audit, bool]:
    """Create a queued audit of `page` and enqueue it on commit; (audit, created).

    With an `idempotency_key` a second call creates nothing and enqueues nothing:
    the unique constraint turns the second insert into a lookup of the first
    audit, even when two callers race.
    """
    audit = Audit(
        page=page,
        trigger=trigger,
        idempotency_key=idempotency_key,
        task_id=str(uuid.uuid4()),
        callback_url=callback_url,
        callback_secret=callback_secret,
        submitter=submitter,
        client=client,
    )
    if idempotency_key is None:
        audit.save(force_insert=True)  # nothing to collide with: no savepoint
    else:
        try:
            with transaction.atomic():
                audit.save(force_insert=True)
        except IntegrityError:
            return Audit.objects.get(idempotency_key=idempotency_key), False
    transaction.on_commit(lambda: enqueue_audit(audit))
    return audit, True
