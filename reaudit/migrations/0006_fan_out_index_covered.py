"""A placement's and a slice run's fan-out are not indexed alone: their unique (fan_out,
page) and (fan_out, index), and the placements' (fan_out, slice_index), lead with it and
serve every read by fan-out (DECISIONS.md, "No index another one already covers").

Only the index changes (jobs.schema): Django's AlterField of the key's `db_index` would drop
the foreign key and add it again, checking every row under a lock that blocks writes.
On PostgreSQL the index is dropped CONCURRENTLY, so this migration is not atomic.
"""

import django.db.models.deletion
from django.db import migrations, models

from jobs.schema import column_indexes_dropped

# (table, column, the index's name as the field's `db_index` made it, for the reverse)
INDEXES = [
    ("reaudit_placement", "fan_out_id", "reaudit_placement_fan_out_id_eda77e8f"),
    ("reaudit_slicerun", "fan_out_id", "reaudit_slicerun_fan_out_id_869e982f"),
]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("reaudit", "0005_catch_up_entry_removed"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[column_indexes_dropped(INDEXES)],
            state_operations=[
                migrations.AlterField(
                    model_name="placement",
                    name="fan_out",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="placements",
                        to="reaudit.fanout",
                    ),
                ),
                migrations.AlterField(
                    model_name="slicerun",
                    name="fan_out",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="slice_runs",
                        to="reaudit.fanout",
                    ),
                ),
            ],
        ),
    ]
