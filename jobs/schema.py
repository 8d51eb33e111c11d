"""Index changes that a migration makes on tables that may be large.

Django's AlterField of a foreign key's `db_index` drops the key's constraint and adds it
again, and PostgreSQL then checks every row of the table under a lock that blocks its
writes. These change the index alone. On PostgreSQL they build and drop CONCURRENTLY,
without blocking writes (a migration using them sets `atomic = False`); SQLite has
nothing to wait for.
"""

from __future__ import annotations

from django.db import migrations


def _concurrently(schema_editor) -> str:
    return " CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""


def column_indexes(schema_editor, table: str, column: str) -> list[str]:
    """The indexes of `table` on `column` alone that enforce nothing (not unique, not the
    primary key), found by introspection: their names vary with a table's history."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    return sorted(
        name
        for name, info in constraints.items()
        if info["index"] and not info["unique"] and not info["primary_key"]
        and info["columns"] == [column]
    )  # fmt: skip


def drop_column_indexes(schema_editor, table: str, column: str) -> None:
    """Drop `column_indexes(table, column)`."""
    for name in column_indexes(schema_editor, table, column):
        schema_editor.execute(
            f"DROP INDEX{_concurrently(schema_editor)} {schema_editor.quote_name(name)}"
        )


def create_column_index(schema_editor, table: str, column: str, name: str) -> None:
    """An index `name` of `table` on `column` alone, as a field's `db_index` makes one."""
    quote = schema_editor.quote_name
    schema_editor.execute(
        f"CREATE INDEX{_concurrently(schema_editor)} IF NOT EXISTS {quote(name)} "
        f"ON {quote(table)} ({quote(column)})"
    )


def column_indexes_dropped(indexes: list[tuple[str, str, str]]) -> migrations.RunPython:
    """A migration's step dropping each (table, column, name)'s index on the column alone
    (`drop_column_indexes`); reversed, it builds each again as `name`."""

    def drop(apps, schema_editor):
        for table, column, _name in indexes:
            drop_column_indexes(schema_editor, table, column)

    def restore(apps, schema_editor):
        for table, column, name in indexes:
            create_column_index(schema_editor, table, column, name)

    return migrations.RunPython(drop, restore)
