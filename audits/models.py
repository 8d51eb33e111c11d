from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from django.conf import settings
from django.db import connections, models, transaction
from django.utils import timezone

from audits import treebuild
from audits.changes import FAILING_CHECKS, compare, failing_checks, got_worse
from audits.secrets import EncryptedSecretField
from audits.signals import audit_finished
from jobs.deadlines import Deadline
from jobs.lifecycle import SQL, Job, Returned
from jobs.models import JobRow
from jobs.sql import fetch_one, pipelines, preparing_cursor

log = logging.getLogger(__name__)


class PageQuerySet(models.QuerySet):
    def current(self) -> PageQuerySet:
        """Pages not removed through the API (a removed page keeps its audits)."""
        return self.filter(removed_at=None)

    def reaudited_nightly(self) -> PageQuerySet:
        return self.current().filter(reaudit_nightly=True)

    def readable_by(self, user) -> PageQuerySet:
        """The pages `user` may read, change and remove: its own; staff, every page."""
        if user is None or not user.is_authenticated:
            return self.none()
        return self if user.is_staff else self.filter(owner=user)


class Page(models.Model):
    """A URL Plumb knows about, stored normalized so each page is one row."""

    # Unique and indexed through Meta: a field's own `unique` or `db_index` makes Django add
    # a second index on PostgreSQL, for LIKE, that nothing reads (DECISIONS.md, "No index
    # for LIKE").
    url = models.CharField(max_length=2048)
    domain = models.CharField(max_length=255)
    # The page's id in every URL and payload: random, so holding one is no hint of another
    # (the integer primary key stays internal: foreign keys, the nightly slices).
    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    # Who created it (a token's user, a staff login): only they, and staff, read, change or
    # remove it through the API. None for an anonymous submission: staff manage those.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Who created the page; empty for an anonymous submission (staff manage it).",
    )
    # Off unless a staff user or an API token chose it (a trusted submission, PATCH, the
    # admin): an anonymous submission must not grow every night's work (DECISIONS.md).
    reaudit_nightly = models.BooleanField(
        default=False, help_text="Audited again every night by the re-audit fan-out."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_changed_at = models.DateTimeField(
        null=True, blank=True, help_text="When an audit last found a change."
    )
    last_worse_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When an audit last found the page worse (audits.changes.got_worse).",
    )
    # The checks (audits.findings ids) its latest succeeded audit fails: the dashboard's
    # pages failing each check, read without opening every audit's result.
    failing_checks = models.JSONField(
        default=list, blank=True, help_text="Checks its latest succeeded audit fails."
    )
    # Where `audit.changed` is POSTed when any audit of this page finds a change (webhooks
    # app), signed with the secret. Write-only like Audit.callback_secret.
    callback_url = models.CharField(max_length=2048, blank=True)
    callback_secret = EncryptedSecretField(blank=True)
    removed_at = models.DateTimeField(
        null=True, blank=True, help_text="Removed through the API: not listed, not re-audited."
    )

    objects = PageQuerySet.as_manager()

    class Meta:
        ordering = ["url"]
        constraints = [models.UniqueConstraint(fields=["url"], name="audits_page_url_key")]
        indexes = [
            models.Index(fields=["domain"], name="audits_page_domain_444f01eb"),
            models.Index(fields=["reaudit_nightly", "id"], name="page_reaudit_idx"),
            # The pages changed (or worse) since a moment: the listing's filter and the
            # dashboard's counts read only the pages found so, whatever the planner's
            # statistics say (DECISIONS.md, "Pages changed and worse are counted"). Only
            # pages with the timestamp: neither index is then a candidate for the other's
            # count, which with no statistics it could be planned as a walk of.
            models.Index(
                fields=["last_changed_at"],
                condition=models.Q(removed_at=None, last_changed_at__isnull=False),
                name="page_changed_idx",
            ),
            models.Index(
                fields=["last_worse_at"],
                condition=models.Q(removed_at=None, last_worse_at__isnull=False),
                name="page_worse_idx",
            ),
        ]

    def __str__(self) -> str:
        return self.url


