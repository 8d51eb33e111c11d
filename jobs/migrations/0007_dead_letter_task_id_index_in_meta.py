"""The dead letters' task id indexed through Meta, under a name of its own: the field's
`db_index` also made an index for LIKE on PostgreSQL, which nothing reads (DECISIONS.md,
"No index for LIKE"). Removing `db_index` drops both (Django finds them by their column);
the table is small, so its one index is built again under the new name."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0006_breaker_changed_index"),
    ]

    operations = [
        migrations.AlterField(
            model_name="deadletter",
            name="task_id",
            field=models.CharField(blank=True, max_length=255),
        ),
        migrations.AddIndex(
            model_name="deadletter",
            index=models.Index(fields=["task_id"], name="deadletter_task_id_idx"),
        ),
    ]
