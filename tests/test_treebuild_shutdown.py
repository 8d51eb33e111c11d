"""A worker stopped as `make run`'s supervisor stops it (SIGTERM to its process group) while
its tree builders hold pages: its warm shutdown finishes every audit it started, each page
read with its tree, and no builder is left behind (audits.treebuild)."""

from __future__ import annotations

import os
import signal

import httpx2
import psutil
import pytest

from audits.models import Audit
from tests.hostile_pages import HostilePages, distinct_attributes, one_tag_page
from tests.workers import wait_for

pytestmark = pytest.mark.slow

# About a second of Lexbor in a child, well past AUDIT_TREE_IN_PROCESS_MAX_BYTES: a page
# that is still being built when the signal comes.
SLOW_TREE = one_tag_page(distinct_attributes(20_000), title="Slow tree")
AUDITS = 3


def builders(worker) -> list[psutil.Process]:
    """The fork server and the children under the worker (none in a process group of the
    worker's own would survive its SIGKILL: they end with its pipes)."""
    return psutil.Process(worker.process.pid).children(recursive=True)


def busy_builder(worker) -> bool:
    return any(sum(child.cpu_times()[:2]) > 0.2 for child in builders(worker))


def test_a_group_sigterm_lets_the_builders_finish_the_pages_the_worker_holds(
    live_server, http_server, start_worker
):
    site = http_server(HostilePages())
    site.pages["/slow-tree"] = (SLOW_TREE, None, "text/html")
    worker = start_worker(
        "audits", concurrency=AUDITS, pool="threads",
        env={"AUDIT_MAX_LINK_CHECKS": "0", "AUDIT_TREE_SECONDS": "30",
             "AUDIT_TREE_WAIT_SECONDS": "30"},
    )  # fmt: skip
    ids = []
    for n in range(AUDITS):
        response = httpx2.post(
            f"{live_server.url}/api/audits", json={"url": f"{site.url}/slow-tree?{n}"}, timeout=10
        )
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    wait_for(lambda: Audit.objects.filter(id__in=ids, status="running").count() == AUDITS,
             timeout=30, show=[worker])  # fmt: skip
    wait_for(lambda: busy_builder(worker), timeout=30, show=[worker])
    left = builders(worker)
    os.killpg(worker.process.pid, signal.SIGTERM)
    worker.process.wait(timeout=90)
    audits = list(Audit.objects.filter(id__in=ids))
    assert {audit.status for audit in audits} == {"succeeded"}, [
        (audit.status, audit.error) for audit in audits
    ]
    for audit in audits:
        link_text = next(f for f in audit.result["findings"] if f["id"] == "link-text")
        assert "reason" not in link_text.get("details", {}), link_text
        assert audit.attempts == 1
    wait_for(lambda: not any(process.is_running() for process in left), timeout=10)


def test_builders_of_a_sigkilled_worker_end_with_it(live_server, http_server, start_worker):
    # In a session of their own, a SIGKILL of the worker's process group does not reach
    # them: they end with the worker's pipes, a page in hand finished first.
    site = http_server(HostilePages())
    site.pages["/slow-tree"] = (SLOW_TREE, None, "text/html")
    worker = start_worker(
        "audits", concurrency=1, pool="threads",
        env={"AUDIT_MAX_LINK_CHECKS": "0", "AUDIT_TREE_SECONDS": "30"},
    )  # fmt: skip
    response = httpx2.post(
        f"{live_server.url}/api/audits", json={"url": f"{site.url}/slow-tree"}, timeout=10
    )
    assert response.status_code == 202, response.text
    wait_for(lambda: busy_builder(worker), timeout=30, show=[worker])
    left = builders(worker)
    worker.kill()
    wait_for(lambda: not any(process.is_running() for process in left), timeout=15)
