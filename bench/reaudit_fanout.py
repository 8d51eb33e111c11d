#!/usr/bin/env python
"""The nightly re-audit's fan-out time and reaudit worker memory, for 10,000 and 100,000 pages.

    .venv/bin/python bench/reaudit_fanout.py [--observe SECONDS]

For each size it inserts the pages in bulk (ten per domain), starts a real
`celery worker -Q reaudit` (REAUDIT_WORKER_POOL and REAUDIT_WORKER_CONCURRENCY, as `make run`),
publishes `reaudit.fan_out` as the beat entry does, and samples the RSS of the worker's
whole process tree and the messages it holds (`unacked:reaudit`) through the
fan-out and the first SECONDS of slice 0. The night is the default one (21,600 s
window, 600 s slices, 10 s spacing): a worker's memory peaks at the start of each
slice, when it takes that slice's placements, so one slice at production size shows
the peak of every slice. The goal is a ratio within one run: peak memory at 100,000
pages within 1.5x of that at 10,000.

For contrast it measures what the rolling slices avoid: a worker holding every
placement of a night at once, as countdowns of up to six hours (10,000 pages).

Services: Redis at REDIS_URL (which it empties) or, when REDIS_URL is not set, a
throwaway redis-server; a fresh database created next to DATABASE_URL's (PostgreSQL,
the local one when DATABASE_URL is not set) or a temporary SQLite file, dropped
afterwards. No audits worker runs: placed audits wait in the `audits` queue.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from collections import deque
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.services import create_database, start_redis  # noqa: E402

SIZES = (10_000, 100_000)
PAGES_PER_DOMAIN = 10
DAY = date(2030, 1, 15)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--observe", type=float, default=60, help="seconds of slice 0 to watch after the fan-out"
    )
    args = parser.parse_args()

    redis_process, redis_url = start_redis()
    database_url, drop_database = create_database()
    os.environ.update({"REDIS_URL": redis_url, "DATABASE_URL": database_url, "DEBUG": "true"})
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)
        print(f"Redis {redis_url}, database {database_url}", flush=True)
        results = [measure_rolling(size, args.observe) for size in SIZES]
        naive = measure_naive(SIZES[0])
        publishing = measure_publishing()
        report(results, naive, publishing, args.observe)
    finally:
        from django.db import connections

        connections.close_all()
        drop_database()
        if redis_process is not None:
            redis_process.terminate()
            redis_process.wait(timeout=10)
    return 0


def reset(redis_client) -> None:
    from django.db import connection

    tables = ["reaudit_slicerun", "reaudit_placement", "reaudit_fanout", "audits_audit"]
    with connection.cursor() as cursor:
        for table in [*tables, "audits_page"]:
            cursor.execute(f"DELETE FROM {table}")
    redis_client.flushdb()


def insert_pages(count: int) -> float:
    from audits.models import Page

    started = time.perf_counter()
    domains = max(1, count // PAGES_PER_DOMAIN)
    batch = []
    for n in range(count):
        domain = f"site{n % domains}.example"
        batch.append(Page(url=f"https://{domain}/page/{n}", domain=domain, reaudit_nightly=True))
        if len(batch) == 5000:
            Page.objects.bulk_create(batch)
            batch = []
    Page.objects.bulk_create(batch)
    return time.perf_counter() - started


# --- The worker and its memory -----------------------------------------------------


def start_worker(env: dict | None = None):
    from tests.workers import WorkerProcess, reaudit_as_make_run

    class QuietWorker(WorkerProcess):
        """Keeps only the last lines: a night logs a few lines per page."""

        def _read_output(self):
            self.lines = deque(maxlen=200)
            for line in self.process.stdout:
                self.lines.append(line)
                if " ready." in line:
                    self._ready.set()

        def output(self) -> str:
            return "".join(self.lines)

    return QuietWorker("reaudit", **reaudit_as_make_run(), env=env).start(timeout=60)


class TreeRSS:
    """Samples the RSS of a process and all its children; keeps the peak."""

    def __init__(self, pid: int, interval: float = 0.2, held=None):
        import psutil

        self.process = psutil.Process(pid)
        self.interval = interval
        self.held = held
        self.peak = 0
        self.peak_held = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> int:
        import psutil

        total = 0
        for process in [self.process, *self.process.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):  # a pool child just replaced
                total += process.memory_info().rss
        return total

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            if self.held is not None:
                self.peak_held = max(self.peak_held, self.held())
            time.sleep(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def settle(worker, seconds: float = 3.0) -> int:
    """The worker's RSS once it is idle after start-up."""
    time.sleep(seconds)
    return TreeRSS(worker.process.pid).now()


