"""How a test that commits (transactional_db, live_server, a test with real workers) leaves
the test database for the next one: every table of the apps emptied by DELETEs in one
transaction, the content types and permissions kept.

Django's TransactionTestCase ends each such test with `flush`: a TRUNCATE of every table
(on PostgreSQL, new files for 33 tables and their indexes) and then the post_migrate signal,
which creates the content types and permissions again, each in a commit of its own. That is
420 ms of wall time a test on the test machine's PostgreSQL, most of it waiting on the
server; the DELETEs of tables a test left nearly empty take 3 ms (DECISIONS.md, "A
committing test's database is emptied by DELETEs"). Django's foreign keys are deferrable
(checked at commit), so the order of the DELETEs does not matter. Kept rows keep their ids,
so ContentType's cache stays right; sequences are not reset, as flush does not reset them.

`TransactionTestCase._fixture_teardown` is Django's private hook; `install` replaces it for
the suite, and tests/test_database_reset.py pins the version reviewed.
"""

from __future__ import annotations

from django.apps.registry import Apps
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection, connections, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test import TransactionTestCase

# Rows the apps' migrations and post_migrate made, the same before and after every test.
KEPT_TABLES = frozenset({ContentType._meta.db_table, Permission._meta.db_table})


def empty_tables(using: str = "default") -> None:
    """Delete every row of the apps' tables on `using`, except KEPT_TABLES, in one transaction."""
    connection = connections[using]
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    quote = connection.ops.quote_name
    with transaction.atomic(using=using), connection.cursor() as cursor:
        for table in sorted(set(tables) - KEPT_TABLES):
            cursor.execute(f"DELETE FROM {quote(table)}")


# Django's own: a flush (TRUNCATE, then post_migrate), reviewed as of Django 5.2.
DJANGO_FIXTURE_TEARDOWN = TransactionTestCase._fixture_teardown


def _fixture_teardown(self: TransactionTestCase) -> None:
    if self.available_apps is not None or self.serialized_rollback or self.reset_sequences:
        # What those options ask of a flush (a subset of the apps, restored rows, restarted
        # sequences) is Django's to do; no test of this suite asks for them.
        return DJANGO_FIXTURE_TEARDOWN(self)
    for using in self._databases_names(include_mirrors=False):
        empty_tables(using)


def install() -> None:
    """Make every committing test end with `empty_tables` instead of Django's flush."""
    TransactionTestCase._fixture_teardown = _fixture_teardown


def migrate(targets: list[tuple[str, str | None]]) -> Apps:
    """The test database migrated (forwards or back) to `targets`, (app, migration) pairs
    (None: before the app's first); the models as they stand there (an app migrated back
    before its first has none)."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state([t for t in targets if t[1] is not None]).apps


def migrate_to_latest() -> None:
    """The test database back at the latest schema, whatever a test migrated it to."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
