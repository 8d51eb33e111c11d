#!/usr/bin/env python
"""Shared links: link-check requests per distinct link, when the pages of a site share links.

    .venv/bin/python bench/shared_links.py --flush-redis          # 10,000 pages, a few minutes

What it starts: one HTTP server per site, each on its own loopback address (127.0.0.2,
127.0.0.3, ...: one origin per site, as on the web), that the site's links point at (they
count the requests per path, and each origin's robots.txt requests apart), a database of its own (DATABASE_URL's name plus `_links_bench`, created and
dropped like the test suite's), and the audits workers as `make run` starts them
(AUDITS_WORKER_PROCESSES x AUDITS_WORKER_POOL x AUDITS_WORKER_CONCURRENCY) on the Redis
at REDIS_URL, which it empties (it refuses one that holds keys unless --flush-redis).

The pages are not fetched: each audit is created as its page fetch would leave it and
handed its links through the domain function (`audits.linkcheck.start_link_checks`),
from --submitters threads in this process, in an order shuffled across sites, so audits
of one site listing the same links run at the same time. The workers run the real link
checks (`audits.check_shared_link`) against the server. Every site has --pages / --sites
pages of --links links, --shared of them the same on every page of the site (a footer),
the others the page's own.

Night 1 starts with no link checked; night 2 audits every page again within the
freshness window. Reported per night: requests, distinct links, requests per distinct
link, audits that report every link finished, and robots.txt requests (each origin's is
read before its links are checked, audits.robots). Goals: night 1 at most 1.05 requests
per distinct link, robots.txt counted apart at most once per origin in the freshness
window (both nights together), and every audit of both nights reports every link.

The per-host politeness (LINKCHECK_PER_HOST_RATE, 1 a second by default) is raised here,
since every link is on one local server: it bounds the time a night takes, not the
requests it sends (docs/capacity.md has what it means for a real site's links).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DEBUG", "true")
# Both in this process (the audits' deadlines) and in the workers: no audit is cut off
# by its deadline while tens of thousands of checks queue (that is capacity, measured
# elsewhere); what is measured here is requests per link.
WORKER_ENV = {
    "AUDIT_LINKCHECK_DEADLINE_SECONDS": "3600",
    "LINKCHECK_PER_HOST_RATE": "100000",
    "LINKCHECK_PER_HOST_CONCURRENCY": "1000",
    "AUDIT_ALLOW_PRIVATE_TARGETS": "true",
    "DB_POOL_MAX_SIZE": "8",
}
os.environ.update(WORKER_ENV)

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import close_old_connections  # noqa: E402

from audits import linkcheck  # noqa: E402
from audits.models import Audit, LinkCheck, Page  # noqa: E402
from audits.tasks import enqueue_link_checks  # noqa: E402
from bench.inprocess import own_stores  # noqa: E402
from bench.services import QuietHandler  # noqa: E402
from tests.workers import WorkerProcess  # noqa: E402

# Every site's robots.txt: Plumb's group may check everything but /private.
ROBOTS_TXT = b"User-agent: *\nDisallow: /private\n"


class Tally:
    """What every site's server was asked: link paths (per origin) and robots.txt reads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.hits: Counter[str] = Counter()
        self.robots: Counter[str] = Counter()


class LinkTargets(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def handle_error(self, request, client_address):
        pass  # a worker stopped with a kept-alive connection open

    def __init__(self, address: str, tally: Tally):
        super().__init__((address, 0), TargetHandler)
        self.tally = tally

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class TargetHandler(QuietHandler):
    def do_GET(self):
        tally = self.server.tally
        if self.path == "/robots.txt":
            with tally.lock:
                tally.robots[self.server.base_url] += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(ROBOTS_TXT)))
            self.end_headers()
            self.wfile.write(ROBOTS_TXT)
            return
        with tally.lock:
            tally.hits[self.server.base_url + self.path] += 1
        self.send_html(200, b"<!doctype html><title>Target</title>")


def site_links(bases: list[str], args) -> dict[int, list[str]]:
    """Each page's links, on its site's origin: the site's shared ones, then the page's own."""
    pages_per_site = args.pages // args.sites
    links = {}
    for number in range(pages_per_site * args.sites):
        site, page = divmod(number, pages_per_site)
        base = bases[site]
        shared = [f"{base}/site{site}/footer/{k}" for k in range(args.shared)]
        own = [f"{base}/site{site}/page{page}/link/{k}" for k in range(args.links - args.shared)]
        links[number] = shared + own
    return links


def make_pages(args) -> list[int]:
    pages_per_site = args.pages // args.sites
    Page.objects.bulk_create(
        [
            Page(url=f"https://site{site}.example/page/{page}", domain=f"site{site}.example")
            for site in range(args.sites)
            for page in range(pages_per_site)
        ],
        batch_size=2000,
    )
    return list(Page.objects.order_by("id").values_list("id", flat=True))


def start_audit(page_id: int, links: list[str]) -> None:
    try:
        audit = Audit.objects.create(page_id=page_id, status=Audit.Status.RUNNING, task_id="bench")
        _, queued = linkcheck.start_link_checks(
            str(audit.id), {"status_code": 200, "external_links": links}
        )
        enqueue_link_checks(queued)
    finally:
        close_old_connections()