def mb(value: float) -> str:
    return f"{value / 2**20:.0f} MB"


# --- The two measurements -----------------------------------------------------------


def measure_rolling(size: int, observe_seconds: float) -> dict:
    import redis
    from django.conf import settings

    from reaudit import services
    from reaudit.models import FanOut, Placement
    from reaudit.tasks import fan_out

    client = redis.Redis.from_url(settings.REDIS_URL)
    unacked = f"unacked:{settings.REAUDIT_QUEUE}"
    reset(client)
    insert_seconds = insert_pages(size)
    print(f"\n{size:,} pages ({insert_seconds:.1f} s to insert)", flush=True)
    worker = start_worker()
    try:
        idle = settle(worker)
        with TreeRSS(worker.process.pid, held=lambda: client.hlen(unacked)) as rss:
            published = time.perf_counter()
            fan_out.apply_async(kwargs={"day": DAY.isoformat()})
            while not FanOut.objects.filter(day=DAY).exists():  # committed with its placements
                time.sleep(0.05)
            fan_out_seconds = time.perf_counter() - published
            night = FanOut.objects.get(day=DAY)
            count_started = time.perf_counter()
            scheduled = services.count_scheduled()
            count_ms = (time.perf_counter() - count_started) * 1000
            print(
                f"  fan-out {fan_out_seconds:.1f} s, slice 0 holds {night.slice_sizes[0]}",
                flush=True,
            )
            time.sleep(observe_seconds)
        observed_until = night.window_start + timedelta(seconds=observe_seconds)
        due = sum(
            1
            for placement in Placement.objects.filter(fan_out=night, slice_index=0)
            if night.window_start + timedelta(seconds=placement.offset_seconds) <= observed_until
        )
        fired = Placement.objects.filter(fan_out=night, fired_at__isnull=False).count()
        print(f"  peak {mb(rss.peak)}, worker held up to {rss.peak_held}", flush=True)
        return {
            "pages": size,
            "fan_out_seconds": fan_out_seconds,
            "window": night.window_seconds,
            "slice": night.slice_seconds,
            "first_slice": night.slice_sizes[0],
            "busiest_slice": max(night.slice_sizes),
            "idle_rss": idle,
            "peak_rss": rss.peak,
            "peak_held": rss.peak_held,
            "fired": fired,
            "due": due,
            "count_scheduled": scheduled,
            "count_ms": count_ms,
        }
    finally:
        worker.stop(timeout=60)


def measure_naive(size: int) -> dict:
    """The design the slices replace: every placement published at once, due over six hours."""
    import redis
    from django.conf import settings

    from audits.models import Page
    from reaudit.services import placement_key
    from reaudit.tasks import place

    client = redis.Redis.from_url(settings.REDIS_URL)
    reset(client)
    insert_pages(size)
    print(f"\nNaive: {size:,} placements with countdowns over six hours", flush=True)
    worker = start_worker()
    try:
        idle = settle(worker)
        with TreeRSS(worker.process.pid) as rss:
            with place.app.producer_or_acquire() as producer:
                for n, page_id in enumerate(Page.objects.values_list("id", flat=True).iterator()):
                    place.apply_async(
                        args=[page_id, DAY.isoformat()],
                        task_id=placement_key(page_id, DAY),
                        countdown=600 + n * 21000 / size,
                        queue=settings.REAUDIT_QUEUE,
                        producer=producer,
                    )
            unacked = f"unacked:{settings.REAUDIT_QUEUE}"
            deadline = time.monotonic() + 300
            while client.hlen(unacked) < size and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(2)
            held = client.hlen(unacked)
        print(f"  worker holds {held}, peak {mb(rss.peak)}", flush=True)
        return {"pages": size, "idle_rss": idle, "peak_rss": rss.peak, "held": held}
    finally:
        worker.stop(timeout=120)
        client.flushdb()


