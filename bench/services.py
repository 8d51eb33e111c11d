"""The services a benchmark needs, set up before Django starts.

- `ensure_database()`: DATABASE_URL's PostgreSQL database, created when missing (a
  fresh machine has the server but not the benchmark's database).
- `start_redis()`: REDIS_URL when set, else a throwaway redis-server on a free port.
- `create_database()`: a fresh database next to DATABASE_URL's (PostgreSQL, the local
  one when DATABASE_URL is not set) or a temporary SQLite file, with its dropper.
- `QuietHandler`: the base of a benchmark's downstream site on 127.0.0.1.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from config import devservices

LOCAL_POSTGRES = "postgres://postgres@127.0.0.1:5432/postgres"


def _server_connection(url: str):
    """An autocommit connection to the `postgres` database of `url`'s server."""
    import psycopg

    return psycopg.connect(urlunsplit(urlsplit(url)._replace(path="/postgres")), autocommit=True)


def ensure_database(url: str | None = None) -> None:
    """Create DATABASE_URL's PostgreSQL database when it does not exist yet."""
    url = url or os.environ.get("DATABASE_URL", "")
    name = urlsplit(url).path.lstrip("/")
    if not url.startswith(("postgres://", "postgresql://")) or not name:
        return
    with _server_connection(url) as connection:
        exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        if not exists.fetchone():
            connection.execute(f'CREATE DATABASE "{name}"')
            print(f"created database {name}")


def start_redis():
    """(process or None, url): REDIS_URL if set, else a redis-server of our own."""
    url = os.environ.get("REDIS_URL")
    if url:
        return None, url
    port = devservices.free_port()
    process = devservices.start_redis(port, Path(tempfile.mkdtemp(prefix="plumb-bench-redis-")))
    return process, f"redis://127.0.0.1:{port}/0"


def create_database(*, sqlite_fallback: bool = True):
    """(url, drop): a new, empty database; call `drop()` when done."""
    url = os.environ.get("DATABASE_URL")
    if url is None and devservices.postgres_answers(LOCAL_POSTGRES):
        url = LOCAL_POSTGRES
    if url is None or not url.startswith(("postgres://", "postgresql://")):
        if not sqlite_fallback:
            raise SystemExit("this benchmark needs PostgreSQL: set DATABASE_URL=postgres://...")
        path = Path(tempfile.mkdtemp(prefix="plumb-bench-db-")) / "bench.sqlite3"
        return f"sqlite:///{path}", lambda: None

    name = f"plumb_bench_{uuid.uuid4().hex[:8]}"
    with _server_connection(url) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')

    def drop():
        with _server_connection(url) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return urlunsplit(urlsplit(url)._replace(path=f"/{name}")), drop


class QuietHandler(BaseHTTPRequestHandler):
    """A downstream's request handler: no access log, and a client that gave up is no error."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def send_html(self, status: int, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out first: that is what a slow downstream is for
