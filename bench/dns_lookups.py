#!/usr/bin/env python
"""What a page fetch pays for looking its host's name up (issue 33.4: "DNS lookups without
a thread per call"), as ratios within one run.

    .venv/bin/python bench/dns_lookups.py

1. The lookup alone, of `localhost` (from /etc/hosts, as getaddrinfo reads it: no network
   here), in alternated rounds: `outbound.guard.resolve` (its LookupThreads, as every
   fetch by name looks up), a thread started for each lookup (how it looked up before),
   a fixed pool of four threads, and `socket.getaddrinfo` in the calling thread (the
   floor any way in front of getaddrinfo approaches). The process's CPU (the lookup
   threads' included) and wall time per lookup.
2. A whole page fetch (`outbound.integrations.page.fetch_page`, an audit's own path) of a
   local page that answers `Connection: close`, so that every fetch connects and looks its
   host up, alternated: by name (http://localhost:PORT/) with resolve's LookupThreads, by
   name with a thread started for each lookup (as before), and by address
   (http://127.0.0.1:PORT/), which looks nothing up. The difference from the last is what
   the lookup costs a fetch.

The outbound client's host slots and rate-limit reads live in Redis: REDIS_URL's database,
which it empties (it refuses one that holds keys unless given --flush), or, with REDIS_URL
unset, a redis-server of its own on a free port. It makes a database of its own next to
DATABASE_URL's (a SQLite file without one), dropped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import socket
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.services import start_redis  # noqa: E402

redis_process, os.environ["REDIS_URL"] = start_redis()
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# As production runs (DEBUG off, so no query log), with a key of the run's own.
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", "bench-dns-" + secrets.token_urlsafe(48))

import django  # noqa: E402

django.setup()

from bench.inprocess import own_stores  # noqa: E402
from outbound import guard  # noqa: E402
from outbound.guard import resolve  # noqa: E402
from outbound.integrations.page import fetch_page  # noqa: E402

PAGE = b"<!doctype html><html><head><title>t</title></head><body><p>x</p></body></html>"


class ClosingPage(BaseHTTPRequestHandler):
    """A small page, and the connection closed after it: the next fetch connects anew."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args) -> None:
        pass


def per_call(function, calls: int) -> tuple[float, float]:
    """(CPU, wall) microseconds per call of `function`: the process's CPU, so the work of
    any thread the call starts counts."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        function()
    return (
        (time.process_time() - cpu) / calls * 1e6,
        (time.perf_counter() - wall) / calls * 1e6,
    )


def report(title: str, rounds: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    print(f"\n{title}")
    print("| way | CPU us a call (median; rounds) | wall us a call (median) |")
    print("| --- | --- | ---: |")
    medians = {}
    for way, samples in rounds.items():
        cpus = [cpu for cpu, _ in samples]
        medians[way] = statistics.median(cpus)
        each = " / ".join(f"{cpu:.0f}" for cpu in cpus)
        wall = statistics.median(wall for _, wall in samples)
        print(f"| {way} | {medians[way]:.0f} ({each}) | {wall:.0f} |")
    return medians


class ThreadALookup:
    """How outbound.guard.resolve looked a name up before LookupThreads: a thread started
    for each lookup."""

    def lookup(self, host: str, port: int) -> Future[list]:
        answer: Future[list] = Future()

        def run() -> None:
            try:
                answer.set_result(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
            except OSError as exc:
                answer.set_exception(exc)

        threading.Thread(target=run, daemon=True).start()
        return answer


@contextlib.contextmanager
def looking_up_with(way) -> Iterator[None]:
    """outbound.guard.resolve looking names up with `way` (None: its own LookupThreads)."""
    own = guard._lookups
    guard._lookups = way or own
    try:
        yield
    finally:
        guard._lookups = own


def lookups(args) -> None:
    pool = ThreadPoolExecutor(4, thread_name_prefix="bench-resolve")
    before = ThreadALookup()
    ways = {
        "outbound.guard.resolve (LookupThreads)": lambda: resolve("localhost", 80, 5.0),
        "a new thread a lookup (resolve before)": lambda: before.lookup("localhost", 80).result(5),
        "a pool of 4 threads (ThreadPoolExecutor)": lambda: pool.submit(
            socket.getaddrinfo, "localhost", 80, type=socket.SOCK_STREAM
        ).result(5.0),
        "getaddrinfo in the calling thread": lambda: socket.getaddrinfo(
            "localhost", 80, type=socket.SOCK_STREAM
        ),
    }
    rounds: dict[str, list] = {way: [] for way in ways}
    for _ in range(args.rounds):
        for way, call in ways.items():
            rounds[way].append(per_call(call, args.lookups))
    pool.shutdown()
    report(f"1. One lookup of localhost ({args.lookups} a round, {args.rounds} rounds)", rounds)


def fetches(args) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ClosingPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    by_name, by_address = f"http://localhost:{port}/page", f"http://127.0.0.1:{port}/page"
    # (URL, how resolve looks names up)
    arms = {
        "by name, LookupThreads": (by_name, None),
        "by name, a new thread a lookup (before)": (by_name, ThreadALookup()),
        "by address (no lookup)": (by_address, None),
    }

    def fetch(url: str) -> None:
        page = fetch_page(url, timeout=10, max_bytes=1_000_000, user_agent="plumb-bench",
                          allow_private=True)  # fmt: skip
        assert page.status_code == 200, page.status_code

    rounds: dict[str, list] = {arm: [] for arm in arms}
    for url in (by_name, by_address):  # warm: the client, the first connection, imports
        fetch(url)
    for _ in range(args.rounds):
        for arm, (url, way) in arms.items():
            with looking_up_with(way):
                rounds[arm].append(per_call(lambda url=url: fetch(url), args.fetches))
    server.shutdown()
    medians = report(
        f"2. A page fetch, a new connection each ({args.fetches} a round, {args.rounds} rounds)",
        rounds,
    )
    kept, started, none = medians.values()
    for arm, cpu in (("LookupThreads", kept), ("a new thread a lookup", started)):
        print(f"The lookup's cost in a fetch by name, {arm}: {cpu - none:.0f} us of {cpu:.0f} "
              f"({(cpu - none) / cpu:.1%}).")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--lookups", type=int, default=1000, help="lookups a round, each way")
    parser.add_argument("--fetches", type=int, default=500, help="fetches a round, each way")
    parser.add_argument("--flush", action="store_true",
                        help="empty REDIS_URL's database even if it holds keys")  # fmt: skip
    args = parser.parse_args()
    try:
        with own_stores("dns_bench", flush=args.flush, flag="--flush"):
            lookups(args)
            fetches(args)
    finally:
        if redis_process is not None:
            redis_process.terminate()


if __name__ == "__main__":
    main()
