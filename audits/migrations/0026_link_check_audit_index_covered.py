"""A link check's audit is not indexed alone: the unique (audit, url) and (audit, status)
lead with it and serve every read by audit, while the key's own index was written by every
link check, the largest table, and read by nothing (DECISIONS.md, "No index another one
already covers").

Only the index changes (jobs.schema): Django's AlterField of the key's `db_index` would drop
the foreign key and add it again, checking every row under a lock that blocks writes.
On PostgreSQL the index is dropped CONCURRENTLY, so this migration is not atomic.
"""

import django.db.models.deletion
from django.db import migrations, models

from jobs.schema import column_indexes_dropped

# (table, column, the index's name as the field's `db_index` made it, for the reverse)
INDEXES = [("audits_linkcheck", "audit_id", "audits_linkcheck_audit_id_bbcba3cd")]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("audits", "0025_submitter_index_submitted_only"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[column_indexes_dropped(INDEXES)],
            state_operations=[
                migrations.AlterField(
                    model_name="linkcheck",
                    name="audit",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="link_checks",
                        to="audits.audit",
                    ),
                ),
            ],
        ),
    ]
