"""A kept PostgreSQL connection is checked before each request and task on its socket, not
with a round trip (config.postgresql), and one the server ended is still replaced."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from tests.workers import wait_for

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's sessions"),
    pytest.mark.django_db(transaction=True),
]


def observer() -> psycopg.Connection:
    """A connection of the test's own, outside Django's, to watch the server's sessions."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("prepare_threshold", None)
    return psycopg.connect(**params, autocommit=True)


def last_statement(watcher: psycopg.Connection, pid: int) -> str | None:
    row = watcher.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    return None if row is None else row[0]


def a_new_request_checks_the_connection() -> None:
    """What Django does around each request and each task (close_old_connections), then
    the check that comes before the first statement."""
    connection.close_if_unusable_or_obsolete()
    connection.close_if_health_check_failed()


def test_a_kept_connection_is_checked_without_a_statement():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'the request before'")
    pid = connection.connection.info.backend_pid
    with observer() as watcher:
        assert last_statement(watcher, pid) == "SELECT 'the request before'"
        a_new_request_checks_the_connection()
        assert connection.connection is not None  # kept: found usable
        assert connection.connection.info.backend_pid == pid
        # Nothing reached the server: Django's own check would have run `SELECT 1` here.
        assert last_statement(watcher, pid) == "SELECT 'the request before'"


def test_a_kept_connection_the_server_ended_is_replaced_before_the_next_statement():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    pid = connection.connection.info.backend_pid
    with observer() as watcher:
        watcher.execute("SELECT pg_terminate_backend(%s)", [pid])
        wait_for(lambda: last_statement(watcher, pid) is None, timeout=10,
                 message="the ended session to leave the server")  # fmt: skip
    a_new_request_checks_the_connection()
    assert connection.connection is None  # found unusable and closed, not used
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != pid


def test_a_kept_connection_left_inside_a_transaction_is_not_reused():
    # Autocommit off without Django's knowledge (raw SQL, a library): Django's
    # `SELECT 1` would have passed inside the open transaction.
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    connection.connection.execute("BEGIN")
    a_new_request_checks_the_connection()
    assert connection.connection is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != pid
