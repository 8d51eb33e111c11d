from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "observability"
    verbose_name = "Observability"

    def ready(self):
        # Celery signal handlers: task metrics and logs, and the per-minute sampler.
        from observability import sampler, signals  # noqa: F401
