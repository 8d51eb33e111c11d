from django.apps import AppConfig


class ReauditConfig(AppConfig):
    name = "reaudit"
    verbose_name = "Nightly re-audit"
