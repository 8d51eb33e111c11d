from django.apps import AppConfig


class AuditsConfig(AppConfig):
    name = "audits"
    verbose_name = "Audits"

    def ready(self):
        # Django's place for wiring that needs the models loaded: the queue's gauges, its
        # admission limit (so an alert can compare the backlog with it), the pages that
        # changed, what it owes (jobs.reconcile), what ages out (jobs.retention) and its
        # periodic sweep (jobs.sweeps: audits past their link-check deadline).
        from django.conf import settings

        from audits import linkcheck
        from audits import retention as audits_retention
        from audits.admission import queue_gauges
        from audits.models import AUDIT_JOB, LINK_CHECK_JOB
        from audits.pages import change_counts, failing_check_counts
        from jobs import reconcile, retention, sweeps
        from observability import gauges

        gauges.register("audits_queue", queue_gauges)
        gauges.register("page_changes", change_counts)
        gauges.register_report("pages_failing", failing_check_counts)
        gauges.register("admission_limit", lambda: {"max_depth": settings.AUDIT_QUEUE_MAX_DEPTH})
        reconcile.register_job(AUDIT_JOB)
        reconcile.register_job(LINK_CHECK_JOB)
        for kind in audits_retention.KINDS:
            retention.register(kind)
        sweeps.register(linkcheck.DEADLINE_SWEEP)