@dataclass(frozen=True)
class PreviousSuccess:
    """The page's previous succeeded audit as an attempt's claim read it (a nightly
    re-audit's, with conditional re-audits on): its id and its result. NO_PREVIOUS_SUCCESS:
    the claim found the page had none."""

    id: uuid.UUID | None
    result: dict | None


NO_PREVIOUS_SUCCESS = PreviousSuccess(None, None)


class AuditQuerySet(models.QuerySet):
    def finish(
        self,
        audit_id,
        *,
        status: str,
        result: dict | None = None,
        error: str = "",
        previous: PreviousSuccess | None = None,
        owes_callback: bool = False,
    ) -> bool:
        """Record the outcome once: a second finisher (a duplicate delivery) changes nothing.

        A success stores what changed since the page's previous succeeded audit
        (audits.changes), computed here, once, after the link checks. `audit_finished` goes
        out inside the finish's transaction (a callback URL's delivery is owed with it).

        Its statements are written once (below), as the claim's and the job's finish are
        (jobs.lifecycle): a failure is one UPDATE returning what the listeners need; a
        success reads its row and locks its page in one statement, reads the previous
        success in another, then writes (DECISIONS.md, "The audit's own plumbing").

        `previous`: the previous success this attempt's claim read (NO_PREVIOUS_SUCCESS:
        the page had none). The success is then compared with it and written on the
        condition that it is still the page's latest success once the page is locked,
        which saves the read; when another success finished since the claim, the finish
        reads that one and compares with it instead. A success that owes its listeners
        nothing to write (no callback of its own, and no change or no page callback) is
        finished in one round trip, its page's update included (`_finish_in_one_round_trip`).
        `owes_callback`: the caller knows the audit has a callback URL (its claim read it),
        so a success owes a delivery and goes straight to its transaction, without trying
        the round trip whose condition would refuse it.
        """
        finished_at = timezone.now()
        fields = {"result": result, "error": error, "finished_at": finished_at}
        connection = connections[self.db]
        if (
            previous is not None
            and status == Audit.Status.SUCCEEDED
            and not owes_callback
            and pipelines(connection)
            and self._finish_in_one_round_trip(audit_id, fields, previous, connection)
        ):
            return True
        with transaction.atomic(using=self.db):
            page_callback_url = ""  # a failure owes the page's callback nothing
            if status != Audit.Status.SUCCEEDED:
                row = AUDIT_JOB.finish(audit_id, status, returning=("callback_url",), **fields)
                updated = bool(row)
                callback_url = row[0] if row else ""
            else:
                row = self._unfinished_locking_page(audit_id, connection)
                if row is None:
                    return False
                page_id, callback_url, page_callback_url = row
                updated = False
                if previous is not None:
                    # Read after the lock is granted, as the previous success would be.
                    still_previous = SQL(
                        STILL_PREVIOUS_SUCCESS_SQL,
                        (Audit._meta.pk.get_db_prep_value(previous.id, connection),),
                    )
                    page_fields = self._compared(fields, previous.result, result)
                    updated = AUDIT_JOB.finish(audit_id, status, condition=still_previous, **fields)
                if not updated:
                    page_fields = self._compared(
                        fields, self._previous_success(page_id, audit_id, connection), result
                    )
                    # Still conditional: a finisher racing this one since the read changes
                    # nothing.
                    updated = AUDIT_JOB.finish(audit_id, status, **fields)
                if updated and page_fields:
                    _update_page(page_id, page_fields, connection)
            if updated:
                # Inside the finish's transaction: what a listener owes because of it (a
                # webhook delivery's row) commits with the finish or not at all, and it
                # publishes on commit. Sent after the commit, a worker killed in between
                # (or a database that failed over) left a finished audit whose callback
                # was never owed. What the listeners need to know comes with it, so an
                # audit with nothing to deliver costs them no query.
                audit_finished.send(
                    sender=Audit,
                    audit_id=str(audit_id),
                    callback=bool(callback_url),
                    changed=bool(fields.get("changes")),
                    page_callback=bool(page_callback_url),
                )
        if updated:
            _log_finished(audit_id, status, fields)
        return bool(updated)

    def _finish_in_one_round_trip(
        self, audit_id, fields: dict, previous: PreviousSuccess, connection
    ) -> bool:
        """Finish a success compared with `previous` in one round trip: the page's lock, then
        the UPDATE, with the page's own update alongside it in the same statement, on the
        condition that `previous` is still the page's latest success (read after the
        lock, by the UPDATE's own snapshot) and that the listeners owe nothing: the audit
        has no callback, and either nothing changed or the page has no callback. The
        transaction is the pipeline's own. False, having changed nothing, when any of that
        does not hold (the caller then finishes it in a transaction, as any other)."""
        compared = dict(fields)
        page_fields = self._compared(compared, previous.result, fields["result"])
        changed = bool(compared["changes"])
        audit_pk = Audit._meta.pk.get_db_prep_value(audit_id, connection)
        previous_pk = Audit._meta.pk.get_db_prep_value(previous.id, connection)  # None: none
        row = AUDIT_JOB.finish(
            audit_id,
            Audit.Status.SUCCEEDED,
            before=SQL(LOCK_PAGE_OF_AUDIT_SQL, (audit_pk,)),
            condition=SQL(OWES_NOTHING_SQL[changed], (previous_pk,)),
            alongside=_page_update(page_fields, FINISHED_PAGE, connection) if page_fields else None,
            returning=("page__callback_url",),
            **compared,
        )
        if not row:
            return False
        # After the commit: with no callback, and no change or no page callback, no
        # listener owes anything.
        audit_finished.send(
            sender=Audit,
            audit_id=str(audit_id),
            callback=False,
            changed=changed,
            page_callback=bool(row[0]),
        )
        _log_finished(audit_id, Audit.Status.SUCCEEDED, compared)
        return True

    @staticmethod
    def _compared(fields: dict, previous: dict | None, result: dict | None) -> dict:
        """Set a success's `changes` and `got_worse` in `fields`, compared with the page's
        previous success; return what the page's own row must be updated with."""
        finished_at = fields["finished_at"]
        page_fields = {}
        changes = compare(previous, result or {})
        fields.update(changes=changes, got_worse=got_worse(changes))
        if changes:
            page_fields["last_changed_at"] = finished_at
            if fields["got_worse"]:
                page_fields["last_worse_at"] = finished_at
        # The page's failing checks are written only when they may differ from what it
        # holds: its first audit, one before findings, or a change in them.
        if (
            previous is None
            or "findings" not in previous
            or any(change["field"] == FAILING_CHECKS for change in changes or [])
        ):
            page_fields["failing_checks"] = sorted(failing_checks(result or {}))
        return page_fields

    def status_and_url(self, audit_id) -> tuple[str, str] | None:
        """The audit's status and its page's URL (its task's breaker is the page's origin's),
        read by a statement written once: every attempt asks it before it runs."""
        connection = connections[self.db]
        return fetch_one(
            connection, STATUS_AND_URL_SQL, [Audit._meta.pk.get_db_prep_value(audit_id, connection)]
        )

    def _unfinished_locking_page(self, audit_id, connection) -> tuple[int, str, str] | None:
        """The unfinished audit's page, its callback URL and its page's (for the listeners
        of `audit_finished`), the page locked until the finish commits, so two audits of
        one page finishing together compare in turn: the second sees the first as its
        previous (it reads that after the lock is granted).

        SQLite has no row locks and needs none: its transactions (IMMEDIATE, settings)
        take the database's one write lock as they begin, so finishes already run in turn.
        """
        sql = UNFINISHED_LOCKING_PAGE_SQL
        if not connection.features.has_select_for_update:
            sql = UNFINISHED_SQL
        return fetch_one(connection, sql, [Audit._meta.pk.get_db_prep_value(audit_id, connection)])

    def _previous_success(self, page_id: int, audit_id, connection) -> dict | None:
        row = fetch_one(
            connection,
            PREVIOUS_SUCCESS_SQL,
            [page_id, Audit._meta.pk.get_db_prep_value(audit_id, connection)],
        )
        if row is None:
            return None
        return Audit._meta.get_field("result").from_db_value(row[0], None, connection)


