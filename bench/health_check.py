#!/usr/bin/env python
"""What a kept connection's health check costs: Django's `SELECT 1` against config.postgresql's
look at the socket, alone and inside a submission, alternated in one run.

    REDIS_URL=redis://127.0.0.1:6379/11 \\
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/plumb \\
    .venv/bin/python bench/health_check.py --flush

1. `connection.is_usable()` on a live connection, each way: CPU a call (rounds of 500).
2. POST /api/audits through Django's WSGI handler in this process, request signals
   included (so Django checks the kept connection before each request, as behind the web
   server), in blocks of 100 requests, the two checks taking turns block by block: CPU and
   wall time a request, and the paired ratio of each block to the one beside it.

PostgreSQL only. It creates its own database on the DATABASE_URL server (Django's
test-database machinery, bench.inprocess: `..._bench_health_check`) and drops it at the end; a
submission publishes to REDIS_URL, which must name a Redis database it may empty: it
refuses a non-empty one unless given --flush.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import math
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# As a deployment runs: DEBUG off (no query log), with a key of its own.
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", "bench-health-check-" + secrets.token_urlsafe(48))

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.handlers.wsgi import WSGIHandler  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.backends.postgresql import base as django_postgresql  # noqa: E402

from audits.models import Audit  # noqa: E402
from bench.inprocess import own_stores  # noqa: E402
from config.celery_app import queue_list_keys  # noqa: E402
from config.postgresql.base import DatabaseWrapper  # noqa: E402

CHECKS = {
    "SELECT 1 (Django's)": django_postgresql.DatabaseWrapper.is_usable,
    "the socket (config.postgresql)": DatabaseWrapper.is_usable,
}


def use(check) -> None:
    DatabaseWrapper.is_usable = check


def bench_check_alone(rounds: int = 10, calls: int = 500) -> dict[str, float]:
    connection.ensure_connection()
    cpu: dict[str, list[float]] = {name: [] for name in CHECKS}
    for _ in range(rounds):
        for name, check in CHECKS.items():
            started = time.process_time()
            for _ in range(calls):
                assert check(connection)
            cpu[name].append((time.process_time() - started) / calls * 1e6)
    return {name: statistics.median(values) for name, values in cpu.items()}


def submission_environ(n: int) -> dict:
    body = json.dumps({"url": f"https://bench.example/{n}"}).encode()
    return {
        "REQUEST_METHOD": "POST", "PATH_INFO": "/api/audits", "SCRIPT_NAME": "",
        "QUERY_STRING": "", "SERVER_NAME": "localhost", "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1", "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)), "HTTP_HOST": "localhost", "REMOTE_ADDR": "127.0.0.1",
        "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr, "wsgi.url_scheme": "http",
        "wsgi.multithread": True, "wsgi.multiprocess": True, "wsgi.run_once": False,
        "wsgi.version": (1, 0),
    }  # fmt: skip


def bench_submissions(client, *, blocks: int, per_block: int = 100) -> dict:
    """Blocks of `per_block` submissions, the checks in turn (each order as often); the
    first pair of blocks warms up and is not recorded."""
    settings.AUDIT_SUBMIT_BURST = 10**9
    settings.AUDIT_QUEUE_MAX_DEPTH = 10**9
    handler = WSGIHandler()
    statuses: list[str] = []

    def start_response(status, headers, exc_info=None):
        statuses.append(status)

    names = list(CHECKS)
    cpu: dict[str, list[float]] = {name: [] for name in names}
    wall: dict[str, list[float]] = {name: [] for name in names}
    n = 0
    for block in range(blocks + 1):
        for name in names if block % 2 == 0 else names[::-1]:
            use(CHECKS[name])
            statuses.clear()
            started_cpu, started_wall = time.process_time(), time.perf_counter()
            for _ in range(per_block):
                response = handler(submission_environ(n), start_response)
                b"".join(response)
                response.close()
                n += 1
            if block:
                cpu[name].append((time.process_time() - started_cpu) / per_block * 1e3)
                wall[name].append((time.perf_counter() - started_wall) / per_block * 1e3)
            assert all(status.startswith("202") for status in statuses), statuses[:3]
        # The one client holds at most a share of queued audits; the queue stays short.
        Audit.objects.filter(status=Audit.Status.QUEUED).update(status=Audit.Status.SUCCEEDED)
        client.delete(*queue_list_keys(settings.AUDIT_QUEUE))
    use(CHECKS["the socket (config.postgresql)"])
    ratios = [ours / django for django, ours in zip(*cpu.values(), strict=True)]
    return {
        "cpu_ms": {name: statistics.median(values) for name, values in cpu.items()},
        "wall_ms": {name: statistics.median(values) for name, values in wall.items()},
        "cpu_ratio": math.exp(statistics.fmean(math.log(r) for r in ratios)),
        "blocks": blocks,
        "per_block": per_block,
    }


def report(alone: dict, submissions: dict) -> str:
    lines = [
        "| health check | `is_usable()`, us of CPU | a submission, ms of CPU | a submission, ms wall |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name in CHECKS:
        lines.append(
            f"| {name} | {alone[name]:.0f} | {submissions['cpu_ms'][name]:.2f} "
            f"| {submissions['wall_ms'][name]:.2f} |"
        )
    lines.append(
        f"\n{submissions['blocks']} blocks of {submissions['per_block']} submissions each way, "
        f"alternated: CPU a submission with the socket check {submissions['cpu_ratio']:.3f}x "
        f"of that with `SELECT 1` (geometric mean of the paired blocks)."
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flush", action="store_true", help="empty REDIS_URL's database first")
    parser.add_argument("--blocks", type=int, default=60, help="blocks of 100 submissions each way")
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        print("bench/health_check.py measures PostgreSQL's check: set DATABASE_URL=postgres://...")
        return 2
    # A log line a request would dominate the output; both checks lose the same cost.
    logging.getLogger().setLevel(logging.WARNING)
    with own_stores("bench_health_check", flush=args.flush, flag="--flush") as client:
        alone = bench_check_alone()
        submissions = bench_submissions(client, blocks=args.blocks)
    print(report(alone, submissions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
