from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs: retries, breakers and dead letters"

    def ready(self):
        # Django's place for wiring that needs the models loaded: the publish stamp and
        # task log lines (Celery signals), the breakers' gauge, and replayed dead letters'
        # retention.
        from jobs import breakers, deadletters, instrumentation, retention  # noqa: F401
        from observability import gauges

        retention.register(deadletters.RETENTION)

        gauges.register(
            "breakers",
            lambda: {f"breakers:{state}": n for state, n in breakers.state_counts().items()},
        )
