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


def to_keyed_only(apps, schema_editor):
    audit = apps.get_model("audits", "Audit")
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.remove_constraint(audit, EVERY_AUDIT)
        schema_editor.add_constraint(audit, KEYED_ONLY)
        return
    table, building, name = (
        schema_editor.quote_name(n) for n in (audit._meta.db_table, BUILDING, NAME)
    )
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {building}")
    schema_editor.execute(
        f"CREATE UNIQUE INDEX CONCURRENTLY {building} ON {table} (idempotency_key) "
        "WHERE idempotency_key IS NOT NULL"
    )
    schema_editor.remove_constraint(audit, EVERY_AUDIT)
    schema_editor.execute(f"ALTER INDEX {building} RENAME TO {name}")


def to_every_audit(apps, schema_editor):
    audit = apps.get_model("audits", "Audit")
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.remove_constraint(audit, KEYED_ONLY)
        schema_editor.add_constraint(audit, EVERY_AUDIT)
        return
    table, building, name = (
        schema_editor.quote_name(n) for n in (audit._meta.db_table, BUILDING, NAME)
    )
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {building}")
    schema_editor.execute(
        f"CREATE UNIQUE INDEX CONCURRENTLY {building} ON {table} (idempotency_key)"
    )
    schema_editor.execute(f"DROP INDEX CONCURRENTLY {name}")
    schema_editor.execute(
        f"ALTER TABLE {table} ADD CONSTRAINT {name} UNIQUE USING INDEX {building}"
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
