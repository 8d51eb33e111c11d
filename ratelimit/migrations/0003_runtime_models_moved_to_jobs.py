# DeadLetter and CircuitBreaker belong to the job runtime now (jobs 0001): forgotten
# here without touching their tables, which jobs 0002 renames.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("ratelimit", "0002_dead_letters_breakers"),
        ("jobs", "0001_move_from_ratelimit"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.DeleteModel(name="CircuitBreaker"),
                migrations.DeleteModel(name="DeadLetter"),
            ],
        ),
    ]
