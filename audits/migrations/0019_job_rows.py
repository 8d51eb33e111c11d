"""Audits and shared links' checks become job rows (jobs.models.JobRow, jobs.lifecycle).

An audit's `started_at` is its attempt's `attempt_started_at`; `requeued_at` gives way to
`published_at` (when its current message was published: created, replayed or published
again). A shared link's claim (`checking_since`, `check_task_id`) becomes its check's job
state: `check_status` and the job row's fields.
"""

import django.utils.timezone
from django.db import migrations, models
from django.db.models import F, Q
from django.db.models.functions import Coalesce


def fill_published_at(apps, schema_editor):
    Audit = apps.get_model("audits", "Audit")
    Audit.objects.update(published_at=Coalesce(F("requeued_at"), F("created_at")))
    SharedLink = apps.get_model("audits", "SharedLink")
    # A claim in flight: its check is queued since it was claimed (the reconciler owns it).
    SharedLink.objects.filter(~Q(checking_since=None)).update(
        check_status="queued", published_at=F("checking_since")
    )


class Migration(migrations.Migration):
    dependencies = [("audits", "0018_link_check_deadline_entry_removed")]

    operations = [
        migrations.RenameField("audit", "started_at", "attempt_started_at"),
        migrations.AddField(
            model_name="audit",
            name="published_at",
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
        migrations.RenameField("sharedlink", "check_task_id", "task_id"),
        migrations.AddField(
            model_name="sharedlink",
            name="check_status",
            field=models.CharField(
                choices=[
                    ("idle", "Idle"),
                    ("queued", "Queued"),
                    ("running", "Running"),
                    ("waiting", "Waiting"),
                ],
                default="idle",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="sharedlink",
            name="attempts",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="sharedlink",
            name="attempt_started_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="sharedlink",
            name="next_attempt_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="sharedlink",
            name="published_at",
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
        migrations.RunPython(fill_published_at, migrations.RunPython.noop, elidable=True),
        migrations.RemoveField("audit", "requeued_at"),
        migrations.RemoveField("sharedlink", "checking_since"),
        # Written by nothing since checks were shared: the shared link's job has the task id.
        migrations.RemoveField("linkcheck", "task_id"),
        migrations.AddIndex(
            model_name="audit",
            index=models.Index(
                condition=models.Q(status__in=["queued", "running", "retrying"]),
                fields=["published_at"],
                name="audit_owed_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="sharedlink",
            index=models.Index(
                condition=models.Q(("check_status", "idle"), _negated=True),
                fields=["published_at"],
                name="shared_link_in_flight_idx",
            ),
        ),
    ]
