from django.apps import AppConfig


class ReauditConfig(AppConfig):
    name = "reaudit"
    verbose_name = "Nightly re-audit"

    def ready(self):
        # Django's place for wiring that needs the models loaded: the scheduled gauge, the
        # current night against its plan, and what a night owes, for the reconciler.
        from jobs import reconcile
        from observability import gauges
        from reaudit.reconcile import SOURCES
        from reaudit.services import count_scheduled, night_progress

        gauges.register("scheduled", lambda: {"scheduled": count_scheduled()})
        gauges.register("reaudit_night", night_progress)
        for source in SOURCES:
            reconcile.register(source)
