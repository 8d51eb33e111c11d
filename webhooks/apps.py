from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Result webhooks"

    def ready(self):
        # Django's place for signal receivers: a finished audit schedules its delivery.
        # Deliveries age out (jobs.retention), and an audit still owed one is kept.
        from jobs import retention
        from webhooks import tasks  # noqa: F401
        from webhooks.retention import KIND, without_owed_deliveries

        retention.register(KIND)
        retention.keep("audits", without_owed_deliveries)
