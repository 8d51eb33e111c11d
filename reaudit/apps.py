from django.apps import AppConfig


class ReauditConfig(AppConfig):
    name = "reaudit"
    verbose_name = "Nightly re-audit"

    def ready(self):
        # Django's place for wiring that needs the models loaded: the scheduled gauge, the
        # current night against its plan, what a night owes (jobs.reconcile) and the closed
        # nights' rows that age out (jobs.retention).
        from jobs import reconcile, retention
        from observability import gauges
        from reaudit import retention as reaudit_retention
        from reaudit.reconcile import SOURCES
        from reaudit.services import count_scheduled, night_progress

        gauges.register("scheduled", lambda: {"scheduled": count_scheduled()})
        gauges.register("reaudit_night", night_progress)
        for source in SOURCES:
            reconcile.register(source)
        for kind in reaudit_retention.KINDS:
            retention.register(kind)
