"""Creating audits: a submission from the API, or a nightly re-audit's placement.

The row is written first and the message published on commit, so a worker never
receives an id it cannot see yet; a row whose publish failed stays `queued` with
its task id, for the reconciler to publish again.
"""

from __future__ import annotations

import functools
import uuid

from django.conf import settings
from django.db import IntegrityError, connections, router, transaction

from audits.admission import HOLDING_CTES, client_holding, client_share, holding_params
from audits.models import Audit, Page
from audits.tasks import enqueue_audit
from jobs.sql import column, column_converters, converted, fetch_one
from outbound.urls import NormalizedURL

PAGE_FIELDS = Page._meta.concrete_fields
PAGE_WRITTEN_FIELDS = [field for field in PAGE_FIELDS if not field.primary_key]
PAGE_ATTNAMES = [field.attname for field in PAGE_FIELDS]
AUDIT_FIELDS = Audit._meta.concrete_fields


def _columns(fields) -> str:
    return ", ".join(f'"{field.column}"' for field in fields)


# The page's upsert, written once from the model (as the client's holding is, audits.
# admission): INSERT ... ON CONFLICT (url) DO UPDATE ... RETURNING every column. A new page
# is written as given; an existing one (or one a racing submission just created) comes
# back as stored, its domain following its URL; a page removed through the API comes back
# as a new page would, with the choice and owner of this submission, in the same statement
# and under the same row lock as the conflict (its previous owner let it go).
_P = f'"{Page._meta.db_table}"'
_REMOVED = f"{_P}.{column(Page, 'removed_at')} IS NOT NULL"


def _given_if_removed(field_name: str) -> str:
    name = column(Page, field_name)
    return f"{name} = CASE WHEN {_REMOVED} THEN EXCLUDED.{name} ELSE {_P}.{name} END"


_PAGE_INSERT = f"INSERT INTO {_P} ({_columns(PAGE_WRITTEN_FIELDS)}) "
_PAGE_ON_CONFLICT = (
    f"ON CONFLICT ({column(Page, 'url')}) DO UPDATE SET "
    f"{column(Page, 'domain')} = EXCLUDED.{column(Page, 'domain')}, "
    f"{_given_if_removed('reaudit_nightly')}, {_given_if_removed('owner')}, "
    f"{column(Page, 'removed_at')} = NULL "
    f"RETURNING {', '.join(f'{_P}.{column(Page, field.name)}' for field in PAGE_FIELDS)}"
)
PAGE_UPSERT_SQL = (
    f"{_PAGE_INSERT}VALUES ({', '.join(['%s'] * len(PAGE_WRITTEN_FIELDS))}) {_PAGE_ON_CONFLICT}"
)
_A = f'"{Audit._meta.db_table}"'


class ClientShareHeld(Exception):
    """The submitting client holds its share of the backlog (audits.admission.client_share)
    or more: nothing was written."""

    def __init__(self, held: int):
        super().__init__(f"the client holds {held} of the backlog, its share")
        self.held = held


def _typed(field, connection) -> str:
    """`field`'s parameter in a SELECT list, which has no column to take its type from (a
    VALUES list does): cast to the column's type. Text goes as it is: a cast to varchar(n)
    would cut it short, where the column refuses it whole."""
    if field.get_internal_type() in ("CharField", "TextField"):
        return "%s"
    return f"CAST(%s AS {field.db_type(connection)})"


@functools.cache
def page_and_audit_sql(vendor: str) -> str:
    """A submission on PostgreSQL: the client's holding, the page's upsert and the audit's
    insert in one statement, atomic on its own in autocommit (data-modifying CTEs run once,
    whether read or not), so no BEGIN and no COMMIT either. The page and the audit are
    inserted only while the client holds less than its share (audits.admission.HOLDING_CTES,
    the system's own work "" holding nothing), and the statement answers with what the
    client held and, if inserted, the page. The audit's page id is the upsert's answer; the
    page comes back only with the audit inserted. Written on first use from the columns'
    types on the database that runs it."""
    connection = connections[router.db_for_write(Audit)]
    assert connection.vendor == vendor == "postgresql"
    page_values = ", ".join(_typed(field, connection) for field in PAGE_WRITTEN_FIELDS)
    audit_values = ", ".join(
        f"page.{column(Page, 'id')}" if field.name == "page" else _typed(field, connection)
        for field in AUDIT_FIELDS
    )
    return (
        f"WITH {HOLDING_CTES[vendor]}, "
        f"page AS ({_PAGE_INSERT}SELECT {page_values} FROM held WHERE held.entries < %s "
        f"{_PAGE_ON_CONFLICT}), "
        f"audit AS (INSERT INTO {_A} ({_columns(AUDIT_FIELDS)}) SELECT {audit_values} FROM page "
        f"RETURNING {_A}.{column(Audit, 'id')}) "
        f"SELECT held.entries, page.* FROM held LEFT JOIN (page CROSS JOIN audit) ON TRUE"
    )


