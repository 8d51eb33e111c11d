"""The submitter's index holds submitted audits only (DECISIONS.md, "The submitter's index
holds submitted audits only"): the nightly re-audits, which have no submitter, wrote an
entry on every insert, claim and finish that no listing reads.

On PostgreSQL the new index is built beside the old one without blocking writes
(CONCURRENTLY, so this migration is not atomic), then the old one is dropped the same way
and the new one takes its name. A build that failed half-way leaves an invalid index under
the temporary name, which the next run drops first. SQLite rebuilds it in place.
"""

from django.db import migrations, models

FIELDS = ["submitter", "-created_at"]
NAME = "audit_submitter_created_idx"
EVERY_AUDIT = models.Index(fields=FIELDS, name=NAME)
SUBMITTED_ONLY = models.Index(fields=FIELDS, condition=models.Q(submitter__isnull=False), name=NAME)
BUILDING = "audit_submitter_created_new"


def replace(old: models.Index, new: models.Index):
    def run(apps, schema_editor):
        audit = apps.get_model("audits", "Audit")
        if schema_editor.connection.vendor != "postgresql":
            schema_editor.remove_index(audit, old)
            schema_editor.add_index(audit, new)
            return
        building = models.Index(fields=new.fields, condition=new.condition, name=BUILDING)
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {BUILDING}")
        schema_editor.add_index(audit, building, concurrently=True)
        schema_editor.remove_index(audit, old, concurrently=True)
        schema_editor.rename_index(audit, building, new)

    return run


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("audits", "0024_no_pattern_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunPython(
                    replace(EVERY_AUDIT, SUBMITTED_ONLY), replace(SUBMITTED_ONLY, EVERY_AUDIT)
                ),
            ],
            state_operations=[
                migrations.RemoveIndex(model_name="audit", name=NAME),
                migrations.AddIndex(model_name="audit", index=SUBMITTED_ONLY),
            ],
        ),
    ]
