"""The re-audit's catch-up beat entry goes: one reconciler (jobs.reconcile, a thread of
every worker) now publishes again what a night owes, with everything else owed."""

from django.db import migrations
from django.utils import timezone

CATCH_UP_ENTRY = "reaudit: catch-up"


def delete_catch_up(apps, schema_editor):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTasks = apps.get_model("django_celery_beat", "PeriodicTasks")
    if PeriodicTask.objects.filter(name=CATCH_UP_ENTRY).delete()[0]:
        # A running beat reloads its schedule when this changes.
        PeriodicTasks.objects.update_or_create(ident=1, defaults={"last_update": timezone.now()})


class Migration(migrations.Migration):
    dependencies = [
        ("reaudit", "0004_placement_requeued_at"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(delete_catch_up, migrations.RunPython.noop)]
