from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Result webhooks"

    def ready(self):
        # Django's place for signal receivers: a finished audit schedules its delivery.
        from webhooks import tasks  # noqa: F401
