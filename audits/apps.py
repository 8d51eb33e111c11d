from django.apps import AppConfig


class AuditsConfig(AppConfig):
    name = "audits"
    verbose_name = "Audits"

    def ready(self):
        # Django's place for wiring that needs the models loaded: the queue's gauges and
        # the pages that changed, and what ages out (jobs.retention).
        from audits import retention as audits_retention
        from audits.admission import queue_gauges
        from audits.pages import change_counts
        from jobs import retention
        from observability import gauges

        gauges.register("audits_queue", queue_gauges)
        gauges.register("page_changes", change_counts)
        for kind in audits_retention.KINDS:
            retention.register(kind)
