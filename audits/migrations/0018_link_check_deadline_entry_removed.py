"""The link-check deadline's beat entry goes: it is a sweep now (jobs.sweeps, a tick of
every worker's threads), which a backlog on the `audits` queue cannot hold back.

The entry was synced from CELERY_BEAT_SCHEDULE into the database by beat itself, under
its schedule name; left there, beat would keep publishing a task no worker knows.
"""

from django.db import migrations
from django.utils import timezone

BEAT_ENTRY = "finish-overdue-link-checks"
TASK = "audits.finish_overdue_link_checks"


def delete_entry(apps, schema_editor):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTasks = apps.get_model("django_celery_beat", "PeriodicTasks")
    stale = PeriodicTask.objects.filter(name=BEAT_ENTRY) | PeriodicTask.objects.filter(task=TASK)
    if stale.delete()[0]:
        # A running beat reloads its schedule when this changes.
        PeriodicTasks.objects.update_or_create(ident=1, defaults={"last_update": timezone.now()})


class Migration(migrations.Migration):
    dependencies = [
        ("audits", "0017_link_rate_limited"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(delete_entry, migrations.RunPython.noop)]
