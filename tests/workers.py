"""Real `celery worker` processes for the tests, against the test database and Redis.

A worker is a subprocess in its own session, so a test can SIGKILL the whole
worker (main process and pool children) the way a crashed host would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.db import connection

from devstack.supervisor import die_with_parent

ROOT = Path(__file__).resolve().parent.parent

# Every test worker's settings unless a test says otherwise. As in the test process
# (conftest's _no_slow_start): tests that want the page slow start ask for it.
TEST_WORKER_ENV = {"PAGE_FETCH_WARMUP_RATE": "0"}

# A worker shared by a module's tests reconciles once, when it starts. Each test flushes
# Redis under it, and a later tick would find its mark gone and publish again everything
# owed (Redis "came back empty"): a second message for the test's rows, which a test
# counting attempts or requests would see. Reconciling is the fault tests' subject; they
# start workers of their own.
SHARED_WORKER_ENV = {"RECONCILE_INTERVAL_SECONDS": str(24 * 3600)}


def database_url_for_workers() -> str:
    """The test database (the one pytest-django created) as a DATABASE_URL: DATABASE_URL
    with the test database's name, so its host list and options (a multi-host URL's
    target_session_attrs) carry over."""
    db = connection.settings_dict
    if db["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{db['NAME']}"
    return urlunsplit(urlsplit(settings.DATABASE_URL)._replace(path=f"/{db['NAME']}"))


def reaudit_as_make_run() -> dict:
    """The reaudit worker's pool options as `make run` starts it (devstack runstack)."""
    return {
        "pool": settings.REAUDIT_WORKER_POOL,
        "concurrency": settings.REAUDIT_WORKER_CONCURRENCY,
    }


def worker_debug() -> str:
    """DEBUG for a started worker: off, as a deployment's workers run (with DEBUG on,
    Django logs every query and jobs.sql binds statements client-side instead of preparing
    them). The suite's key allows it (tests/environment.py); a bench run outside the suite
    on the generated development key, which the settings refuse with DEBUG off, keeps it on."""
    return "true" if settings.SECRET_KEY.startswith(settings.DEV_SECRET_KEY_PREFIX) else "false"


class WorkerProcess:
    def __init__(
        self,
        queue: str,
        *,
        concurrency: int | None = 1,
        pool: str | None = None,
        env: dict | None = None,
        options: list[str] | None = None,
    ):
        self.queue = queue
        self.options = list(options or [])
        self.name = f"test-{queue}-{uuid.uuid4().hex[:8]}"
        self.env = {
            **os.environ,
            "DEBUG": worker_debug(),
            "DATABASE_URL": database_url_for_workers(),
            "REDIS_URL": settings.REDIS_URL,
            "AUDIT_ALLOW_PRIVATE_TARGETS": "true",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.concurrency = concurrency
        self.pool = pool
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> WorkerProcess:
        command = [
            sys.executable, "-m", "celery", "-A", "config", "worker",
            "-Q", self.queue, "-n", f"{self.name}@%h",
            "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        # None: the worker decides (the webhooks worker sizes itself from its settings).
        if self.concurrency is not None:
            command += ["--concurrency", str(self.concurrency)]
        if self.pool is not None:
            command += ["--pool", self.pool]
        command += self.options
        # Killed when the test process ends, as runstack's children are: a run killed outright
        # (SIGKILL, a timeout's SIGTERM) runs no teardown, and its workers, each in a session
        # of its own, went on taking the next run's messages from the same Redis database.
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True, preexec_fn=die_with_parent(os.getpid()),
        )  # fmt: skip
        threading.Thread(target=self._read_output, daemon=True).start()
        if not self._ready.wait(timeout):
            self.stop()
            raise RuntimeError(f"worker {self.name} not ready in {timeout}s:\n{self.output()}")
        return self

    def _read_output(self):
        for line in self.process.stdout:
            self.lines.append(line)
            if " ready." in line:
                self._ready.set()

    def output(self) -> str:
        return "".join(self.lines[-200:])

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def hand_over(self) -> WorkerProcess:
        """The worker for the next test of its module: its output starts afresh, so what the
        test reads in it is its own."""
        self.lines.clear()
        return self

    def children(self) -> list[int]:
        result = subprocess.run(
            ["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True, check=False
        )
        return [int(pid) for pid in result.stdout.split()]

    def kill(self) -> None:
        """SIGKILL the worker and its pool children at once: nothing gets to clean up."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def end(self) -> None:
        """SIGKILL the worker's whole process group, whatever state it is in (its pool
        children too, even if the test already ended the main process): how `start_worker`
        ends a test's workers once the test is over. Nothing a test asserts depends on how
        its workers end, and the next test starts from an empty Redis and database; a warm
        shutdown (`stop`) takes 2 to 4 s a worker, a fifth of the suite's time, this 0.05 s."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self, timeout: float = 15.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def terminate(process: subprocess.Popen, grace: float = 15.0) -> None:
    """End `process` as runstack's supervisor ends a program: SIGTERM, then SIGKILL after
    `grace` seconds. For a test that asserts nothing of the exit: once in a CI run Flower
    outlived 15 s of SIGTERM, and the cleanup failed a test whose assertions held."""
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def started_worker(
    queue: str,
    *,
    concurrency: int | None = 1,
    pool: str | None = None,
    env: dict | None = None,
    options: list[str] | None = None,
) -> WorkerProcess:
    """A worker started for a test: the tests' settings (TEST_WORKER_ENV), then `env`."""
    return WorkerProcess(
        queue,
        concurrency=concurrency,
        pool=pool,
        env={**TEST_WORKER_ENV, **(env or {})},
        options=options,
    ).start()


def module_worker(
    queue: str,
    *,
    concurrency: int | None = 1,
    pool: str | None = None,
    env: dict | None = None,
    options: list[str] | None = None,
):
    """A fixture: one worker started for the module's tests that ask for it by this
    fixture's name (`audits_worker = module_worker("audits")`), instead of one a test.

    It runs only while such tests run: before a test that does not ask for it, the
    `_only_requested_workers` fixture ends it, and the next test that does starts it
    again. Order a module's tests so those sharing it are together. A test that kills
    it gets a new one in the next test. Each test starts from an empty database and Redis
    under the running worker, which consumes the next test's messages as it did the
    first's. Tests that kill a worker, or watch what a start does, use `start_worker`."""
    settings_env = {**SHARED_WORKER_ENV, **(env or {})}

    @pytest.fixture
    def worker(request, transactional_db, redis_client, kept_workers) -> WorkerProcess:
        kept = kept_workers.get(request.fixturename)
        if kept is not None and kept.running():
            return kept.hand_over()
        started = started_worker(
            queue, concurrency=concurrency, pool=pool, env=settings_env, options=options
        )
        kept_workers[request.fixturename] = started
        return started

    return worker


def wait_for(
    predicate,
    *,
    timeout: float,
    interval: float = 0.1,
    message: str = "condition",
    show: Iterable[WorkerProcess] = (),
):
    """Poll `predicate` until it is truthy; on timeout fail with the output of `show`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    outputs = "".join(f"\n--- {worker.name} ---\n{worker.output()}" for worker in show)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}{outputs}")