def get_or_create_page(target: NormalizedURL, *, reaudit_nightly: bool = False, owner=None) -> Page:
    """The page of `target`, created if new: one upsert that returns the row as it is.

    A new page is written as given, an existing one (or one another submission created
    meanwhile) comes back as stored, in the one statement where a lookup, an insert and
    a re-read took three (DECISIONS.md, "A submission's page is one upsert"). A page
    removed through the API comes back (with its history) as a new page would: listed,
    re-audited as `reaudit_nightly` says, owned by `owner`: its previous owner let it
    go. An existing page keeps its choice and its owner (None: anonymous, staff's).
    """
    connection = connections[router.db_for_write(Page)]
    written = _new_page(target, reaudit_nightly=reaudit_nightly, owner=owner)
    with connection.cursor() as cursor:
        cursor.execute(PAGE_UPSERT_SQL, _page_values(written, connection))
        return _page_from_row(cursor.fetchone(), connection)


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
    finishes: a client holding its share of the backlog (admission.client_share) or more
    gets ClientShareHeld, and nothing is written.

    On PostgreSQL the holding, the page and the audit are one statement
    (page_and_audit_sql). SQLite has no data-modifying CTE, and its statements are calls
    within this process, not round trips: the holding's read, the page's upsert and the
    audit's insert, in one transaction.
    """
    reaudit_nightly = trusted and settings.REAUDIT_NEW_PAGES
    audit_fields = {"callback_url": callback_url, "callback_secret": callback_secret,
                    "submitter": submitter, "client": client}  # fmt: skip
    connection = connections[router.db_for_write(Audit)]
    if connection.vendor != "postgresql":
        with transaction.atomic(using=connection.alias):
            held = client_holding(client)
            if held >= client_share():
                raise ClientShareHeld(held)
            page = get_or_create_page(target, reaudit_nightly=reaudit_nightly, owner=submitter)
            audit, _ = create_and_enqueue_audit(
                page, trigger=Audit.Trigger.SUBMITTED, **audit_fields
            )
        return audit
    share = client_share()
    written = _new_page(target, reaudit_nightly=reaudit_nightly, owner=submitter)
    audit = _queued_audit(written, trigger=Audit.Trigger.SUBMITTED, **audit_fields)
    values = [
        *holding_params(client, share), *_page_values(written, connection), share,
        *_audit_values(audit, connection),
    ]  # fmt: skip
    # Prepared: planning it cost more than running it (DECISIONS.md, "A submission on
    # PostgreSQL is one statement").
    held, *page_row = fetch_one(connection, page_and_audit_sql(connection.vendor), values)
    if page_row[0] is None:
        raise ClientShareHeld(min(held, share))
    audit.page = _page_from_row(page_row, connection)
    audit._state.adding, audit._state.db = False, connection.alias
    # In autocommit the statement was its own transaction, so this publishes now; inside
    # a caller's transaction, once that commits.
    transaction.on_commit(lambda: enqueue_audit(audit), using=connection.alias)
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
    audit = _queued_audit(
        page,
        trigger=trigger,
        idempotency_key=idempotency_key,
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


def _new_page(target: NormalizedURL, *, reaudit_nightly: bool, owner) -> Page:
    return Page(url=target.url, domain=target.domain, reaudit_nightly=reaudit_nightly,
                owner=owner)  # fmt: skip


def _queued_audit(page: Page, *, trigger: str, **fields) -> Audit:
    """A queued audit of `page`, not saved: a new task id, the rest as given."""
    return Audit(page=page, trigger=trigger, task_id=str(uuid.uuid4()), **fields)


def _page_values(page: Page, connection) -> list:
    """The parameters of PAGE_UPSERT_SQL, prepared as Django's insert prepares them."""
    return [
        field.get_db_prep_save(field.pre_save(page, add=True), connection)
        for field in PAGE_WRITTEN_FIELDS
    ]


def _audit_values(audit: Audit, connection) -> list:
    """The parameters of page_and_audit_sql's audit: every column but its page's id."""
    return [
        field.get_db_prep_save(field.pre_save(audit, add=True), connection)
        for field in AUDIT_FIELDS
        if field.name != "page"
    ]


def _page_from_row(row, connection) -> Page:
    """The page as the upsert returned it, each value converted as a query's would be."""
    values = converted(row, _page_converters(connection.alias), connection)
    return Page.from_db(connection.alias, PAGE_ATTNAMES, values)


@functools.cache
def _page_converters(alias: str) -> tuple:
    """The converters of the page's columns on the database `alias`, found once, as a
    job's statements keep theirs (jobs.lifecycle): they follow from the fields and the
    backend, and finding them at every call took 35 us of a submission's CPU."""
    connection = connections[alias]
    return tuple(column_converters(field.get_col(Page._meta.db_table), connection)
                 for field in PAGE_FIELDS)  # fmt: skip
