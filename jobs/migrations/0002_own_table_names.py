from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0001_move_from_ratelimit"),
        # The old app forgets the models first, so no state names a table twice.
        ("ratelimit", "0003_runtime_models_moved_to_jobs"),
    ]

    operations = [
        migrations.AlterModelTable(name="circuitbreaker", table=None),
        migrations.AlterModelTable(name="deadletter", table=None),
    ]
