from __future__ import annotations

import logging
import uuid

from celery import shared_task
from django.conf import settings

from audits import backlog, linkcheck, services
from audits.models import Audit
from jobs.errors import RateLimited, Transient
from ratelimit import parking
from ratelimit.deadletters import CannotReplay, MalformedTaskMessage
from ratelimit.retry import DATABASE_UNAVAILABLE, PlumbTask, defer, deferrals

log = logging.getLogger(__name__)

# A page whose host keeps rate-limiting us is deferred this often (no attempt
# spent) before its waits start counting as attempts, so it fails in the end.
MAX_AUDIT_DEFERRALS = 10

# Bounded by the fetch timeout; the hard limit only catches a stuck parser.
AUDIT_SOFT_TIME_LIMIT_SECONDS = settings.AUDIT_FETCH_TIMEOUT_SECONDS + 30
AUDIT_TIME_LIMIT_SECONDS = settings.AUDIT_FETCH_TIMEOUT_SECONDS + 60


class AuditTask(PlumbTask):
    max_attempts_setting = "AUDIT_MAX_ATTEMPTS"
    # Only the page's own failures count against its host's breaker (not a database outage).
    downstream_failures = (Transient,)

    def downstream_host(self, args, kwargs):
        audit_id = args[0] if args else kwargs.get("audit_id")
        if not isinstance(audit_id, str):
            raise MalformedTaskMessage(f"audit id {audit_id!r} is not a string")
        try:
            uuid.UUID(audit_id)
        except ValueError:
            raise MalformedTaskMessage(f"audit id {audit_id!r} is not a UUID") from None
        row = Audit.objects.filter(id=audit_id).values_list("status", "page__domain").first()
        if row is None:
            # Audits are never deleted while queued: no row means a bad message.
            raise MalformedTaskMessage(f"no audit with id {audit_id}")
        status, domain = row
        # A finished audit (a duplicate delivery) is skipped without a breaker.
        return None if status in Audit.FINISHED else domain

    def before_retry(self, exc, countdown, *, args, kwargs):
        try:
            services.mark_retrying(
                args[0], error=f"attempt {self.request.retries + 1} failed: {exc}"
            )
        except DATABASE_UNAVAILABLE:
            # The retry must still be published when the database is what failed.
            log.warning("audit.retry_not_recorded", extra={"audit_id": args[0]})
        if countdown > parking.longest_held_delay(self):
            # Parked in Redis, not held in `unacked:audits`: still owed a slot.
            backlog.note_parked(args[0], countdown)

    def before_park(self, reason, delay, *, args, kwargs):
        services.mark_retrying(args[0], error=f"waiting: {reason}")
        backlog.note_parked(args[0], delay)

    def after_final_failure(self, exc, *, args, kwargs):
        if args and not isinstance(exc, MalformedTaskMessage):
            attempts = self.request.retries + 1
            services.finish_audit(
                str(args[0]), status="failed", error=f"gave up after {attempts} attempt(s): {exc}"
            )

    def replay_dead_letter(self, args, kwargs):
        audit_id = args[0] if args else kwargs.get("audit_id")
        audit = services.requeue_audit(str(audit_id))
        if audit is None:
            raise CannotReplay(f"audit {audit_id} is not failed (or is gone)")
        return audit.task_id


@shared_task(
    bind=True,
    base=AuditTask,
    name="audits.run_audit",
    queue=settings.AUDIT_QUEUE,
    autoretry_for=(Transient, *DATABASE_UNAVAILABLE),
    soft_time_limit=AUDIT_SOFT_TIME_LIMIT_SECONDS,
    time_limit=AUDIT_TIME_LIMIT_SECONDS,
)
def run_audit(self, audit_id: str) -> None:
    try:
        services.execute_audit(audit_id)
    except RateLimited as exc:
        if deferrals(self) >= MAX_AUDIT_DEFERRALS:
            raise Transient(str(exc), retry_after=exc.retry_after) from exc
        services.mark_deferred(audit_id, error=f"rate limited: {exc}")
        defer(self, exc.retry_at, str(exc), key=exc.key, resource=exc.resource)


class LinkCheckTask(PlumbTask):
    max_attempts_setting = "AUDIT_MAX_ATTEMPTS"

    def after_final_failure(self, exc, *, args, kwargs):
        if args:
            linkcheck.give_up(args[0], error=f"{exc.__class__.__name__}: {exc}")


@shared_task(
    bind=True,
    base=LinkCheckTask,
    name="audits.check_link",
    queue=settings.AUDIT_QUEUE,
    autoretry_for=(Transient,),
    # The check itself is bounded by the fetch timeout; inline rate-limit waits are
    # bounded by RATELIMIT_INLINE_MAX_WAIT_SECONDS each, a few of them at most.
    soft_time_limit=settings.AUDIT_FETCH_TIMEOUT_SECONDS
    + 4 * settings.RATELIMIT_INLINE_MAX_WAIT_SECONDS
    + 30,
    time_limit=settings.AUDIT_FETCH_TIMEOUT_SECONDS
    + 4 * settings.RATELIMIT_INLINE_MAX_WAIT_SECONDS
    + 60,
)
def check_link(self, link_check_id: int) -> None:
    try:
        linkcheck.run_link_check(link_check_id)
    except RateLimited as exc:
        # Bounded by the audit's deadline: a check woken after it returns at once.
        linkcheck.mark_rate_limited(link_check_id, exc)
        defer(self, exc.retry_at, str(exc), key=exc.key, resource=exc.resource)


@shared_task(name="audits.finish_overdue_link_checks", queue=settings.AUDIT_QUEUE)
def finish_overdue_link_checks() -> None:
    linkcheck.finish_overdue_link_checks()


@shared_task(name="audits.requeue_stuck_audits", queue=settings.AUDIT_QUEUE, ignore_result=True)
def requeue_stuck_audits() -> int:
    from audits.reconcile import requeue_stuck_audits as requeue

    return requeue()
