#!/usr/bin/env python
"""A night of re-audits with and without validators, 90 % of the pages unchanged (issue 34.5).

    .venv/bin/python bench/conditional_night.py                  # 10,000 pages

What it starts: a page server in a process of its own on 127.0.0.1 (so its CPU is not the
worker's), serving --pages pages cut from the 30 real pages of the newspaper4k sdist
(tests/html_corpus.py), each with an ETag and a Last-Modified, answering a matching
If-None-Match (or If-Modified-Since) with 304 and no body, counting requests, 304s and
the bytes it sends (status line, headers and body); and a database of its own
(DATABASE_URL's server, PostgreSQL, created and dropped). Redis is REDIS_URL's (the page
fetch's host slots), which it empties (it refuses one that holds keys unless --flush-redis).

The audits run in this process, --threads at a time, through the audit function itself
(`audits.services.execute_audit`: claim, page fetch, analysis or carry-forward, finish
with its comparison): what a worker thread runs for an audit, without the broker. The
pages link to no other host (their external links are turned into internal ones), so
every audit finishes in that call: link checks are shared and measured elsewhere
(bench/shared_links.py).

Nights: first, every page audited once (the results the re-audits start from); then
--changed of the pages change and every page is re-audited with
AUDIT_CONDITIONAL_REAUDITS off (the full night); then another --changed change and every
page is re-audited with it on (the conditional night). Both re-audit nights see the same
share of changed pages. Reported per night: requests, 304s, bytes downloaded, this
process's CPU and its tree builders' (the fork server's and its children's, all from
/proc: the audit's Python, the database and Redis clients, a large page's
tree built in a child as an audits worker of threads builds it, audits.treebuild; not
PostgreSQL's or Redis's own CPU, nor the page server's) per re-audit, and wall time.
`--no-tree-builders` builds every tree in this process instead, as before 2026-12-08. Goals: the conditional
night's bytes at most 15 % and its CPU at most 40 % of the full night's.

--stages prints where the conditional night's CPU went, per re-audit: each thread's own
CPU (time.thread_time) in the audit's claim, its page fetch, the carry-forward of a 304
and its finish (`audits.services` and `Audit.objects.finish`), without a profiler's
inflation.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import multiprocessing
import os
import random
import re
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.services import create_database, family_cpu_seconds  # noqa: E402
from tests.html_corpus import corpus_pages  # noqa: E402

LAST_MODIFIED = "Sat, 05 Dec 2026 10:00:00 GMT"
SECURITY_HEADERS = (
    ("Content-Security-Policy", "default-src 'self'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
)
# An absolute or scheme-relative href (a `<base>`'s too), quoted or not: made a path here.
EXTERNAL_HREF = re.compile(rb"""(href\s*=\s*["']?)\s*(?:https?:)?//""", re.IGNORECASE)


class PageServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def handle_error(self, request, client_address):
        pass

    def __init__(self, port_out, versions, counters, bodies: list[bytes]):
        super().__init__(("127.0.0.1", 0), PageHandler)
        self.versions = versions  # a shared array: each page's version
        self.counters = counters  # a shared array: requests, not modified, bytes sent
        self.bodies = bodies
        port_out.value = self.server_address[1]


class PageHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: PageServer

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        number = int(urlsplit(self.path).path.rsplit("/", 1)[-1])
        version = self.server.versions[number]
        etag = f'"{number}-{version}"'
        modified = f"{LAST_MODIFIED[:-9]}{10 + version % 14:02d}:00:00 GMT"
        matched = (
            self.headers.get("If-None-Match") == etag
            if "If-None-Match" in self.headers
            else self.headers.get("If-Modified-Since") == modified
        )
        if matched:
            status, reason, body, extra = 304, "Not Modified", b"", ()
        else:
            template = self.server.bodies[number % len(self.server.bodies)]
            # A changed page changes its title (and so its result), as an edit would.
            body = template.replace(b"<title>", f"<title>v{version} ".encode(), 1)
            status, reason = 200, "OK"
            extra = (
                ("Content-Type", "text/html; charset=utf-8"),
                ("Content-Length", str(len(body))),
                *SECURITY_HEADERS,
            )
        head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(
            f"{name}: {value}\r\n"
            for name, value in (("ETag", etag), ("Last-Modified", modified), *extra)
        )
        if status == 304:
            head += "Content-Length: 0\r\n"
        payload = (head + "\r\n").encode() + body
        self.wfile.write(payload)
        with self.server.counters.get_lock():
            self.server.counters[0] += 1
            self.server.counters[1] += status == 304
            self.server.counters[2] += len(payload)


def serve(port_out, versions, counters, bodies) -> None:
    PageServer(port_out, versions, counters, bodies).serve_forever()


def page_bodies() -> list[bytes]:
    """The corpus's pages, their links to other hosts made internal (see the docstring)."""
    return [EXTERNAL_HREF.sub(rb"\1/elsewhere/", body) for body in corpus_pages().values()]


# The conditional night's stages for --stages: (label, owner, attribute).
STAGES = (
    ("claim", "audits.services", "claim_audit"),
    ("page fetch", "audits.services", "fetch"),
    ("carry-forward of a 304", "audits.services", "not_modified_result"),
    ("finish", "audits.models", "AuditQuerySet.finish"),
)


@contextmanager
def timed_stages(totals: Counter):
    """Add each stage's CPU (the calling thread's) to `totals` while the block runs."""
    import importlib

    lock = threading.Lock()
    restore = []
    for label, module_name, path in STAGES:
        owner = importlib.import_module(module_name)
        *parents, attribute = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        original = getattr(owner, attribute)

        def timed(*args, _original=original, _label=label, **kwargs):
            started = time.thread_time()
            try:
                return _original(*args, **kwargs)
            finally:
                spent = time.thread_time() - started
                with lock:
                    totals[_label] += spent

        setattr(owner, attribute, timed)
        restore.append((owner, attribute, original))
    try:
        yield
    finally:
        for owner, attribute, original in restore:
            setattr(owner, attribute, original)


def run_night(
    name: str,
    page_ids: list[int],
    trigger: str,
    counters,
    *,
    threads: int,
    profile: str = "",
    stages: Counter | None = None,
    cpu_clock=time.process_time,
) -> dict:
    from django.db import close_old_connections

    from audits import services
    from audits.models import Audit

    audits = Audit.objects.bulk_create(
        [Audit(page_id=pk, task_id=str(uuid.uuid4()), trigger=trigger) for pk in page_ids],
        batch_size=2000,
    )
    before = list(counters)
    profiler = cProfile.Profile(time.process_time) if profile else None
    if profiler is not None:
        threads = 1  # cProfile sees the thread that enabled it only
    timing = timed_stages(stages) if stages is not None else nullcontext()
    cpu, wall = cpu_clock(), time.monotonic()
    if profiler is not None:
        profiler.enable()
    with timing:
        if threads == 1:
            for audit in audits:
                services.execute_audit(str(audit.id))
        else:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda audit: services.execute_audit(str(audit.id)), audits))
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    cpu, wall = cpu_clock() - cpu, time.monotonic() - wall
    close_old_connections()
    after = list(counters)
    ids = [audit.id for audit in audits]
    finished = Audit.objects.filter(id__in=ids)
    return {
        "night": name,
        "audits": len(audits),
        "succeeded": finished.filter(status=Audit.Status.SUCCEEDED).count(),
        "not_modified": finished.filter(result__not_modified=True).count(),
        "changed": finished.exclude(changes=[]).exclude(changes=None).count(),
        "requests": after[0] - before[0],
        "answered_304": after[1] - before[1],
        "bytes": after[2] - before[2],
        "cpu_ms_per_audit": round(cpu * 1000 / len(audits), 2),
        "seconds": round(wall, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pages", type=int, default=10_000)
    parser.add_argument("--changed", type=float, default=0.10, help="share changed each night")
    parser.add_argument(
        "--threads", type=int, default=4, help="audits run at once, as a worker's threads"
    )
    parser.add_argument("--flush-redis", action="store_true", help="empty a Redis that has keys")
    parser.add_argument(
        "--profile", default="", help="write the conditional night's CPU profile (cProfile) here"
    )
    parser.add_argument(
        "--stages", action="store_true", help="print the conditional night's CPU by stage"
    )
    parser.add_argument(
        "--no-tree-builders",
        action="store_true",
        help="build every tree in this process (an audits worker of threads uses children)",
    )
    args = parser.parse_args()

    # The page server forks before Django and its connections exist.
    bodies = page_bodies()
    versions = multiprocessing.Array("i", args.pages, lock=False)
    counters = multiprocessing.Array("q", 3)
    port = multiprocessing.Value("i", 0)
    server = multiprocessing.Process(
        target=serve, args=(port, versions, counters, bodies), daemon=True
    )
    server.start()
    while not port.value:
        time.sleep(0.05)

    database_url, drop_database = create_database(sqlite_fallback=False)
    os.environ.update(
        {
            "DATABASE_URL": database_url,
            "DEBUG": "true",
            "AUDIT_ALLOW_PRIVATE_TARGETS": "true",
            "PAGE_FETCH_WARMUP_RATE": "0",
            "AUDIT_MAX_LINK_CHECKS": "0",
        }
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    rows = []
    stages = Counter() if args.stages else None

    def cpu_clock() -> float:
        """This process's CPU and its tree builders' (the fork server and the children it
        forked, live or killed and reaped). The page server's is not the audits'."""
        return family_cpu_seconds(os.getpid(), leaving_out={server.pid})

    try:
        import logging

        import django

        django.setup()
        import redis
        from django.conf import settings
        from django.core.management import call_command

        from audits import treebuild
        from audits.models import Audit, Page

        client = redis.Redis.from_url(settings.REDIS_URL)
        if client.dbsize() and not args.flush_redis:
            print(f"{settings.REDIS_URL} holds keys; this script empties it. Use --flush-redis.")
            return 2
        client.flushdb()
        for logger in ("audits", "jobs", "outbound"):
            logging.getLogger(logger).setLevel(logging.WARNING)
        call_command("migrate", interactive=False, verbosity=0)
        if not args.no_tree_builders:
            # As the audits worker's TreeBuilders bootstep starts them.
            treebuild.start(settings.AUDIT_TREE_PROCESSES, memory_mb=settings.AUDIT_TREE_MEMORY_MB)
        base = f"http://127.0.0.1:{port.value}"
        Page.objects.bulk_create(
            [
                Page(url=f"{base}/page/{n}", domain="127.0.0.1", reaudit_nightly=True)
                for n in range(args.pages)
            ],
            batch_size=2000,
        )
        page_ids = list(Page.objects.order_by("id").values_list("id", flat=True))
        rng = random.Random(34)

        def change_some() -> None:
            for number in rng.sample(range(args.pages), round(args.pages * args.changed)):
                versions[number] += 1

        settings.AUDIT_CONDITIONAL_REAUDITS = False
        rows.append(
            run_night(
                "first audits",
                page_ids,
                Audit.Trigger.SUBMITTED,
                counters,
                threads=args.threads,
                cpu_clock=cpu_clock,
            )
        )
        print(json.dumps(rows[-1]), flush=True)
        change_some()
        rows.append(
            run_night(
                "re-audit, full",
                page_ids,
                Audit.Trigger.REAUDIT,
                counters,
                threads=args.threads,
                cpu_clock=cpu_clock,
            )
        )
        print(json.dumps(rows[-1]), flush=True)
        change_some()
        settings.AUDIT_CONDITIONAL_REAUDITS = True
        rows.append(
            run_night(
                "re-audit, conditional",
                page_ids,
                Audit.Trigger.REAUDIT,
                counters,
                threads=args.threads,
                profile=args.profile,
                stages=stages,
                cpu_clock=cpu_clock,
            )
        )
        print(json.dumps(rows[-1]), flush=True)
        client.flushdb()
    finally:
        from django.db import connections

        from audits import treebuild

        treebuild.stop()
        connections.close_all()
        drop_database()
        server.terminate()

    full, conditional = rows[1], rows[2]
    columns = list(full)
    print(f"\n{args.pages} pages, {args.changed:.0%} changed before each re-audit night")
    print("| " + " | ".join(columns) + " |")
    print("|" + " --- |" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")
    byte_share = conditional["bytes"] / full["bytes"]
    cpu_share = conditional["cpu_ms_per_audit"] / full["cpu_ms_per_audit"]
    goals = [
        (f"bytes at most 15 % of the full night ({byte_share:.1%})", byte_share <= 0.15),
        (f"CPU at most 40 % of the full night ({cpu_share:.1%})", cpu_share <= 0.40),
        (
            "every re-audit succeeded",
            all(row["succeeded"] == row["audits"] for row in rows),
        ),
    ]
    if stages is not None:
        print("\nThe conditional night's CPU by stage (each thread's own), ms per re-audit:")
        for label, _, _ in STAGES:
            print(f"  {label}: {stages[label] * 1000 / conditional['audits']:.3f}")
        print(f"  (all of it: {conditional['cpu_ms_per_audit']})")
    for goal, met in goals:
        print(f"  [{'x' if met else ' '}] {goal}")
    return 0 if all(met for _, met in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
