"""Pages get an owner and a random public id; audits their submitter; API tokens a table.

The public id is added nullable, each existing page given its own uuid4 in batches, then
made unique and required: a column default would give every existing row the same value
(Django evaluates a callable default once for the ALTER). The integer primary key and
every foreign key to it (audits, placements, deliveries through their audits) stay as
they are, on SQLite and PostgreSQL alike. Existing pages and audits have no owner and
no submitter: staff manage them (DECISIONS.md).
"""

import uuid

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

BATCH = 1000


def give_public_ids(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        # One statement, whatever the table's size (gen_random_uuid: PostgreSQL 13+).
        schema_editor.execute("UPDATE audits_page SET public_id = gen_random_uuid()")
        return
    Page = apps.get_model("audits", "Page")
    while True:
        ids = list(Page.objects.filter(public_id=None).values_list("id", flat=True)[:BATCH])
        if not ids:
            return
        for page_id in ids:
            Page.objects.filter(id=page_id).update(public_id=uuid.uuid4())


class Migration(migrations.Migration):
    dependencies = [
        ("audits", "0013_shared_link_checked_index"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="page",
            name="public_id",
            field=models.UUIDField(null=True, editable=False),
        ),
        migrations.RunPython(give_public_ids, migrations.RunPython.noop, elidable=True),
        migrations.AlterField(
            model_name="page",
            name="public_id",
            field=models.UUIDField(default=uuid.uuid4, editable=False, unique=True),
        ),
        migrations.AddField(
            model_name="page",
            name="owner",
            field=models.ForeignKey(
                blank=True,
                help_text="Who created the page; empty for an anonymous submission (staff manage it).",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="audit",
            name="submitter",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddIndex(
            model_name="audit",
            index=models.Index(
                fields=["submitter", "-created_at"], name="audit_submitter_created_idx"
            ),
        ),
        migrations.CreateModel(
            name="ApiToken",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(help_text="What the token is for.", max_length=100)),
                ("prefix", models.CharField(editable=False, max_length=16)),
                ("key_hash", models.CharField(editable=False, max_length=64, unique=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={"verbose_name": "API token"},
        ),
    ]
