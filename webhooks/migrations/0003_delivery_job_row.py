"""A delivery becomes a job row (jobs.models.JobRow, jobs.lifecycle): when its attempt
began and when its message was published, which `updated_at` stood in for."""

import django.utils.timezone
from django.db import migrations, models
from django.db.models import F


def fill_from_updated_at(apps, schema_editor):
    Delivery = apps.get_model("webhooks", "Delivery")
    Delivery.objects.update(published_at=F("updated_at"))
    Delivery.objects.filter(status="delivering").update(attempt_started_at=F("updated_at"))


class Migration(migrations.Migration):
    dependencies = [("webhooks", "0002_delivery_event")]

    operations = [
        migrations.AddField(
            model_name="delivery",
            name="attempt_started_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="delivery",
            name="published_at",
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
        migrations.RunPython(fill_from_updated_at, migrations.RunPython.noop, elidable=True),
        migrations.AddIndex(
            model_name="delivery",
            index=models.Index(
                condition=models.Q(status__in=["pending", "delivering", "retrying"]),
                fields=["published_at"],
                name="delivery_owed_idx",
            ),
        ),
    ]
