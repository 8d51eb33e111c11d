"""A delivery's audit is not indexed alone: the unique (audit, event) leads with it and
serves every read by audit (DECISIONS.md, "No index another one already covers").

Only the index changes (jobs.schema): Django's AlterField of the key's `db_index` would drop
the foreign key and add it again, checking every row under a lock that blocks writes.
On PostgreSQL the index is dropped CONCURRENTLY, so this migration is not atomic.
"""

import django.db.models.deletion
from django.db import migrations, models

from jobs.schema import column_indexes_dropped

# (table, column, the index's name as the field's `db_index` made it, for the reverse)
INDEXES = [("webhooks_delivery", "audit_id", "webhooks_delivery_audit_id_f6624095")]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("audits", "0026_link_check_audit_index_covered"),
        ("webhooks", "0003_delivery_job_row"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[column_indexes_dropped(INDEXES)],
            state_operations=[
                migrations.AlterField(
                    model_name="delivery",
                    name="audit",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="deliveries",
                        to="audits.audit",
                    ),
                ),
            ],
        ),
    ]
