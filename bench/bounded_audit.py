#!/usr/bin/env python
"""An audits worker's memory under pages of 200,000 links, or other hostile shapes (issue 31.5).

    .venv/bin/python bench/bounded_audit.py [--pages 12] [--anchors 200000] [--workers 1]
    .venv/bin/python bench/bounded_audit.py --shape comments   # or nuls, stray-lt, attributes

What it starts: a redis-server of its own, a fresh database (next to DATABASE_URL's
PostgreSQL, the local one when unset, else an SQLite file), one HTTP server on 127.0.0.1
serving each page from its own loopback address (127.0.0.2, 127.0.0.3, ...: one host a
page, so no page waits for another's host slots), and the audits workers as `make run`
starts them (`devstack` `stack_commands`: the threads pool, AUDITS_WORKER_CONCURRENCY
threads; `--workers` of them, one by default so every page lands on the same worker).

Each page is --anchors distinct same-host anchors (`<a href=/page/i>x</a>`, 4.6 MB
for 200,000), the shape of the security review's finding; or, with --shape, 5 MiB of one
piece of markup after a title: `comments` (`<!-->`, a node each), `nuls` (a parse error
each), `stray-lt` (`<` and a byte opening no tag: a parse error each), `attributes` (one
tag of duplicate attributes, ` a` each, whose tree a worker's tree builder builds:
audits.treebuild). All pages are submitted at once (audits.submission.submit_audit,
committed together); then it samples each worker's resident memory and its tree builders'
(the processes under it, psutil, every 0.1 s) until every audit has finished, and for 5 s
more.

Reported: each worker's RSS before, at its peak and after, and its builders' peak (the
sum of their RSS: pages they share with their fork server counted in each); each audit's
outcome, the
time its run took (attempt_started_at to finished_at) against the task's soft time limit, and
its link counts. Goals: each worker within 500 MB, each audit succeeded within its limit.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.services import PrivateRedis, QuietHandler, create_database  # noqa: E402

GOAL_RSS_BYTES = 500 * 1000 * 1000


def link_page(page: int, anchors: int) -> bytes:
    links = "".join(f"<a href=/{page}/{i}>x</a>" for i in range(anchors))
    return f"<!doctype html><title>Page {page}</title>{links}".encode()


# --shape: what a 5 MiB page opens with after its title, and the piece of markup it then
# repeats: comments, NULs, `<` opening nothing, or one tag's duplicate attributes.
SHAPES = {
    "comments": (b"", b"<!-->"),
    "nuls": (b"", b"\x00"),
    "stray-lt": (b"", b"<\x01"),
    "attributes": (b"<p", b" a"),
}
SHAPE_BYTES = 5 * 1024 * 1024


def shaped_page(page: int, shape: tuple[bytes, bytes]) -> bytes:
    opening, markup = shape
    head = f"<title>Page {page}</title>".encode() + opening
    return head + markup * ((SHAPE_BYTES - len(head)) // len(markup))


def builders_rss(worker) -> int:
    """The resident memory of every process under `worker` (its tree builders)."""
    total = 0
    for process in worker.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total


class PageHandler(QuietHandler):
    def do_GET(self):
        page = urlsplit(self.path).path.strip("/")
        body = self.server.pages.get(page, b"<title>Target</title>")
        self.send_html(200, body)


class PageServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: str, pages: dict[str, bytes]):
        super().__init__((address, 0), PageHandler)
        self.pages = pages

    def handle_error(self, request, client_address):
        pass


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pages", type=int, default=12)
    parser.add_argument("--anchors", type=int, default=200_000)
    parser.add_argument("--shape", choices=["anchors", *SHAPES], default="anchors")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for all audits")
    args = parser.parse_args()

    redis_server = PrivateRedis().start()
    database_url, drop_database = create_database()
    logs = Path(tempfile.mkdtemp(prefix="plumb-bench-bounded-"))
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DEBUG": "true",
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_server.url,
        "AUDIT_ALLOW_PRIVATE_TARGETS": "true",
        "PYTHONUNBUFFERED": "1",
    }
    os.environ.update(env)
    workers = []
    servers = []
    try:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
            cwd=ROOT, env=env, check=True,
        )  # fmt: skip
        import django

        django.setup()
        from django.conf import settings
        from django.db import transaction

        from audits.models import AUDIT_JOB, Audit
        from audits.submission import submit_audit
        from bench.services import SessionProcess
        from devstack.management.commands.runstack import stack_commands
        from outbound.urls import normalize_url

        pages = {
            str(n): link_page(n, args.anchors)
            if args.shape == "anchors"
            else shaped_page(n, SHAPES[args.shape])
            for n in range(args.pages)
        }
        for n in range(args.pages):
            server = PageServer(f"127.0.0.{n + 2}", pages)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            servers.append(server)

        commands = stack_commands()
        for n in range(1, args.workers + 1):
            command = commands["worker-audits-1"].replace("audits-1@", f"audits-{n}@")
            workers.append(SessionProcess(f"worker-audits-{n}", command, env, logs).start())
        ready = time.monotonic() + 60
        while time.monotonic() < ready and not all(
            " ready." in (logs / f"{worker.name}.log").read_text() for worker in workers
        ):
            time.sleep(0.2)
        processes = {worker.name: psutil.Process(worker.popen.pid) for worker in workers}
        before = {name: process.memory_info().rss for name, process in processes.items()}
        peak = dict(before)
        builders_peak = {name: builders_rss(process) for name, process in processes.items()}
        print(
            f"{args.pages} pages of "
            f"{f'{args.anchors:,} same-host anchors' if args.shape == 'anchors' else args.shape} "
            f"({len(pages['0']):,} bytes each); {args.workers} audits worker(s): "
            f"--pool {settings.AUDITS_WORKER_POOL} "
            f"--concurrency {settings.AUDITS_WORKER_CONCURRENCY}; logs in {logs}"
        )

        with transaction.atomic():  # committed together: published at once
            audits = [
                submit_audit(normalize_url(f"http://127.0.0.{n + 2}:{server.server_port}/{n}"))
                for n, server in enumerate(servers)
            ]
        submitted = time.monotonic()
        ids = [audit.id for audit in audits]
        settle_until = None
        while True:
            for name, process in processes.items():
                with contextlib.suppress(psutil.NoSuchProcess):
                    peak[name] = max(peak[name], process.memory_info().rss)
                    builders_peak[name] = max(builders_peak[name], builders_rss(process))
            now = time.monotonic()
            if settle_until is None:
                unfinished = Audit.objects.filter(id__in=ids).exclude(status__in=Audit.FINISHED)
                if not unfinished.exists():
                    elapsed = now - submitted
                    settle_until = now + 5
                elif now - submitted > args.timeout:
                    elapsed = now - submitted
                    print(f"audits unfinished after {args.timeout:g} s")
                    break
            elif now > settle_until:
                break
            time.sleep(0.1)
        after = {}
        for name, process in processes.items():
            try:
                after[name] = process.memory_info().rss
            except psutil.NoSuchProcess:
                after[name] = 0

        mb = 1000 * 1000
        print(
            "\n| worker | RSS before (MB) | peak (MB) | after (MB) | within 500 MB "
            "| its tree builders' peak (MB) |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        for name in processes:
            print(
                f"| {name} | {before[name] / mb:.0f} | {peak[name] / mb:.0f} | "
                f"{after[name] / mb:.0f} | {'yes' if peak[name] <= GOAL_RSS_BYTES else 'NO'} | "
                f"{builders_peak[name] / mb:.0f} |"
            )
        print(
            f"\n| audit | status | run (s) | within {AUDIT_JOB.deadline.soft:g} s "
            "| internal links | links_truncated | error |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |")
        ok = True
        rows = Audit.objects.filter(id__in=ids).order_by("created_at", "id")
        for number, audit in enumerate(rows, 1):
            run = (
                (audit.finished_at - audit.attempt_started_at).total_seconds()
                if audit.finished_at and audit.attempt_started_at
                else None
            )
            result = audit.result or {}
            counts = result.get("link_counts") or {}
            within = run is not None and run <= AUDIT_JOB.deadline.soft
            ok = ok and within and audit.status == Audit.Status.SUCCEEDED
            print(
                f"| {number} | {audit.status} | {'-' if run is None else f'{run:.1f}'} | "
                f"{'yes' if within else 'NO'} | {counts.get('internal', '-')} | "
                f"{result.get('links_truncated', '-')} | {audit.error[:80]} |"
            )
        ok = ok and all(value <= GOAL_RSS_BYTES for value in peak.values())
        print(f"\nall finished {elapsed:.1f} s after submitting; goals met: {ok}")
        return 0 if ok else 1
    finally:
        for worker in workers:
            worker.stop()
        for server in servers:
            server.shutdown()
            server.server_close()
        from django.db import connections

        connections.close_all()
        drop_database()
        redis_server.stop()


if __name__ == "__main__":
    sys.exit(main())
