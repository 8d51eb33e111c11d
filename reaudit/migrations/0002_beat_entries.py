"""The re-audit's beat entries, stored for django-celery-beat's DatabaseScheduler.

The nightly fan-out is created at REAUDIT_HOUR as set when `migrate` runs.
From then on both entries (the crontab, the interval, switching one off) are
edited in the admin under Periodic tasks; this migration never overwrites them.
The catch-up runs every minute and its messages expire after one, so a night
without a reaudit worker does not pile them up.
"""

from django.conf import settings
from django.db import migrations
from django.utils import timezone

FAN_OUT_ENTRY = "reaudit: nightly fan-out"
CATCH_UP_ENTRY = "reaudit: catch-up"
CATCH_UP_EVERY_SECONDS = 60


def create_entries(apps, schema_editor):
    CrontabSchedule = apps.get_model("django_celery_beat", "CrontabSchedule")
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTasks = apps.get_model("django_celery_beat", "PeriodicTasks")

    if not PeriodicTask.objects.filter(name=FAN_OUT_ENTRY).exists():
        crontab, _ = CrontabSchedule.objects.get_or_create(
            minute="0",
            hour=str(settings.REAUDIT_HOUR),
            day_of_month="*",
            month_of_year="*",
            day_of_week="*",
            timezone="UTC",
        )
        PeriodicTask.objects.create(
            name=FAN_OUT_ENTRY,
            task="reaudit.fan_out",
            crontab=crontab,
            queue=settings.REAUDIT_QUEUE,
            description=(
                "Places every page marked for re-audit into tonight's window "
                "(REAUDIT_WINDOW_SECONDS), one slice at a time. Running it twice a day is harmless."
            ),
        )
    if not PeriodicTask.objects.filter(name=CATCH_UP_ENTRY).exists():
        interval, _ = IntervalSchedule.objects.get_or_create(
            every=CATCH_UP_EVERY_SECONDS, period="seconds"
        )
        PeriodicTask.objects.create(
            name=CATCH_UP_ENTRY,
            task="reaudit.catch_up",
            interval=interval,
            queue=settings.REAUDIT_QUEUE,
            expire_seconds=CATCH_UP_EVERY_SECONDS,
            description=(
                "Republishes a night's slice or placements the broker lost (overdue by "
                "1.5 x REAUDIT_VISIBILITY_TIMEOUT_SECONDS). Finds nothing on a healthy night."
            ),
        )
    # A running beat reloads its schedule when this changes (historical models
    # lack PeriodicTasks.update_changed, so set it by hand).
    PeriodicTasks.objects.update_or_create(ident=1, defaults={"last_update": timezone.now()})


def delete_entries(apps, schema_editor):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTask.objects.filter(name__in=[FAN_OUT_ENTRY, CATCH_UP_ENTRY]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("reaudit", "0001_fan_out_placements_slices"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create_entries, delete_entries)]
