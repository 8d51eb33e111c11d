"""DATABASE_URL as Django's DATABASES entry: one host, or libpq's list of hosts."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.devservices import free_port, postgres_answers
from config.env import database_config


def test_a_multi_host_url_gives_libpq_its_host_and_port_lists_and_options():
    config = database_config(
        "postgres://plumb:s%40cret@db1.internal:5432,db2.internal:5433/plumb"
        "?target_session_attrs=read-write&connect_timeout=3",
        conn_max_age=0,
        conn_health_checks=True,
    )
    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert (config["USER"], config["PASSWORD"], config["NAME"]) == ("plumb", "s@cret", "plumb")
    assert (config["HOST"], config["PORT"]) == ("db1.internal,db2.internal", "5432,5433")
    assert config["OPTIONS"] == {"target_session_attrs": "read-write", "connect_timeout": 3}
    assert config["CONN_HEALTH_CHECKS"] is True


def test_hosts_without_ports_and_ipv6_hosts_are_read_as_libpq_reads_them():
    config = database_config("postgresql://u@[::1]:6432,db2/app")
    assert config["HOST"] == "::1,db2"
    assert config["PORT"] == "6432,"  # the empty one: libpq's default, 5432


def test_a_single_host_url_is_parsed_as_before():
    config = database_config("postgres://u:p@db.internal:6543/app?sslmode=require")
    assert (config["HOST"], config["PORT"], config["NAME"]) == ("db.internal", 6543, "app")
    assert config["OPTIONS"] == {"sslmode": "require"}


def test_several_hosts_for_another_database_are_refused_by_name():
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        database_config("mysql://u@h1:3306,h2:3306/app")


def test_the_postgres_probe_reads_a_multi_host_url_and_moves_past_a_dead_host():
    dead = free_port()  # nothing listens there
    assert not postgres_answers(f"postgres://postgres@127.0.0.1:{dead}/postgres", timeout=1)
    assert postgres_answers(
        f"postgres://postgres@127.0.0.1:{dead},127.0.0.1:5432/postgres?target_session_attrs=read-write"
    ) == postgres_answers("postgres://postgres@127.0.0.1:5432/postgres")
