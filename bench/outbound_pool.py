#!/usr/bin/env python
"""What the outbound client's connection pool costs a request, as ratios within one run.

    .venv/bin/python bench/outbound_pool.py

An audits worker's threads share one client (outbound.client.shared_client: Plumb's
transports over httpx2's pool). The pool runs an assignment pass
(`ConnectionPool._assign_requests_to_connections`) when a request joins it and when it
leaves, under the pool's lock, and it decides there which idle connections to close.

This bench sends requests from 32 threads, as a worker of 32 threads does, to
bench/fast_site on 16 hosts (127.0.0.1 to 127.0.0.16, as bench/throughput.py spreads its
pages), with pages answered at once and after 200 ms, through three clients in turn, round
after round:

- a plain httpx 0.28.1 client with its default limits (httpcore 1.0.9's pool, which
  Plumb's client stood on until 2026-12-07; installed with the dev tools, schemathesis
  needs it): the reference;
- a plain httpx2 2.17.0 client with the same limits;
- Plumb's shared client (httpx2, with its guard, deadline and bounded body).

For each it reads the process's CPU a request, the CPU spent inside the pool's passes (each
pass timed with the thread's clock by a wrapper this bench puts around it), the
connections opened a request (a pool that closes what it could reuse opens one for nearly
every request), and the requests that failed in the client (the local site never fails).
Nothing but the client is measured: no Redis, no database, no admission.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Callable
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
import httpcore2  # noqa: E402
import httpx  # noqa: E402
import httpx2  # noqa: E402

from bench.services import folder_until_exit, stop_on_signals  # noqa: E402
from bench.throughput import HOSTS, spread, start_site  # noqa: E402
from outbound.client import shared_client  # noqa: E402

THREADS = 32

# Each client by its name, made once per site; every one has the default limits (100
# connections, 20 kept alive).
CLIENTS: dict[str, Callable[[], httpx2.Client | httpx.Client]] = {
    f"plain httpx {httpx.__version__}": lambda: httpx.Client(timeout=10),
    f"plain httpx2 {httpx2.__version__}": lambda: httpx2.Client(timeout=10),
    "Plumb's client (httpx2)": lambda: shared_client(timeout=10),
}


class PoolClock:
    """The CPU spent inside both libraries' assignment passes, by every thread, and the
    connections their backends opened (Plumb's guard opens its own through
    httpcore2.SyncBackend.connect_tcp, so it is counted there too)."""

    def __init__(self):
        self.seconds, self.passes, self.connects = 0.0, 0, 0
        self.lock = threading.Lock()
        self.originals = [
            (module.ConnectionPool, "_assign_requests_to_connections", self._timed)
            for module in (httpcore, httpcore2)
        ] + [(module.SyncBackend, "connect_tcp", self._counted) for module in (httpcore, httpcore2)]

    def _timed(self, original):
        def timed(pool):
            started = time.thread_time()
            try:
                return original(pool)
            finally:
                used = time.thread_time() - started
                with self.lock:
                    self.seconds += used
                    self.passes += 1

        return timed

    def _counted(self, original):
        def counted(backend, *args, **kwargs):
            with self.lock:
                self.connects += 1
            return original(backend, *args, **kwargs)

        return counted

    def reading(self) -> tuple[float, int, int]:
        with self.lock:
            return self.seconds, self.passes, self.connects

    def __enter__(self) -> PoolClock:
        self.saved = [(cls, name, getattr(cls, name)) for cls, name, _ in self.originals]
        for (cls, name, wrap), (_, _, original) in zip(self.originals, self.saved, strict=True):
            setattr(cls, name, wrap(original))
        return self

    def __exit__(self, *exc) -> None:
        for cls, name, original in self.saved:
            setattr(cls, name, original)


def one_round(client, clock: PoolClock, site: str, per_thread: int) -> dict:
    requests = THREADS * per_thread
    urls = spread(site, "p", requests)
    failed: list[str] = []

    def send(thread: int) -> None:
        for url in urls[thread::THREADS]:
            try:
                response = client.get(url)
                response.read()
                response.close()
            except (httpx.TransportError, httpx2.TransportError) as exc:
                # Counted, not raised: the local site never fails, so each is the client's.
                failed.append(f"{type(exc).__name__}: {exc}")

    pass_seconds, passes, connects = clock.reading()
    started_cpu, started = time.process_time(), time.perf_counter()
    threads = [threading.Thread(target=send, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cpu, elapsed = time.process_time() - started_cpu, time.perf_counter() - started
    after = clock.reading()
    return {
        "cpu_ms": cpu / requests * 1e3,
        "pass_ms": (after[0] - pass_seconds) / requests * 1e3,
        "passes": (after[1] - passes) / requests,
        "connects": (after[2] - connects) / requests,
        "per_second": requests / elapsed,
        "failed": failed,
    }


def report(name: str, rounds: list[dict], reference: list[dict] | None) -> str:
    def median(field: str, of: list[dict] = rounds) -> float:
        return statistics.median(r[field] for r in of)

    line = (
        f"  {name}: CPU a request {median('cpu_ms'):.2f} ms"
        f" ({' / '.join(format(r['cpu_ms'], '.2f') for r in rounds)})"
        f", in the pool's passes {median('pass_ms'):.2f} ms ({median('passes'):.1f} a request)"
        f", connections opened a request {median('connects'):.3f}"
        f", {median('per_second'):.0f} requests/s"
    )
    if reference is not None:
        ratios = [r["cpu_ms"] / ref["cpu_ms"] for r, ref in zip(rounds, reference, strict=True)]
        line += f"; CPU against plain httpx {statistics.median(ratios):.2f}x"
    failures = [failure for r in rounds for failure in r["failed"]]
    line += f"; {len(failures)} failed in the client"
    if failures:
        line += f", the first: {failures[0]}"
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-thread", type=int, default=150, help="requests each thread sends")
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # httpx logs each request at INFO
    # A SIGTERM ends the run through every `finally`, so it stops the sites it started.
    stop_on_signals()
    logs = folder_until_exit("plumb-pool-")
    print(f"{THREADS} threads, {HOSTS} hosts, {THREADS * args.per_thread} requests a round; "
          f"the clients in turn, {args.rounds} rounds; medians, then each round")  # fmt: skip
    for delay in (0.0, 0.2):
        site, base = start_site(logs, delay)
        try:
            with PoolClock() as clock:
                clients = {name: make() for name, make in CLIENTS.items()}
                for client in clients.values():
                    one_round(client, clock, base, 10)  # warm: every host's connections opened
                rounds: dict[str, list[dict]] = {name: [] for name in clients}
                for _ in range(args.rounds):
                    for name, client in clients.items():
                        rounds[name].append(one_round(client, clock, base, args.per_thread))
        finally:
            site.stop()
        print(f"pages after {delay * 1000:.0f} ms:")
        first = next(iter(rounds.values()))
        for name, measured in rounds.items():
            print(report(name, measured, None if measured is first else first), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
