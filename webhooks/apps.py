from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Result webhooks"

    def ready(self):
        # Django's place for signal receivers (a finished audit schedules its delivery),
        # and for telling the reconciler what this app owes.
        from jobs import reconcile
        from webhooks import tasks  # noqa: F401
        from webhooks.reconcile import SOURCES

        for source in SOURCES:
            reconcile.register(source)