def _page_update(page_fields: dict, which: str, connection) -> SQL:
    """A success's update of its page (its dates, its failing checks), written from the
    fields it sets, as the finish's other statements are (an ORM update compiled its
    query on every success), for the page `which` names: a condition on its key."""
    fields = [Page._meta.get_field(name) for name in page_fields]
    assignments = ", ".join(f'"{field.column}" = %s' for field in fields)
    params = tuple(field.get_db_prep_save(page_fields[field.name], connection) for field in fields)
    return SQL(f'UPDATE {_P} SET {assignments} WHERE "{Page._meta.pk.column}" {which}', params)


def _update_page(page_id: int, page_fields: dict, connection) -> None:
    """The page's update inside a finish's transaction."""
    update = _page_update(page_fields, "= %s", connection)
    with preparing_cursor(connection) as cursor:
        cursor.execute(update.sql, [*update.params, page_id])


def _log_finished(audit_id, status: str, fields: dict) -> None:
    log.info(
        "audit.finished",
        extra={
            "audit_id": str(audit_id),
            "status": status,
            "error": fields["error"],
            "changes": None if fields.get("changes") is None else len(fields["changes"]),
        },
    )


class Audit(JobRow):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        RETRYING = "retrying"
        CHECKING_LINKS = "checking_links"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    class Trigger(models.TextChoices):
        SUBMITTED = "submitted"
        REAUDIT = "reaudit"

    FINISHED = (Status.SUCCEEDED, Status.FAILED)
    # Not finished: what a client still holds of the backlog (audits.admission).
    UNFINISHED = (Status.QUEUED, Status.RUNNING, Status.RETRYING, Status.CHECKING_LINKS)

    # Unguessable, so holding an audit's id is what lets a client read it.
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: audit_page_created_idx leads with the page and serves its lookups.
    page = models.ForeignKey(Page, on_delete=models.CASCADE, related_name="audits", db_index=False)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    trigger = models.CharField(max_length=16, choices=Trigger.choices, default=Trigger.SUBMITTED)
    # NULL, not "", when absent: the unique constraint holds keyed audits only.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    # Set when an audit succeeds (audits.changes): None for the page's first success,
    # else the list of changes since its previous succeeded audit.
    changes = models.JSONField(null=True, blank=True)
    got_worse = models.BooleanField(
        default=False, help_text="The changes made the page worse (see DECISIONS.md)."
    )
    error = models.TextField(blank=True)
    link_checks_deadline = models.DateTimeField(
        null=True, blank=True, help_text="The audit finishes by then, reporting unfinished checks."
    )
    # Where the finished audit is POSTed (webhooks app), signed with the secret.
    # The secret is write-only: never in API responses, admin pages or logs.
    callback_url = models.CharField(max_length=2048, blank=True)
    callback_secret = EncryptedSecretField(blank=True)
    # Who submitted it (a token's user, a staff login); None for an anonymous submission
    # and a nightly re-audit. Only the submitter is ever shown its callback URL.
    submitter = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    # Who submitted it (audits.admission.client_key: `user:<pk>` or `ip:<address>`), so
    # its share of the backlog is counted from the record; "" for the system's own work
    # (nightly re-audits), which counts against no client.
    client = models.CharField(max_length=128, blank=True, default="")

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # Only audits with a key (nightly re-audits): a submission has none, and an
            # entry for each would be written on its insert, claim and finish for nothing.
            models.UniqueConstraint(
                fields=["idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="audit_idempotency_key_unique",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "-created_at"], name="audit_status_created_idx"),
            models.Index(fields=["trigger", "-created_at"], name="audit_trigger_created_idx"),
            models.Index(fields=["page", "-created_at"], name="audit_page_created_idx"),
            # A client's own audits, newest first (GET /api/audits): only audits someone
            # submitted, so the nightly re-audits (no submitter) never write it (DECISIONS.md,
            # "The submitter's index holds submitted audits only").
            models.Index(
                fields=["submitter", "-created_at"],
                condition=models.Q(submitter__isnull=False),
                name="audit_submitter_created_idx",
            ),
            # A finish's lookup of the page's previous success: one probe, whatever the
            # planner's statistics say (DECISIONS.md, "An audit's previous success").
            models.Index(
                fields=["page", "-finished_at"],
                condition=models.Q(status="succeeded"),
                name="audit_page_success_idx",
            ),
            # A client's unfinished audits (audits.admission.HOLDING_CTES): one probe on
            # every submission, over the few rows still owed, never the finished history.
            models.Index(
                fields=["client", "status"],
                condition=models.Q(status__in=["queued", "running", "retrying", "checking_links"]),
                name="audit_client_unfinished_idx",
            ),
            # The reconciler's look at what is owed (jobs.lifecycle), never the finished
            # history.
            models.Index(
                fields=["published_at"],
                condition=models.Q(status__in=["queued", "running", "retrying"]),
                name="audit_owed_idx",
            ),
            # The dashboard's count of pages that got worse in the last day.
            models.Index(
                fields=["finished_at"],
                condition=models.Q(got_worse=True),
                name="audit_got_worse_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.page.url} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED


# An audit as a job (jobs.lifecycle). Its attempt fetches and parses the page, bounded by
# the fetch's whole deadline, then a large page's wait for a tree builder and the child's
# own deadline, kill included (audits.treebuild); an audit `checking_links` rests: its
# links' checks are the jobs then, and the last of them (or the link-check deadline)
# finishes it.
AUDIT_JOB = Job(
    name="audits",
    model=Audit,
    task="audits.run_audit",
    queue=settings.AUDIT_QUEUE,
    deadline=Deadline(
        work=settings.AUDIT_FETCH_TIMEOUT_SECONDS
        + settings.AUDIT_TREE_WAIT_SECONDS
        + settings.AUDIT_TREE_SECONDS
        + treebuild.ANSWER_SECONDS
    ),
    queued=Audit.Status.QUEUED,
    running=Audit.Status.RUNNING,
    waiting=Audit.Status.RETRYING,
    done=Audit.FINISHED,
)


def _sql_list(values) -> str:
    return ", ".join(f"'{value}'" for value in values)


# The finish's reads of a success, and the claim's read of the previous success's result,
# written once from the models' tables and columns. The statuses are literals, not
# parameters, so SQLite matches the partial index audit_page_success_idx (a bound
# parameter never matches one).
_A, _P = f'"{Audit._meta.db_table}"', f'"{Page._meta.db_table}"'
_FINISHED = _sql_list(Audit.FINISHED)
UNFINISHED_SQL = (
    f'SELECT {_A}."page_id", {_A}."callback_url", {_P}."callback_url" FROM {_A} '
    f'INNER JOIN {_P} ON {_P}."id" = {_A}."page_id" '
    f'WHERE {_A}."id" = %s AND NOT ({_A}."status" IN ({_FINISHED}))'
)
UNFINISHED_LOCKING_PAGE_SQL = UNFINISHED_SQL + f" FOR UPDATE OF {_P}"
STATUS_AND_URL_SQL = (
    f'SELECT {_A}."status", {_P}."url" FROM {_A} INNER JOIN {_P} ON {_P}."id" = {_A}."page_id" '
    f'WHERE {_A}."id" = %s'
)
_SUCCESS = f"'{Audit.Status.SUCCEEDED}'"
PREVIOUS_SUCCESS_SQL = (
    f'SELECT {_A}."result" FROM {_A} WHERE {_A}."page_id" = %s AND {_A}."status" = {_SUCCESS} '
    f'AND {_A}."id" <> %s ORDER BY {_A}."finished_at" DESC LIMIT 1'
)


def _previous_success_of_row(column: str) -> str:
    """A column of the previous success of the audit row in hand (a subquery over it)."""
    return (
        f'(SELECT previous."{column}" FROM {_A} AS previous '
        f'WHERE previous."page_id" = {_A}."page_id" AND previous."status" = {_SUCCESS} '
        f'AND previous."id" <> {_A}."id" ORDER BY previous."finished_at" DESC LIMIT 1)'
    )


# Every claim returns the id of its page's previous success (None: the page has none),
# so a finish can compare with it without reading it; a nightly re-audit's claim also
# returns that success's result (the validators it may revalidate with, the result a 304
# carries forward and the finish compares with), with conditional re-audits on
# (audits.services.claim_audit). A client's audit of a page with a success reads that
# result only when it succeeds.
PREVIOUS_SUCCESS_ID = Returned(_previous_success_of_row("id"), Audit._meta.pk)
_IF_REAUDIT = f"CASE WHEN {_A}.\"trigger\" = '{Audit.Trigger.REAUDIT}' THEN "
PREVIOUS_RESULT_OF_REAUDIT = Returned(
    f"{_IF_REAUDIT}{_previous_success_of_row('result')} END", Audit._meta.get_field("result")
)
# A finish's condition: the previous success is still the one its claim read (none
# still none).
STILL_PREVIOUS_SUCCESS_SQL = f"{_previous_success_of_row('id')} IS NOT DISTINCT FROM %s"
# A success's one-round-trip finish: its page locked first, then its UPDATE on the condition
# that the previous success is still the claim's and the listeners owe nothing (no
# callback of its own; when it changed, none of its page's either), keyed by whether it
# changed.
LOCK_PAGE_OF_AUDIT_SQL = (
    f'SELECT 1 FROM {_P} WHERE {_P}."id" = (SELECT {_A}."page_id" FROM {_A} '
    f'WHERE {_A}."id" = %s) FOR UPDATE'
)
_NO_CALLBACK = f"{_A}.\"callback_url\" = ''"
_NO_PAGE_CALLBACK = (
    f'(SELECT {_P}."callback_url" FROM {_P} WHERE {_P}."id" = {_A}."page_id") = \'\''
)
OWES_NOTHING_SQL = {
    False: f"{_NO_CALLBACK} AND {STILL_PREVIOUS_SUCCESS_SQL}",
    True: f"{_NO_CALLBACK} AND {_NO_PAGE_CALLBACK} AND {STILL_PREVIOUS_SUCCESS_SQL}",
}
# The page of the audit a finish's statement finished (jobs.lifecycle: `finished`).
FINISHED_PAGE = (
    f'IN (SELECT {_A}."page_id" FROM {_A} INNER JOIN finished ON finished.pk = {_A}."id")'
)


class SharedLink(JobRow):
    """One distinct link (its normalized URL) and its latest outcome, shared by every audit
    that lists it while the outcome is fresh (audits.linkcheck): one request per link per
    LINKCHECK_FRESH_SECONDS, whatever the number of pages, audits, workers or nights.

    Its check is a job (LINK_CHECK_JOB), its state in `check_status`:
    - idle: never checked (`checked_at` None), or checked: the outcome, fresh for
      LINKCHECK_FRESH_SECONDS (a broken one for LINKCHECK_BROKEN_FRESH_SECONDS), stale
      after (then claimed again);
    - queued, running, waiting: a check in flight, claimed by one audit; `task_id` is the
      one task allowed to record the outcome. A lost one is the reconciler's to publish
      again (jobs.lifecycle), never taken over by another audit;
    - confirming a broken answer: also `suspect_since` (the first broken answer's time).
    """

    class CheckStatus(models.TextChoices):
        IDLE = "idle"
        QUEUED = "queued"
        RUNNING = "running"
        WAITING = "waiting"

    url = models.CharField(max_length=2048)  # unique through Meta (Page.url says why)
    # The outcome: LinkCheck.Status values ("" until first checked).
    status = models.CharField(max_length=24, blank=True)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    final_url = models.CharField(max_length=2048, blank=True)
    github = models.JSONField(null=True, blank=True)
    detail = models.TextField(blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)
    # A `rate_limited` outcome: when the link's host said it may be asked again.
    retry_at = models.DateTimeField(null=True, blank=True)
    check_status = models.CharField(
        max_length=16, choices=CheckStatus.choices, default=CheckStatus.IDLE
    )
    suspect_since = models.DateTimeField(
        null=True, blank=True, help_text="The check in flight found it broken once: confirming."
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["url"], name="audits_sharedlink_url_key")]
        indexes = [
            # The prune walks links by when they were last checked (audits.retention).
            models.Index(fields=["checked_at", "id"], name="shared_link_checked_idx"),
            # The reconciler's look at the checks in flight, never the idle history.
            models.Index(
                fields=["published_at"],
                condition=~models.Q(check_status="idle"),
                name="shared_link_in_flight_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.url} ({self.status or 'unchecked'})"


# A shared link's check as a job: one GET (or GitHub's API), and the few rate-limit
# waits it makes inline (RATELIMIT_INLINE_MAX_WAIT_SECONDS each).
LINK_CHECK_JOB = Job(
    name="link_checks",
    model=SharedLink,
    task="audits.check_shared_link",
    queue=settings.AUDIT_QUEUE,
    deadline=Deadline(
        work=settings.AUDIT_FETCH_TIMEOUT_SECONDS + 4 * settings.RATELIMIT_INLINE_MAX_WAIT_SECONDS
    ),
    status_field="check_status",
    queued=SharedLink.CheckStatus.QUEUED,
    running=SharedLink.CheckStatus.RUNNING,
    waiting=SharedLink.CheckStatus.WAITING,
    done=(SharedLink.CheckStatus.IDLE,),
    claim_by_task=True,
)


class RobotsTxt(models.Model):
    """An origin's robots.txt as last read, shared by every worker (audits.robots): read
    once per ROBOTS_FRESH_SECONDS (ROBOTS_UNREACHABLE_SECONDS when it could not be), by
    the one worker whose claim (`claim_token`, until `claimed_until`) took the stale row."""

    origin = models.CharField(max_length=2048)  # unique through Meta (Page.url says why)
    # outbound.integrations.robots: rules, unavailable (all allowed), unreachable (none); "" unread.
    availability = models.CharField(max_length=16, blank=True)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    body = models.TextField(blank=True, help_text="A 2xx's text: its first 500 KiB.")
    truncated = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    # The Crawl-delay its rules ask of AUDIT_USER_AGENT when read (None: none asked), for the
    # admin: the checks read it off the rules themselves.
    crawl_delay = models.FloatField(null=True, blank=True)
    fetched_at = models.DateTimeField(null=True, blank=True)
    # Stale from then on (read again by the next check that needs it); set when a claim is
    # let go without a read too, so a row never read still ages out (audits.retention).
    fresh_until = models.DateTimeField(null=True, blank=True)
    claim_token = models.CharField(max_length=32, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "robots.txt"
        verbose_name_plural = "robots.txt files"
        constraints = [
            models.UniqueConstraint(fields=["origin"], name="audits_robotstxt_origin_key")
        ]
        indexes = [
            # The prune walks the rows stale longest first (audits.retention).
            models.Index(fields=["fresh_until", "id"], name="robots_txt_fresh_until_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.origin}/robots.txt ({self.availability or 'unread'})"


class LinkCheck(models.Model):
    """One outbound link of an audited page: its outcome is its SharedLink's, copied in."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        OK = "ok"
        REDIRECTED = "redirected"
        BROKEN = "broken"
        RATE_LIMITED_PENDING = "rate_limited_pending"
        # The host asked for a longer wait than RATELIMIT_MAX_WAIT_SECONDS: not checked,
        # with the time it may be asked again (`retry_at`).
        RATE_LIMITED = "rate_limited"
        SKIPPED = "skipped"
        # Not requested: its origin's robots.txt disallows it, or is unreachable for now.
        BLOCKED_BY_ROBOTS = "blocked_by_robots"

    # Still to run: queued, or deferred until a rate limit lets it call out.
    UNFINISHED = (Status.QUEUED, Status.RATE_LIMITED_PENDING)

    # Not indexed alone: the unique (audit, url) and (audit, status) serve every read by
    # audit (DECISIONS.md, "No index another one already covers").
    audit = models.ForeignKey(
        Audit, on_delete=models.CASCADE, related_name="link_checks", db_index=False
    )
    url = models.CharField(max_length=2048)
    # Null for rows checked before links were shared, and for skipped ones.
    link = models.ForeignKey(
        SharedLink, null=True, blank=True, on_delete=models.SET_NULL, related_name="checks",
        db_index=False,
    )  # fmt: skip
    status = models.CharField(max_length=24, choices=Status.choices, default=Status.QUEUED)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    final_url = models.CharField(max_length=2048, blank=True)
    github = models.JSONField(
        null=True, blank=True, help_text="For a GitHub repository: exists, archived, via."
    )
    detail = models.TextField(blank=True)
    retry_at = models.DateTimeField(
        null=True, blank=True, help_text="When a rate-limited check will try again."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["audit", "url"]
        constraints = [
            models.UniqueConstraint(fields=["audit", "url"], name="link_check_audit_url_unique"),
        ]
        indexes = [
            models.Index(fields=["audit", "status"], name="link_check_audit_status_idx"),
            # The prune walks the aged-out rows in this order (audits.retention): without
            # it, each batch would scan the table for the oldest rows.
            models.Index(fields=["created_at"], name="link_check_created_idx"),
            # A shared link's outcome reaches the checks waiting on it.
            models.Index(fields=["link", "status"], name="link_check_link_status_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.url} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status not in self.UNFINISHED

    def as_result(self) -> dict:
        entry = {"url": self.url, "status": self.status}
        if self.status_code is not None:
            entry["status_code"] = self.status_code
        if self.final_url and self.final_url != self.url:
            entry["final_url"] = self.final_url
        if self.github is not None:
            entry["github"] = self.github
        if self.detail:
            entry["detail"] = self.detail
        if self.status in (self.Status.RATE_LIMITED_PENDING, self.Status.RATE_LIMITED) and (
            self.retry_at
        ):
            entry["retry_at"] = self.retry_at.isoformat()
        if not self.is_finished:
            entry["finished"] = False
        return entry


class ApiToken(models.Model):
    """A bearer token for the API, acting as its user. Only its SHA-256 is kept: the token
    is 32 random bytes, so a fast hash is as strong as a slow one and costs a request no
    time; the token itself is shown once, when it is created (audits.api.auth)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100, help_text="What the token is for.")
    # The token's first characters, so an operator can tell tokens apart.
    prefix = models.CharField(max_length=16, editable=False)
    # Unique through Meta (Page.url says why).
    key_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "API token"
        constraints = [
            models.UniqueConstraint(fields=["key_hash"], name="audits_apitoken_key_hash_key")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
