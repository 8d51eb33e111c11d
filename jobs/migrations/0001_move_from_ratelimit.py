# The dead letters and breakers move from `ratelimit` to the job runtime. Their tables
# stay as they are here (state only); 0002 gives them the runtime's own table names.

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies = [("ratelimit", "0002_dead_letters_breakers")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.CreateModel(
                    name="CircuitBreaker",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("task_name", models.CharField(max_length=255)),
                        ("host", models.CharField(max_length=255)),
                        (
                            "state",
                            models.CharField(
                                choices=[
                                    ("closed", "Closed"),
                                    ("open", "Open"),
                                    ("half_open", "half-open"),
                                ],
                                default="closed",
                                max_length=16,
                            ),
                        ),
                        ("last_transition", models.CharField(blank=True, max_length=32)),
                        ("changed_at", models.DateTimeField()),
                        ("open_until", models.DateTimeField(blank=True, null=True)),
                        ("times_opened", models.PositiveIntegerField(default=0)),
                    ],
                    options={
                        "ordering": ["task_name", "host"],
                        "db_table": "ratelimit_circuitbreaker",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("task_name", "host"), name="breaker_task_host_unique"
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="DeadLetter",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("task_name", models.CharField(blank=True, max_length=255)),
                        ("task_id", models.CharField(blank=True, db_index=True, max_length=255)),
                        ("queue", models.CharField(blank=True, max_length=255)),
                        ("args", models.JSONField(blank=True, null=True)),
                        ("kwargs", models.JSONField(blank=True, null=True)),
                        ("raw_message", models.TextField(blank=True)),
                        (
                            "reason",
                            models.CharField(
                                choices=[
                                    ("attempts_exhausted", "attempts exhausted"),
                                    ("failed", "failed (not retryable)"),
                                    ("malformed", "malformed message"),
                                ],
                                max_length=32,
                            ),
                        ),
                        ("exception", models.TextField(blank=True)),
                        ("traceback", models.TextField(blank=True)),
                        (
                            "attempts",
                            models.PositiveIntegerField(
                                default=0,
                                help_text="Times the task ran (0: the worker could not run it at all).",
                            ),
                        ),
                        ("first_failed_at", models.DateTimeField()),
                        ("last_failed_at", models.DateTimeField()),
                        ("replayed_at", models.DateTimeField(blank=True, null=True)),
                        ("replayed_by", models.CharField(blank=True, max_length=255)),
                        ("replay_task_id", models.CharField(blank=True, max_length=255)),
                    ],
                    options={
                        "ordering": ["-last_failed_at"],
                        "db_table": "ratelimit_deadletter",
                        "indexes": [
                            models.Index(
                                fields=["task_name", "-last_failed_at"], name="deadletter_task_idx"
                            ),
                            models.Index(
                                fields=["replayed_at", "-last_failed_at"],
                                name="deadletter_replayed_idx",
                            ),
                        ],
                    },
                ),
            ],
        ),
    ]
