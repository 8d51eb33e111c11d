from django.apps import AppConfig


class ReauditConfig(AppConfig):
    name = "reaudit"
    verbose_name = "Nightly re-audit"

    def ready(self):
        # Django's place for wiring that needs the models loaded: the scheduled gauge, and
        # the closed nights' rows that age out (jobs.retention).
        from jobs import retention
        from observability import gauges
        from reaudit import retention as reaudit_retention
        from reaudit.services import count_scheduled

        gauges.register("scheduled", lambda: {"scheduled": count_scheduled()})
        for kind in reaudit_retention.KINDS:
            retention.register(kind)
