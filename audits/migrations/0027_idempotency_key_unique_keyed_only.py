"""The idempotency key's unique index holds keyed audits only (DECISIONS.md, "The
idempotency key's index holds keyed audits only"): a submitted audit has no key, and
PostgreSQL's unique index wrote a NULL entry for it on every insert, claim and finish that
no lookup reads.

On PostgreSQL the partial index is built beside the constraint without blocking writes
(CONCURRENTLY, so this migration is not atomic), then the constraint is dropped and the
index takes its name. A build that failed half-way leaves an invalid index under the
temporary name, which the next run drops first. SQLite rebuilds it in place.
"""

from django.db import migrations, models

NAME = "audit_idempotency_key_unique"
EVERY_AUDIT = models.UniqueConstraint(fields=["idempotency_key"], name=NAME)
KEYED_ONLY = models.UniqueConstraint(
    fields=["idempotency_key"], condition=models.Q(idempotency_key__isnull=False), name=NAME
)
BUILDING = "audit_idempotency_key_new"


def swap(old: models.UniqueConstraint, new: models.UniqueConstraint, *postgresql: str):
    """SQLite: `old` dropped, `new` added. PostgreSQL: a leftover of a failed build dropped,
    then the `postgresql` statements, written with {table}, {building} and {name}."""

    def run(apps, schema_editor):
        audit = apps.get_model("audits", "Audit")
        if schema_editor.connection.vendor != "postgresql":
            schema_editor.remove_constraint(audit, old)
            schema_editor.add_constraint(audit, new)
            return
        names = {
            "table": schema_editor.quote_name(audit._meta.db_table),
            "building": schema_editor.quote_name(BUILDING),
            "name": schema_editor.quote_name(NAME),
        }
        schema_editor.execute("DROP INDEX CONCURRENTLY IF EXISTS {building}".format(**names))
        for statement in postgresql:
            schema_editor.execute(statement.format(**names))

    return run


to_keyed_only = swap(
    EVERY_AUDIT,
    KEYED_ONLY,
    "CREATE UNIQUE INDEX CONCURRENTLY {building} ON {table} (idempotency_key) "
    "WHERE idempotency_key IS NOT NULL",
    "ALTER TABLE {table} DROP CONSTRAINT {name}",
    "ALTER INDEX {building} RENAME TO {name}",
)
to_every_audit = swap(
    KEYED_ONLY,
    EVERY_AUDIT,
    "CREATE UNIQUE INDEX CONCURRENTLY {building} ON {table} (idempotency_key)",
    "DROP INDEX CONCURRENTLY {name}",
    "ALTER TABLE {table} ADD CONSTRAINT {name} UNIQUE USING INDEX {building}",
)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("audits", "0026_link_check_audit_index_covered"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(to_keyed_only, to_every_audit)],
            state_operations=[
                migrations.RemoveConstraint(model_name="audit", name=NAME),
                migrations.AddConstraint(model_name="audit", constraint=KEYED_ONLY),
            ],
        ),
    ]
