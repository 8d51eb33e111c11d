#!/usr/bin/env python
"""What the outbound client's connection pool costs a request, as shares within one run.

    .venv/bin/python bench/outbound_pool.py

An audits worker's threads share one httpx client (outbound.client.shared_client: Plumb's
transports over httpx's pool). httpcore's pool runs an assignment pass
(`ConnectionPool._assign_requests_to_connections`) when a request joins it and when it
leaves, under the pool's lock. This bench sends requests from 32 threads, as a worker of
32 threads does, through that client to bench/fast_site on 16 hosts (127.0.0.1 to
127.0.0.16, as bench/throughput.py spreads its pages), with pages answered at once and
after 200 ms, and reads the process's CPU a request and the CPU spent inside those passes
(each pass timed with the thread's clock by a wrapper this bench puts around it), three
rounds each. Nothing but the client is measured: no Redis, no database, no admission.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", "bench-pool-" + secrets.token_urlsafe(48))
os.environ["AUDIT_ALLOW_PRIVATE_TARGETS"] = "true"  # the site is on 127.0.0.x

import django  # noqa: E402

django.setup()

import httpcore  # noqa: E402
import httpx  # noqa: E402

from bench.services import folder_until_exit, stop_on_signals  # noqa: E402
from bench.throughput import HOSTS, spread, start_site  # noqa: E402
from outbound.client import shared_client  # noqa: E402

THREADS = 32


class PassClock:
    """CPU spent inside httpcore's assignment passes, by every thread, and their count."""

    def __init__(self):
        self.seconds, self.passes, self.lock = 0.0, 0, threading.Lock()
        self.original = httpcore.ConnectionPool._assign_requests_to_connections

    def __enter__(self) -> PassClock:
        original, clock = self.original, self

        def timed(pool):
            started = time.thread_time()
            try:
                return original(pool)
            finally:
                used = time.thread_time() - started
                with clock.lock:
                    clock.seconds += used
                    clock.passes += 1

        httpcore.ConnectionPool._assign_requests_to_connections = timed
        return self

    def __exit__(self, *exc) -> None:
        httpcore.ConnectionPool._assign_requests_to_connections = self.original


def one_round(client: httpx.Client, site: str, per_thread: int) -> dict:
    requests = THREADS * per_thread
    urls = spread(site, "p", requests)
    failed: list[str] = []

    def send(thread: int) -> None:
        for url in urls[thread::THREADS]:
            try:
                response = client.get(url)
                response.read()
                response.close()
            except httpx.TransportError as exc:
                # Counted, not raised: the local site never fails, so each is the client's.
                failed.append(f"{type(exc).__name__}: {exc}")

    with PassClock() as clock:
        started_cpu, started = time.process_time(), time.perf_counter()
        threads = [threading.Thread(target=send, args=(t,)) for t in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        cpu, elapsed = time.process_time() - started_cpu, time.perf_counter() - started
    return {
        "cpu_ms": cpu / requests * 1e3,
        "pass_ms": clock.seconds / requests * 1e3,
        "passes": clock.passes / requests,
        "share": clock.seconds / cpu,
        "per_second": requests / elapsed,
        "failed": failed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-thread", type=int, default=150, help="requests each thread sends")
    args = parser.parse_args()
    # A SIGTERM ends the run through every `finally`, so it stops the sites it started.
    stop_on_signals()
    logs = folder_until_exit("plumb-pool-")
    print(f"httpx {httpx.__version__}, httpcore {httpcore.__version__}; {THREADS} threads, "
          f"{HOSTS} hosts, {THREADS * args.per_thread} requests a round")  # fmt: skip
    for delay in (0.0, 0.2):
        site, base = start_site(logs, delay)
        try:
            client = shared_client(timeout=10)
            one_round(client, base, 10)  # warm: every host's connections opened
            rounds = [one_round(client, base, args.per_thread) for _ in range(args.rounds)]
        finally:
            site.stop()
        each = " / ".join(
            f"{r['cpu_ms']:.2f} ms, passes {r['pass_ms']:.2f} ms ({r['share'] * 100:.0f} %)"
            for r in rounds
        )
        print(
            f"pages after {delay * 1000:.0f} ms: CPU a request {statistics.median(r['cpu_ms'] for r in rounds):.2f} ms, "
            f"in the pool's assignment passes {statistics.median(r['pass_ms'] for r in rounds):.2f} ms "
            f"({statistics.median(r['share'] for r in rounds) * 100:.0f} % of the process; "
            f"{statistics.median(r['passes'] for r in rounds):.1f} passes a request; "
            f"{statistics.median(r['per_second'] for r in rounds):.0f} requests/s); each round: {each}"
        )
        failures = [failure for r in rounds for failure in r["failed"]]
        if failures:
            print(f"  {len(failures)} requests failed in the client, the first: {failures[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