def measure_publishing(count: int = 3000, rounds: int = 3) -> dict:
    """One slice's publish: a round trip per message, or kombu's publish batch (no worker)."""
    import statistics

    import redis
    from django.conf import settings

    from reaudit.tasks import place

    client = redis.Redis.from_url(settings.REDIS_URL)
    eta = datetime.now(UTC) + timedelta(hours=1)

    def publish(batched: bool) -> float:
        client.flushdb()
        started = time.perf_counter()
        with place.app.producer_or_acquire() as producer:
            batch = producer.batch(max_size=2000) if batched else contextlib.nullcontext()
            with batch:
                for n in range(count):
                    place.apply_async(
                        args=[n, DAY.isoformat()],
                        task_id=f"bench-{n}",
                        eta=eta,
                        queue=settings.REAUDIT_QUEUE,
                        producer=producer,
                    )
        elapsed = time.perf_counter() - started
        assert client.llen(settings.REAUDIT_QUEUE) == count
        return elapsed

    single, batched = [], []
    for _ in range(rounds):  # interleaved, so both see the same load
        single.append(publish(batched=False))
        batched.append(publish(batched=True))
    client.flushdb()
    return {
        "count": count,
        "single": statistics.median(single),
        "batched": statistics.median(batched),
    }


def report(results: list[dict], naive: dict, publishing: dict, observe_seconds: float) -> None:
    first = results[0]
    print(
        f"\nWindow {first['window']} s, slices of {first['slice']} s; "
        f"worker watched through the fan-out and {observe_seconds:g} s of slice 0"
    )
    print(
        "| Pages | Fan-out | Slice 0 / busiest | Worker idle | Worker peak | Held at most "
        "| Fired / due | count_scheduled() |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r['pages']:,} | {r['fan_out_seconds']:.1f} s "
            f"| {r['first_slice']:,} / {r['busiest_slice']:,} | {mb(r['idle_rss'])} "
            f"| {mb(r['peak_rss'])} | {r['peak_held']:,} | {r['fired']:,} / {r['due']:,} "
            f"| {r['count_scheduled']:,} in {r['count_ms']:.1f} ms |"
        )
    small, large = results
    print(
        f"\nPeak RSS, {large['pages']:,} / {small['pages']:,} pages: "
        f"{large['peak_rss'] / small['peak_rss']:.2f} (goal: at most 1.5); above idle: "
        f"{mb(small['peak_rss'] - small['idle_rss'])} and {mb(large['peak_rss'] - large['idle_rss'])}"
    )
    print(
        f"Fan-out time, {large['pages']:,} / {small['pages']:,} pages: "
        f"{large['fan_out_seconds'] / small['fan_out_seconds']:.1f}"
    )
    print(
        f"Naive, {naive['pages']:,} placements held at once: peak {mb(naive['peak_rss'])}, "
        f"{mb(naive['peak_rss'] - naive['idle_rss'])} above idle "
        f"({(naive['peak_rss'] - naive['idle_rss']) / max(1, naive['held']) / 1024:.1f} KB a "
        "placement)"
    )
    print(
        f"Publishing {publishing['count']:,} placements: {publishing['single']:.2f} s one by one, "
        f"{publishing['batched']:.2f} s batched "
        f"({publishing['batched'] / publishing['single']:.2f} of the time; median of 3)"
    )


if __name__ == "__main__":
    sys.exit(main())
