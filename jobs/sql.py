"""Statements written once, run as the ORM runs its own.

The hot paths' SQL (a job's claim and finish, an audit's finish, robots.txt's freshness, a
submission, the client's holding) is written at import from the models' tables and columns,
not compiled by the ORM on every call. What the ORM does around a statement stays: Django's
cursor (its health check, its error classes, its query log), each value read back through
its field's converters. On PostgreSQL each is prepared once per connection: planning them
cost more than running them (DECISIONS.md, "The client's holding is one prepared statement",
"An attempt's statements are prepared").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import psycopg
from django.db.models.expressions import Col


def column(model, field_name: str) -> str:
    """The quoted column of `model`'s field, for a statement written from the model."""
    return f'"{model._meta.get_field(field_name).column}"'


class PreparingCursor(psycopg.Cursor):
    """psycopg's server-binding cursor, preparing what it runs: PostgreSQL parses and
    plans the statement once per connection, then each call only binds and executes.
    Django's own cursors bind client-side and never prepare (settings: prepare_threshold)."""

    def execute(self, query, params=None, *, prepare=True, **kwargs):
        return super().execute(query, params, prepare=prepare, **kwargs)


@contextlib.contextmanager
def preparing_cursor(connection) -> Iterator:
    """Django's cursor on `connection`, whose statements PostgreSQL prepares
    (PreparingCursor in Django's wrapper); SQLite runs them as Django's cursor does.

    Not while Django logs queries (DEBUG, a test capturing them): psycopg keeps no text
    for a statement prepared by an earlier cursor, so the log would hold None where the
    statement was. Logged, a statement is bound client-side as Django's own are, and the
    log holds it with its values, as run.
    """
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql" and not connection.queries_logged:
            cursor.cursor = PreparingCursor(cursor.connection)
        yield cursor


def pipelines(connection) -> bool:
    """Whether `connection` sends a statement and one before it in one round trip:
    PostgreSQL's pipeline mode (libpq 14 or later). Both are prepared, run in one
    transaction (it ends at the pipeline's Sync: outside a transaction block, they commit
    together), each with its own snapshot, so the second reads what committed while the
    first waited for a lock. SQLite runs one statement at a time."""
    return connection.vendor == "postgresql" and psycopg.Pipeline.is_supported()


def fetch_one(connection, sql: str, params: Sequence) -> tuple | None:
    """The first row `sql` answers with `params` (None if none), run through
    `preparing_cursor`."""
    with preparing_cursor(connection) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def column_converters(col: Col, connection) -> tuple[Col, list]:
    """`col` with the converters the ORM reads its values through on `connection`."""
    return col, connection.ops.get_db_converters(col) + col.get_db_converters(connection)


def converted(row: Sequence, converters: Sequence[tuple[Col, list]], connection) -> tuple:
    """`row` as the ORM would read it: each value through its column's converters."""
    values = []
    for value, (col, found) in zip(row, converters, strict=True):
        for converter in found:
            value = converter(value, col, connection)
        values.append(value)
    return tuple(values)
