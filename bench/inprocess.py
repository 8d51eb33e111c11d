"""The stores of a benchmark that runs Django in its own process (imported after
django.setup()): a database of its own and an emptied Redis database.

`own_stores(suffix, flush=..., flag=...)` creates a database next to DATABASE_URL's with
Django's test machinery (`<name>_<suffix>`, migrated; a file in VAR_DIR on SQLite) and drops
it at the end, and empties REDIS_URL's database before and after, refusing one that holds
keys unless the script was given `flag` (its runs would mix with whatever is there).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import redis
from django.conf import settings
from django.db import connection
from django.test.utils import setup_databases, teardown_databases

from config.redis import redis_client


@contextlib.contextmanager
def own_stores(suffix: str, *, flush: bool, flag: str) -> Iterator[redis.Redis]:
    """The bench's own database for the duration, and REDIS_URL's database emptied; yields
    the Redis client. Exits (status 2) when that Redis holds keys and `flush` is false."""
    client = redis_client()
    if client.dbsize() and not flush:
        print(f"{settings.REDIS_URL} holds keys; this script empties it. Use {flag}.",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    client.flushdb()
    if connection.vendor == "sqlite":
        name = str(Path(settings.VAR_DIR) / f"{suffix}.sqlite3")
    else:
        name = f"{connection.settings_dict['NAME']}_{suffix}"
    connection.settings_dict.setdefault("TEST", {})["NAME"] = name
    databases = setup_databases(verbosity=0, interactive=False)
    try:
        yield client
    finally:
        connection.close()
        teardown_databases(databases, verbosity=0)
        client.flushdb()
