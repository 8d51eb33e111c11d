"""Uniqueness and the page domain's index declared in Meta, and the indexes for LIKE that
the fields' own `unique` and `db_index` made on PostgreSQL dropped: nothing filters these
columns by a pattern, yet every new page, distinct link, origin and token wrote them
(DECISIONS.md, "No index for LIKE").

The unique constraints and the domain's index stay as they are, under the names they
already have, which Meta now gives them: only the migration state changes for them, so no
index of a large table is built again. Reversed, the fields get their `unique` and
`db_index` back in the state and the indexes for LIKE stay dropped: nothing reads them.
"""

from django.db import migrations, models

TABLES = ["audits_page", "audits_sharedlink", "audits_robotstxt", "audits_apitoken"]
PATTERN_INDEXES = """
SELECT index.relname FROM pg_index
JOIN pg_class AS index ON index.oid = pg_index.indexrelid
JOIN pg_class AS tbl ON tbl.oid = pg_index.indrelid
WHERE tbl.relname = ANY (%s) AND pg_table_is_visible(tbl.oid)
  AND EXISTS (SELECT 1 FROM pg_opclass WHERE pg_opclass.oid = ANY (pg_index.indclass::oid[])
              AND pg_opclass.opcname IN ('varchar_pattern_ops', 'text_pattern_ops'))
"""


def drop_pattern_indexes(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return  # only PostgreSQL's backend makes them
    with connection.cursor() as cursor:
        cursor.execute(PATTERN_INDEXES, [TABLES])
        names = [name for (name,) in cursor.fetchall()]
    for name in names:
        schema_editor.execute(f"DROP INDEX {schema_editor.quote_name(name)}")


class Migration(migrations.Migration):
    dependencies = [
        ("audits", "0023_page_timestamp_indexes_only_stamped"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunPython(drop_pattern_indexes, migrations.RunPython.noop),
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="apitoken",
                    name="key_hash",
                    field=models.CharField(editable=False, max_length=64),
                ),
                migrations.AlterField(
                    model_name="page",
                    name="domain",
                    field=models.CharField(max_length=255),
                ),
                migrations.AlterField(
                    model_name="page",
                    name="url",
                    field=models.CharField(max_length=2048),
                ),
                migrations.AlterField(
                    model_name="robotstxt",
                    name="origin",
                    field=models.CharField(max_length=2048),
                ),
                migrations.AlterField(
                    model_name="sharedlink",
                    name="url",
                    field=models.CharField(max_length=2048),
                ),
                migrations.AddIndex(
                    model_name="page",
                    index=models.Index(fields=["domain"], name="audits_page_domain_444f01eb"),
                ),
                migrations.AddConstraint(
                    model_name="apitoken",
                    constraint=models.UniqueConstraint(
                        fields=("key_hash",), name="audits_apitoken_key_hash_key"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="page",
                    constraint=models.UniqueConstraint(fields=("url",), name="audits_page_url_key"),
                ),
                migrations.AddConstraint(
                    model_name="robotstxt",
                    constraint=models.UniqueConstraint(
                        fields=("origin",), name="audits_robotstxt_origin_key"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="sharedlink",
                    constraint=models.UniqueConstraint(
                        fields=("url",), name="audits_sharedlink_url_key"
                    ),
                ),
            ],
        ),
    ]