def night(name: str, page_ids: list[int], links: dict[int, list[str]], args, tally) -> dict:
    hits_before = sum(tally.hits.values())
    distinct_before = len(tally.hits)
    robots_before = sum(tally.robots.values())
    order = list(range(len(page_ids)))
    random.Random(name).shuffle(order)
    started = time.monotonic()
    audits_before = set(Audit.objects.values_list("id", flat=True))
    with ThreadPoolExecutor(args.submitters) as pool:
        list(pool.map(lambda n: start_audit(page_ids[n], links[n]), order))
    submitted = time.monotonic() - started
    while Audit.objects.exclude(status__in=Audit.FINISHED).exists():
        if time.monotonic() - started > args.timeout:
            raise SystemExit(f"[{name}] audits unfinished after {args.timeout:g} s")
        time.sleep(0.5)
    elapsed = time.monotonic() - started
    audits = Audit.objects.exclude(id__in=audits_before)
    complete = 0
    for result in audits.values_list("result", flat=True).iterator(chunk_size=500):
        entries = result["links"]
        if len(entries) == args.links and all(e.get("finished", True) for e in entries):
            complete += 1
    requests = sum(tally.hits.values()) - hits_before
    listed = args.links * len(page_ids)
    distinct = len({url for page_links in links.values() for url in page_links})
    return {
        "night": name,
        "audits": audits.count(),
        "links_listed": listed,
        "distinct_links": distinct,
        "requests": requests,
        "requests_per_distinct_link": round(requests / distinct, 3),
        "new_paths_requested": len(tally.hits) - distinct_before,
        "origins": args.sites,
        "robots_txt_requests": sum(tally.robots.values()) - robots_before,
        "audits_reporting_every_link": complete,
        "broken_or_unfinished_checks": LinkCheck.objects.filter(audit__in=audits)
        .exclude(status="ok")
        .count(),
        "submit_seconds": round(submitted, 1),
        "seconds": round(elapsed, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pages", type=int, default=10_000)
    parser.add_argument("--sites", type=int, default=100)
    parser.add_argument("--links", type=int, default=30, help="links on each page")
    parser.add_argument("--shared", type=int, default=25, help="of them, shared within a site")
    parser.add_argument("--submitters", type=int, default=4, help="threads starting audits")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per night")
    parser.add_argument("--nights", type=int, default=2, choices=(1, 2))
    parser.add_argument("--flush-redis", action="store_true", help="empty a Redis that has keys")
    args = parser.parse_args()

    if args.sites > 250:
        raise SystemExit("one loopback address per site: at most 250 sites")
    for name in ("audits", "jobs", "outbound"):
        logging.getLogger(name).setLevel(logging.WARNING)
    with own_stores("links_bench", flush=args.flush_redis, flag="--flush-redis"):
        tally = Tally()
        servers = [LinkTargets(f"127.0.0.{site + 2}", tally) for site in range(args.sites)]
        for server in servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()
        workers = [
            WorkerProcess(
                "audits",
                pool=settings.AUDITS_WORKER_POOL,
                concurrency=settings.AUDITS_WORKER_CONCURRENCY,
                env=WORKER_ENV,
            )
            for _ in range(settings.AUDITS_WORKER_PROCESSES)
        ]
        rows = []
        try:
            for worker in workers:
                worker.start(timeout=60)
            page_ids = make_pages(args)
            links = site_links([server.base_url for server in servers], args)
            for name in ("night 1", "night 2")[: args.nights]:
                rows.append(night(name, page_ids, links, args, tally))
                print(rows[-1], flush=True)
        finally:
            for worker in workers:
                worker.stop()
            for server in servers:
                server.shutdown()
                server.server_close()

    first = rows[0]
    print(
        f"\n{args.pages} pages, {args.sites} sites, {args.links} links a page ({args.shared} "
        f"shared within a site); {len(workers)} audits worker(s) x "
        f"{settings.AUDITS_WORKER_CONCURRENCY} {settings.AUDITS_WORKER_POOL}."
    )
    columns = list(first)
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(str(row[c]) for c in columns))
    most_robots = max(tally.robots.values(), default=0)
    without_sharing = first["links_listed"] / first["distinct_links"]
    print(f"\n(each audit checking its own links would send {without_sharing:.2f} per link)")
    goals = [
        (
            f"night 1: at most 1.05 requests per distinct link ({first['requests_per_distinct_link']})",
            first["requests_per_distinct_link"] <= 1.05,
        ),
        (
            f"robots.txt at most once per origin in the window ({most_robots} at most, "
            f"{sum(tally.robots.values())} for {args.sites} origins)",
            most_robots <= 1,
        ),
        (
            "every audit of both nights reports every link",
            all(row["audits_reporting_every_link"] == row["audits"] for row in rows),
        ),
    ]
    for goal, met in goals:
        print(f"  [{'x' if met else ' '}] {goal}")
    return 0 if all(met for _, met in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
