from __future__ import annotations

from celery import shared_task
from django.conf import settings

from audits import services
from audits.fetch import TransientFetchError
from ratelimit.retry import PlumbTask

# Bounded by the fetch timeout; the hard limit only catches a stuck parser.
AUDIT_SOFT_TIME_LIMIT_SECONDS = settings.AUDIT_FETCH_TIMEOUT_SECONDS + 30
AUDIT_TIME_LIMIT_SECONDS = settings.AUDIT_FETCH_TIMEOUT_SECONDS + 60


class AuditTask(PlumbTask):
    max_attempts_setting = "AUDIT_MAX_ATTEMPTS"

    def before_retry(self, exc, countdown, *, args, kwargs):
        services.mark_retrying(args[0], error=f"attempt {self.request.retries + 1} failed: {exc}")

    def after_final_failure(self, exc, *, args, kwargs):
        if args:
            attempts = self.request.retries + 1
            services.finish_audit(
                str(args[0]), status="failed", error=f"gave up after {attempts} attempt(s): {exc}"
            )


@shared_task(
    base=AuditTask,
    name="audits.run_audit",
    queue=settings.AUDIT_QUEUE,
    autoretry_for=(TransientFetchError,),
    soft_time_limit=AUDIT_SOFT_TIME_LIMIT_SECONDS,
    time_limit=AUDIT_TIME_LIMIT_SECONDS,
)
def run_audit(audit_id: str) -> None:
    services.execute_audit(audit_id)
