from __future__ import annotations

import uuid

from celery import shared_task
from django.conf import settings

from audits import services
from audits.fetch import TransientFetchError
from audits.models import Audit
from ratelimit.deadletters import CannotReplay, MalformedTaskMessage
from ratelimit.retry import PlumbTask


class AuditTask(PlumbTask):
    max_attempts_setting = "AUDIT_MAX_ATTEMPTS"

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
        services.mark_retrying(args[0], error=f"attempt {self.request.retries + 1} failed: {exc}")

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
    base=AuditTask,
    name="audits.run_audit",
    queue=settings.AUDIT_QUEUE,
    autoretry_for=(TransientFetchError,),
    # Bounded by the fetch timeout; the hard limit only catches a stuck parser.
    soft_time_limit=settings.AUDIT_FETCH_TIMEOUT_SECONDS + 30,
    time_limit=settings.AUDIT_FETCH_TIMEOUT_SECONDS + 60,
)
def run_audit(audit_id: str) -> None:
    services.execute_audit(audit_id)
