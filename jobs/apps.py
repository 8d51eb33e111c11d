from django.apps import AppConfig
from django.conf import settings


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs: retries, breakers and dead letters"

    def ready(self):
        # Django's place for wiring that needs the models loaded: the publish stamp and
        # task log lines (Celery signals), the breakers' gauge and the delayed stores', and
        # the retention of replayed dead letters and of breakers' admin rows, and the check
        # that every task's time limits fit its queue's visibility timeout.
        from django.core import checks

        from config.redis import redis_client
        from jobs import breakers, deadletters, delayed, instrumentation, retention  # noqa: F401
        from jobs.checks import time_limits_fit_visibility_timeouts
        from observability import gauges

        checks.register(time_limits_fit_visibility_timeouts)

        retention.register(deadletters.RETENTION)
        retention.register(breakers.RETENTION)

        gauges.register(
            "breakers",
            lambda: {f"breakers:{state}": n for state, n in breakers.state_counts().items()},
        )
        gauges.register(
            "delayed_overdue",
            lambda: {
                f"delayed_overdue:{queue}": age
                for queue, age in delayed.oldest_overdue_seconds(
                    sorted(settings.QUEUE_VISIBILITY_TIMEOUTS), redis_client()
                ).items()
            },
        )
