"""Issue 26: auditing a decompression bomb with a real audits worker costs it no more than the
page cap, and the audit says the page was truncated."""

from __future__ import annotations

import contextlib
import threading

import psutil
import pytest
from django.conf import settings

from audits.models import Audit
from audits.submission import submit_audit
from outbound.urls import normalize_url
from tests.hostile import HostileServer, bomb
from tests.workers import wait_for

pytestmark = pytest.mark.slow

MAX_GROWTH_BYTES = 200 * 1024 * 1024


class WorkerMemory:
    """The peak resident memory of a worker's whole process tree, sampled every 10 ms."""

    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        self.peak = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def now(self) -> int:
        processes = [self.root, *self.root.children(recursive=True)]
        total = 0
        for process in processes:
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


def audit_of(url: str, *, show) -> Audit:
    audit = submit_audit(normalize_url(url))
    return wait_for(
        lambda: (row := Audit.objects.get(id=audit.id)).status in Audit.FINISHED and row,
        timeout=60, message=f"the audit of {url}", show=show,
    )  # fmt: skip


def test_auditing_a_gigabyte_bomb_grows_no_worker_past_the_page_cap(start_worker, http_server):
    bomb(("gzip", "gzip"))  # built before the worker is watched: seconds of CPU
    server = http_server(HostileServer())
    worker = start_worker("audits", pool="threads", concurrency=4)
    # A first audit loads whatever an audit loads, so the growth is the bomb's alone.
    warm = audit_of(f"{server.base_url}/plain?codings=gzip", show=[worker])
    assert warm.status == Audit.Status.SUCCEEDED, warm.error
    with WorkerMemory(worker.process.pid) as memory:
        audit = audit_of(f"{server.base_url}/bomb?codings=gzip,gzip", show=[worker])
    assert audit.status == Audit.Status.SUCCEEDED, audit.error
    assert audit.result["truncated"] is True
    assert audit.result["bytes"] == settings.AUDIT_MAX_PAGE_BYTES
    growth = memory.peak - memory.start
    assert growth < MAX_GROWTH_BYTES, f"the worker grew {growth / 2**20:.0f} MiB"
