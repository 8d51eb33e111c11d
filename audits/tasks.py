"""The audits queue's tasks, and the one place that publishes them.

The tasks are thin: they take primary keys and call the plain functions in
audits.services and audits.linkcheck, which change rows and return what must be
published next. Their waits, retries, breaker and dead letters are the job
runtime's (jobs.task.PlumbTask), shaped by each task's policy.
"""

from __future__ import annotations

import logging
import uuid

from celery import shared_task
from django.conf import settings
from django.db import transaction
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from audits import linkcheck, services
from audits.linkcheck import QueuedCheck
from audits.models import AUDIT_JOB, LINK_CHECK_JOB, Audit
from jobs.errors import CannotReplay, MalformedTaskMessage
from jobs.headers import resumed_from
from jobs.policy import DEFERRAL, RetryPolicy
from jobs.task import PlumbTask
from outbound.urls import origin_key_or_none

log = logging.getLogger(__name__)

AUDIT_POLICY = RetryPolicy(
    # A page's host busy (PAGE_FETCH_PER_HOST_CONCURRENCY): back after 0.25 s, then 0.5,
    # 1, 2 ... (jittered), never later than one fetch timeout, by when every slot has
    # turned over.
    defer_max=lambda: settings.AUDIT_FETCH_TIMEOUT_SECONDS,
)
LINK_CHECK_POLICY = RetryPolicy()


class AuditTask(PlumbTask):
    policy = AUDIT_POLICY
    job = AUDIT_JOB

    def downstream_host(self, args, kwargs):
        # Its type is checked already (PlumbTask: `audit_id: str`).
        audit_id = args[0] if args else kwargs.get("audit_id")
        try:
            uuid.UUID(audit_id)
        except ValueError:
            raise MalformedTaskMessage(f"audit id {audit_id!r} is not a UUID") from None
        row = Audit.objects.status_and_url(audit_id)
        if row is None:
            # Audits are never deleted while queued: no row means a bad message.
            raise MalformedTaskMessage(f"no audit with id {audit_id}")
        status, url = row
        # A finished audit (a duplicate delivery) is skipped without a breaker. The breaker
        # is the page's origin's: a closed port elsewhere on its host is not its concern.
        return None if status in Audit.FINISHED else origin_key_or_none(url)

    def waiting_fields(self, reason, why):
        return {"error": f"waiting ({reason}): {why}"}

    def after_final_failure(self, exc, *, args, kwargs):
        if args:
            attempts = self.request.retries + 1
            Audit.objects.finish(
                str(args[0]),
                status=Audit.Status.FAILED,
                error=f"gave up after {attempts} attempt(s): {exc}",
            )

    def after_wait_too_long(self, error, *, args, kwargs):
        services.end_rate_limited(str(args[0]), error)
        return True

    def replay_dead_letter(self, args, kwargs):
        audit_id = args[0] if args else kwargs.get("audit_id")
        audit = services.reset_failed_audit(str(audit_id))
        if audit is None:
            raise CannotReplay(f"audit {audit_id} is not failed (or is gone)")
        transaction.on_commit(lambda: enqueue_audit(audit))
        return audit.task_id


@shared_task(
    bind=True,
    base=AuditTask,
    name="audits.run_audit",
    queue=settings.AUDIT_QUEUE,
)
def run_audit(self, audit_id: str) -> None:
    # After an outage the claim counts this attempt once, however many runs it took.
    attempt = self.attempt_number() if self.resumes_after_outage() else None
    # A run deferred at a busy redirect target goes on from that hop.
    enqueue_link_checks(
        services.execute_audit(audit_id, resume=resumed_from(self.request), attempt=attempt)
    )


class LinkCheckTask(PlumbTask):
    policy = LINK_CHECK_POLICY
    job = LINK_CHECK_JOB

    def before_wait(self, reason, seconds, *, why, args, kwargs):
        super().before_wait(reason, seconds, why=why, args=args, kwargs=kwargs)
        if reason == DEFERRAL:
            # Bounded by the audits' deadline: a check woken after it still records the
            # outcome, for the audits that list the link next.
            linkcheck.mark_waiting(args[0], why=why, seconds=seconds)

    def after_wait_too_long(self, error, *, args, kwargs):
        linkcheck.end_rate_limited(args[0], self.request.id, error)
        return True

    def after_final_failure(self, exc, *, args, kwargs):
        if args:
            linkcheck.give_up(args[0], self.request.id, error=f"{exc.__class__.__name__}: {exc}")


@shared_task(
    bind=True,
    base=LinkCheckTask,
    name="audits.check_shared_link",
    queue=settings.AUDIT_QUEUE,
)
def check_shared_link(self, shared_link_id: int) -> None:
    """One distinct link's check, for every audit listing it (its claim names this task),
    from the redirect hop a deferred run of it reached."""
    linkcheck.run_shared_check(shared_link_id, self.request.id, resume=resumed_from(self.request))


# --- Publishing ------------------------------------------------------------------


def enqueue_audit(audit: Audit) -> bool:
    """Publish the audit's message; False (logged) if the broker cannot take it now.

    Runs after the row is committed, so a failure here must not fail the request that
    created it: the audit is accepted, and the reconciler (jobs.reconcile) publishes
    it again once the broker is back.
    """
    try:
        run_audit.apply_async(
            args=[str(audit.id)],
            task_id=audit.task_id,
            queue=settings.AUDIT_QUEUE,
            # Nothing to declare: the message goes by the default exchange straight onto
            # the queue's list, and the workers consuming the queue declare it. Declared
            # here, every publish had kombu check its cache of declarations (a copy of the
            # queue bound to the channel, inside another retry wrapper).
            declare=[],
        )
    except (OperationalError, RedisError, OSError) as exc:
        log.error(
            "audit.enqueue_failed",
            extra={"audit_id": str(audit.id), "error": f"{exc.__class__.__name__}: {exc}"},
        )
        return False
    log.info("audit.enqueued", extra={"audit_id": str(audit.id), "trigger": audit.trigger})
    return True


def enqueue_link_checks(queued: list[QueuedCheck]) -> None:
    for check in queued:
        check_shared_link.apply_async(
            args=[check.shared_link_id], task_id=check.task_id, queue=settings.AUDIT_QUEUE
        )
