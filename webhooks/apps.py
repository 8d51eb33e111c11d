from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Result webhooks"

    def ready(self):
        # Django's place for signal receivers (a finished audit schedules its delivery),
        # what this app owes (jobs.reconcile), and what ages out (jobs.retention: an audit
        # still owed a delivery is kept).
        from jobs import reconcile, retention
        from webhooks import tasks  # noqa: F401
        from webhooks.models import DELIVERY_JOB
        from webhooks.retention import DEAD_LETTERS, KIND, without_owed_deliveries

        reconcile.register_job(DELIVERY_JOB)
        retention.register(KIND)
        retention.register(DEAD_LETTERS)
        retention.keep("audits", without_owed_deliveries)
