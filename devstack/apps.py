from django.apps import AppConfig


class DevstackConfig(AppConfig):
    name = "devstack"
    verbose_name = "Development stack"
