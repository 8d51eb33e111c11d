"""Pool processes forked while the worker's own threads are busy with Redis start clean.

The worker's main process runs threads (the delayed-job waker, the minute sampler)
that talk to Redis all the time. A pool process forked at any instant must never
use a client, a connection pool or a lock its parent made: a lock copied while a
thread held it would never open, and the task would hang until its hard time limit.
"""

from __future__ import annotations

import multiprocessing
import re
import threading
import time

import pytest

from audits import submission
from audits.models import Audit
from config import redis as plumb_redis
from outbound.urls import normalize_url
from tests.workers import wait_for

AUDITS = 12


def _ping_from_the_child(answers) -> None:
    answers.put(plumb_redis.redis_client().ping())


def test_a_forked_child_never_waits_on_a_pool_lock_its_parent_held_at_the_fork(redis_client):
    parent = plumb_redis.redis_client()
    parent.ping()
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    # Another thread of the parent is inside the pool (its lock held) at the fork.
    holding, forked = threading.Event(), threading.Event()

    def hold_the_pool_lock():
        with parent.connection_pool._lock:
            holding.set()
            forked.wait(10)

    holder = threading.Thread(target=hold_the_pool_lock)
    holder.start()
    holding.wait(10)
    child = context.Process(target=_ping_from_the_child, args=(answers,))
    child.start()
    forked.set()
    holder.join()
    child.join(timeout=10)
    if child.exitcode is None:
        child.kill()
    assert child.exitcode == 0, "the child hung on a lock copied from its parent"
    assert answers.get(timeout=1) is True


@pytest.mark.slow
def test_every_new_pool_process_runs_its_task_within_seconds(site, start_worker):
    worker = start_worker(
        "audits",
        concurrency=2,
        # The waker polls Redis a hundred times a second: forks land while it is mid-call.
        env={"DELAYED_POLL_INTERVAL_SECONDS": "0.01"},
        # A fresh process for every task: twelve forks under a busy main process.
        options=["--max-tasks-per-child", "1"],
    )
    started = time.monotonic()
    audits = [
        submission.submit_audit(normalize_url(f"{site.base_url}/noindex?n={n}"))
        for n in range(AUDITS)
    ]
    wait_for(
        lambda: Audit.objects.filter(id__in=[a.id for a in audits], status="succeeded").count()
        == AUDITS,
        timeout=60, message="every audit to succeed", show=[worker],
    )  # fmt: skip
    # A hung first Redis call would hold its audit until the 70 s hard limit.
    assert time.monotonic() - started < 30, worker.output()
    processes = set(re.findall(r"task\.started .*pid=(\d+)", worker.output()))
    assert len(processes) >= AUDITS, worker.output()
