"""The beat entry that runs the nightly fan-out, stored for django-celery-beat's DatabaseScheduler.

Created once, at REAUDIT_HOUR as set when `migrate` runs; from then on the
entry (its crontab, or switching it off) is edited in the admin under
Periodic tasks, and this migration never overwrites it.
"""

from django.conf import settings
from django.db import migrations
from django.utils import timezone

ENTRY_NAME = "reaudit: nightly fan-out"
TASK = "reaudit.fan_out"


def create_entry(apps, schema_editor):
    CrontabSchedule = apps.get_model("django_celery_beat", "CrontabSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTasks = apps.get_model("django_celery_beat", "PeriodicTasks")
    if PeriodicTask.objects.filter(name=ENTRY_NAME).exists():
        return
    crontab, _ = CrontabSchedule.objects.get_or_create(
        minute="0",
        hour=str(settings.REAUDIT_HOUR),
        day_of_month="*",
        month_of_year="*",
        day_of_week="*",
        timezone="UTC",
    )
    PeriodicTask.objects.create(
        name=ENTRY_NAME,
        task=TASK,
        crontab=crontab,
        queue=settings.REAUDIT_QUEUE,
        description=(
            "Places every page marked for re-audit into tonight's window "
            "(REAUDIT_WINDOW_SECONDS), one slice at a time. Running it twice a day is harmless."
        ),
    )
    # A running beat reloads its schedule when this changes (historical models lack
    # PeriodicTasks.update_changed, so set it by hand).
    PeriodicTasks.objects.update_or_create(ident=1, defaults={"last_update": timezone.now()})


def delete_entry(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(name=ENTRY_NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("reaudit", "0001_fan_out_placements_slices"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create_entry, delete_entry)]
