"""Fixtures of the fault tests: `db_proxy`, PostgreSQL behind a proxy a test can cut."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.faults.outages import CuttableProxy


@pytest.fixture
def db_proxy(transactional_db):
    if connection.vendor != "postgresql":
        pytest.skip("the database outage test needs PostgreSQL (SQLite is a file, not a server)")
    db = connection.settings_dict
    proxy = CuttableProxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)))
    yield proxy
    proxy.close()
