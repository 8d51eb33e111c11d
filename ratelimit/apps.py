from django.apps import AppConfig


class RatelimitConfig(AppConfig):
    name = "ratelimit"
    verbose_name = "Rate limits and retries"
