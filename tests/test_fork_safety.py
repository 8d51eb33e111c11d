"""Pool processes forked while the worker's own threads are busy with Redis start clean.

The worker's main process runs threads (the delayed-job waker, the minute sampler)
that talk to Redis and the database all the time. A pool process forked at any instant
must never use a client, a connection pool or a lock its parent made, import locks
included: a lock copied while a thread held it would never open, and the task would
hang until its time limit.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time

import pytest
from django.conf import settings

from audits import submission
from audits.models import Audit
from config import redis as plumb_redis
from outbound.urls import normalize_url
from tests.workers import ROOT, wait_for

pytestmark = pytest.mark.both_databases

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


# A fresh interpreter (the test process imported everything long ago): a worker thread
# (jobs.bootsteps) ticks, and the main thread forks pool processes that each run a query.
# "import": the thread's first query, held inside the module it imports (its import lock
# held, the module half-run) for a second; "sqlite": a query a tick, without pause, each
# on a connection opened and closed (SQLite's own mutexes); "stuck": a tick that never
# ends, as one waiting on a server that vanished without closing its connection.
# The whole run is killed (SIGALRM) if a fork never returns.
FORK_WHILE_A_WORKER_THREAD_TICKS = """
import os, signal, sys, threading, time
signal.alarm(30)
from importlib.machinery import PathFinder
import django
django.setup()
from django.db import connection, connections
from audits.models import Audit, Page
from jobs.bootsteps import FORK_GATE, WorkerThread

# A SQLite file of its own, with the two tables the queries read; closed before any fork.
with connection.schema_editor() as editor:
    editor.create_model(Page)
    editor.create_model(Audit)
connection.close()
# Creating the tables imported Django's SQL compiler: forgotten, with the connection that
# keeps it, so a first query imports it again, as a pool process's first query did.
del connections["default"]
del sys.modules["django.db.models.sql.compiler"]

mode, forks = sys.argv[1], int(sys.argv[2])
# Set inside the held import.
underway = threading.Event()

class Holds:
    def find_spec(self, name, path=None, target=None):
        if threading.current_thread() is threading.main_thread():
            return None
        spec = PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = HeldLoader(spec.loader)
        return spec

class HeldLoader:
    def __init__(self, loader):
        self.loader = loader
    def create_module(self, spec):
        return self.loader.create_module(spec)
    def exec_module(self, module):
        underway.set()
        time.sleep(1)
        self.loader.exec_module(module)

if mode == "import":
    sys.meta_path.insert(0, Holds())

never = threading.Event()
if mode == "stuck":
    FORK_GATE.wait_seconds = 0.5

class Queries(WorkerThread):
    thread_name = "queries"
    def interval(self):
        return 3600 if mode == "import" else 0
    def tick(self, worker, client):
        Audit.objects.exists()
        underway.set()
        if mode == "stuck":
            never.wait()

step = Queries(None)
step.start(None)
underway.wait(10)
for n in range(1, forks + 1):
    child = os.fork()
    if child == 0:
        Audit.objects.exists()  # the pool process's first query
        os._exit(0)
    deadline = time.monotonic() + 10
    while not os.waitpid(child, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(child, 9)
            sys.exit(f"pool process {n} of {forks} hung at its first query")
        time.sleep(0.01)
print("forked", forks)
"""


def fork_while_a_worker_thread_ticks(
    mode: str, forks: int, tmp_path
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", FORK_WHILE_A_WORKER_THREAD_TICKS, mode, str(forks)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={
            **os.environ, "DEBUG": "true", "DATABASE_URL": f"sqlite:///{tmp_path / 'fork.sqlite3'}",
            "REDIS_URL": settings.REDIS_URL,
        },
    )  # fmt: skip


@pytest.mark.parametrize("mode, forks", [("import", 1), ("sqlite", 20)])
def test_no_pool_process_is_forked_while_a_worker_thread_ticks(mode, forks, tmp_path, redis_client):
    """A pool process forked while a worker thread was importing a module (SQLite's
    backend imports Django's SQL compiler at the first query) or inside SQLite's C library
    inherited that lock held by nobody: its first query waited for ever (an audit stuck
    until its soft time limit, and again at each retry). Each fork now waits for the tick.
    On SQLite whatever the suite's database: PostgreSQL's backend imports the compiler as
    it loads, and takes no such mutex, so there the test could not fail."""
    ran = fork_while_a_worker_thread_ticks(mode, forks, tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]


def test_a_tick_that_never_ends_delays_a_fork_by_the_gates_bound_only(tmp_path, redis_client):
    """A worker thread stuck in a tick (a query to a server that vanished without closing)
    held every fork of its worker for as long: the pool could not replace a process, and
    the fork runs in the main thread, whose event loop consumes and acknowledges. Past the
    gate's bound (0.5 s here) the fork goes ahead, logged; the stuck tick holds no lock
    the child needs, so the child's first query runs."""
    ran = fork_while_a_worker_thread_ticks("stuck", 3, tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]  # -14: a fork never returned
    assert "forked 3" in ran.stdout
    assert ran.stderr.count("fork_gate.forked_while_ticking") == 3, ran.stderr[-3000:]


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
