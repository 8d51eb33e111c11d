#!/usr/bin/env python
"""What auditing a decompression bomb costs an audits worker (issue 26).

    .venv/bin/python bench/decompression_bomb.py

Serves, from 127.0.0.1, the issue's bomb (a GiB of zeros gzipped twice: 1,827 bytes,
`Content-Encoding: gzip, gzip`) and, as the reference, a plain 8 MiB page that the
audit truncates at AUDIT_MAX_PAGE_BYTES (5 MiB) like the bomb. A real
`celery worker -Q audits -P threads` audits each in turn (after one warm-up audit),
while the peak resident memory of its process tree is sampled every 10 ms. For the
old behaviour, this process reads the bomb's first 5 MiB the way the page fetch did
before (httpx 0.28.1's own `iter_bytes()`, which inflates each chunk whole through every
coding; httpx 0.28.1 is installed with the dev tools), under the same sampling. Prints each peak growth and the ratios; uses a
throwaway Redis and a fresh database (DATABASE_URL's server, else SQLite).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.services import create_database, start_redis  # noqa: E402

redis_process, redis_url = start_redis()
database_url, drop_database = create_database()
os.environ.update(
    DJANGO_SETTINGS_MODULE="config.settings",
    DEBUG="true",
    REDIS_URL=redis_url,
    DATABASE_URL=database_url,
    AUDIT_ALLOW_PRIVATE_TARGETS="true",
    LOG_LEVEL="WARNING",
)

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
import psutil  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from audits.models import Audit  # noqa: E402
from audits.submission import submit_audit  # noqa: E402
from devstack.demo_site import DemoSite  # noqa: E402
from outbound.urls import normalize_url  # noqa: E402
from tests.hostile import HostileServer, bomb  # noqa: E402
from tests.workers import WorkerProcess, wait_for  # noqa: E402

MIB = 1024 * 1024


class PeakMemory:
    """Peak resident memory of a process tree above its start, sampled every 10 ms."""

    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def now(self) -> int:
        total = 0
        for process in [self.root, *self.root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += process.memory_info().rss
        return total

    def _sample(self):
        while not self._stopping.wait(0.01):
            self.peak = max(self.peak, self.now())

    def __enter__(self):
        self.start = self.peak = self.now()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stopping.set()
        self._thread.join()

    @property
    def growth_mib(self) -> float:
        return (self.peak - self.start) / MIB


def audit(url: str, worker: WorkerProcess) -> tuple[Audit, float, float]:
    """(finished audit, peak growth of the worker in MiB, seconds)."""
    started = time.monotonic()
    with PeakMemory(worker.process.pid) as memory:
        row = submit_audit(normalize_url(url))
        row = wait_for(
            lambda: (a := Audit.objects.get(id=row.id)).status in Audit.FINISHED and a,
            timeout=120, message=f"the audit of {url}", show=[worker],
        )  # fmt: skip
    return row, memory.growth_mib, time.monotonic() - started


def old_page_read(url: str, max_bytes: int) -> float:
    """Peak growth of this process reading `url` as the page fetch did before issue 26."""
    with (
        PeakMemory(os.getpid()) as memory,
        httpx.Client(timeout=120) as client,
        client.stream("GET", url) as response,
    ):
        size = 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size >= max_bytes:
                break
    return memory.growth_mib


def main() -> None:
    call_command("migrate", verbosity=0)
    print(f"building the bomb: {len(bomb(('gzip', 'gzip'))):,} bytes on the wire")
    hostile = HostileServer().start()
    site = DemoSite().start()
    # The worker logs at INFO: WorkerProcess waits for its "ready." line.
    worker = WorkerProcess(
        "audits", pool="threads", concurrency=4, env={"LOG_LEVEL": "INFO"}
    ).start(timeout=60)
    cap = settings.AUDIT_MAX_PAGE_BYTES
    try:
        warm, _, _ = audit(f"{hostile.base_url}/plain?codings=gzip", worker)
        assert warm.status == Audit.Status.SUCCEEDED, warm.error
        rows = {}
        for name, url in [
            ("plain 8 MiB page (reference)", f"{site.base_url}/huge?mb=8"),
            ("bomb: 1 GiB, gzip, gzip", f"{hostile.base_url}/bomb?codings=gzip,gzip"),
            ("bomb: 1 GiB, gzip x3", f"{hostile.base_url}/bomb?codings=gzip,gzip,gzip"),
        ]:
            rows[name] = audit(url, worker)
        old = old_page_read(f"{hostile.base_url}/bomb?codings=gzip,gzip", cap)
    finally:
        worker.stop()
        hostile.stop()
        site.stop()
    print(f"\nAUDIT_MAX_PAGE_BYTES = {cap / MIB:g} MiB; audits worker, 4 threads\n")
    print("| page | audit | truncated | bytes | worker peak growth | seconds |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, (row, growth, seconds) in rows.items():
        result = row.result or {}
        outcome = row.status if row.status == "succeeded" else f"{row.status}: {row.error[:70]}"
        print(
            f"| {name} | {outcome} | {result.get('truncated', '-')} | "
            f"{result.get('bytes', '-')} | {growth:.1f} MiB | {seconds:.2f} |"
        )
    reference = rows["plain 8 MiB page (reference)"][1]
    now = rows["bomb: 1 GiB, gzip, gzip"][1]
    print(
        f"| bomb, read as before (httpx 0.28.1 iter_bytes, this process) | - | - | - | {old:.1f} MiB | - |"
    )
    print(f"\nbomb / plain page, worker peak growth: {now / max(reference, 0.1):.2f}x")
    print(f"bomb before / bomb now: {old / max(now, 0.1):.0f}x")


if __name__ == "__main__":
    try:
        main()
    finally:
        drop_database()
        if redis_process is not None:
            redis_process.terminate()
