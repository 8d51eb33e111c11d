"""The threads a worker's main process runs, started and stopped with the worker.

One mechanism for all of them: a bootstep per thread, each thread with a Redis client
of its own (`config.redis.dedicated_client`), never the process's shared one, and
never anything a pool process uses, a lock of SQLite's or an import's included: no pool
process is forked while a thread ticks (`ForkGate`). config.celery_app adds the steps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading

import redis
from celery import bootsteps
from celery.concurrency.thread import TaskPool as ThreadPool
from django.conf import settings
from django.db import connections

from config.redis import dedicated_client
from jobs import delayed, reconcile, sweeps, timelimits
from jobs.checks import plumb_tasks
from jobs.deadlines import deadline_problems
from observability import sampler

log = logging.getLogger(__name__)


def runs_threads(worker) -> bool:
    """Whether `worker`'s pool runs its tasks in threads of its own process."""
    pool = worker.pool_cls
    return isinstance(pool, type) and issubclass(pool, ThreadPool)


class UsedByTasks(bootsteps.StartStopStep):
    """A step whose service the pool's running tasks use (the time-limit watchdog, the tree
    builders): started after the pool, and on a warm shutdown stopped only once the pool
    has finished its running tasks.

    Celery stops a worker's steps in the reverse of their start order, and orders the steps
    that require nothing as its set of steps happens to iterate: the tree builders were
    stopped before the pool in one start of four, and the audits still using them failed
    (tests/test_treebuild.py, tests/test_treebuild_shutdown.py).
    """

    requires = ("celery.worker.components:Pool",)

    def stop(self, worker):
        if worker.pool is not None:
            # Celery's pool stop waits for the running tasks (and cancels what has not
            # started); the Pool step's own stop, next, finds it stopped.
            worker.pool.stop()
        super().stop(worker)


class TimeLimitCheck(bootsteps.Step):
    """Says, as the worker starts, which tasks could outlive their queue's visibility timeout.

    A hard time limit past the visibility timeout hands a slow attempt's message to a
    second worker while the first still runs it: a setting changed on one side only (a
    longer fetch timeout, a shorter visibility timeout) is named here, at the start, not
    found as a duplicate under load. It is an error in the log, not a refusal: tests of
    redelivery run workers with a visibility timeout of seconds on purpose, and
    `manage.py check` (jobs.E001), which `make run`'s migrate runs, is where a deployment
    is stopped.
    """

    label = "Time limit check"

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        problems = deadline_problems(plumb_tasks(), settings.QUEUE_VISIBILITY_TIMEOUTS)
        for problem in problems:
            log.error("worker.time_limit_exceeds_visibility_timeout", extra={"problem": problem})


class ForkGate:
    """No fork of this process while a worker thread ticks.

    A pool process forked while a thread of its parent was inside SQLite's C library (a
    connection opened or closed: SQLite's own mutexes) or an import (SQLite's backend
    imports Django's SQL compiler at the first query) inherits that lock held by a thread
    it does not have: its own first query waited on it for ever, and every task it took
    ran to its soft time limit (DECISIONS.md, "No pool process is forked while a worker
    thread ticks"). So a fork waits for the ticks under way, and holds new ones until it
    is done: a tick is milliseconds, a fork rare (the pool's start, a replaced process).

    The wait is bounded (`wait_seconds`): the fork runs in the worker's main thread, whose
    event loop also consumes and acknowledges, and a tick can be stuck for as long as a
    query to a server that vanished without closing. Such a tick waits on a socket and
    holds neither lock the gate is for (an import's or SQLite's, held for milliseconds),
    so past the bound the fork goes ahead, and says so.
    """

    def __init__(self, wait_seconds: float = 2.0):
        self.wait_seconds = wait_seconds
        self._changed = threading.Condition()
        self._ticking = 0
        self._forking = False

    @contextlib.contextmanager
    def ticking(self):
        with self._changed:
            self._changed.wait_for(lambda: not self._forking)
            self._ticking += 1
        try:
            yield
        finally:
            with self._changed:
                self._ticking -= 1
                self._changed.notify_all()

    def before_fork(self) -> None:
        with self._changed:
            self._forking = True
            if not self._changed.wait_for(lambda: self._ticking == 0, self.wait_seconds):
                log.warning(
                    "fork_gate.forked_while_ticking",
                    extra={"ticking": self._ticking, "waited_seconds": self.wait_seconds},
                )

    def after_fork_in_parent(self) -> None:
        with self._changed:
            self._forking = False
            self._changed.notify_all()

    def after_fork_in_child(self) -> None:
        # None of the parent's threads is here; its lock may be copied held.
        self.__init__(self.wait_seconds)


FORK_GATE = ForkGate()
os.register_at_fork(
    before=FORK_GATE.before_fork,
    after_in_parent=FORK_GATE.after_fork_in_parent,
    after_in_child=FORK_GATE.after_fork_in_child,
)


class WorkerThread(bootsteps.StartStopStep):
    """Runs `tick` every `interval()` seconds in a thread of the worker's main process."""

    thread_name = "worker-thread"

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def interval(self) -> float:
        raise NotImplementedError

    def tick(self, worker, client: redis.Redis) -> None:
        raise NotImplementedError

    def start(self, worker):
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._run, args=(worker,), name=self.thread_name, daemon=True
        )
        self._thread.start()

    def stop(self, worker):
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    shutdown = stop

    def _run(self, worker) -> None:
        client = dedicated_client()
        try:
            # A first tick as the worker starts, then one every interval.
            while not self._stopping.is_set():
                with FORK_GATE.ticking():
                    self._tick_once(worker, client)
                self._stopping.wait(self.interval())
        finally:
            client.close()

    def _tick_once(self, worker, client: redis.Redis) -> None:
        """One tick; nothing it raises, nor logging that, nor closing the connections, ends
        the thread (a Redis or database hiccup is exactly what it must outlive)."""
        try:
            self.tick(worker, client)
        except Exception:
            # `thread` is a LogRecord attribute: logging refuses it as an `extra` key.
            log.exception("worker_thread.failed", extra={"worker_thread": self.thread_name})
        finally:
            # This thread's own database connection: not held between ticks.
            try:
                connections.close_all()
            except Exception:
                log.exception(
                    "worker_thread.close_failed", extra={"worker_thread": self.thread_name}
                )


class DelayedWaker(WorkerThread):
    """Publishes the delayed-store entries of the queue this worker consumes as they come due.

    Whatever runs a queue's jobs also wakes them, with no other process to keep alive.
    Several workers waking the same queue is fine: the lease hands each entry to one.
    """

    label = "Delayed job waker"
    thread_name = "delayed-waker"

    def interval(self) -> float:
        # Spread, so the workers of one queue do not all poll in the same instant.
        return settings.DELAYED_POLL_INTERVAL_SECONDS * random.uniform(0.8, 1.2)

    def tick(self, worker, client: redis.Redis) -> None:
        for queue in sorted(worker.app.amqp.queues.consume_from):
            woken = delayed.wake_due(queue, client=client, app=worker.app)
            if woken:
                log.info("delayed.woken", extra={"queue": queue, "count": woken})


class Reconciler(WorkerThread):
    """Publishes again what PostgreSQL says is owed and Redis lost (jobs.reconcile).

    Every worker runs one; a lock in Redis lets one of them a tick do the work, so the
    reconciler lives as long as any worker does and needs no beat.
    """

    label = "Owed-work reconciler"
    thread_name = "reconciler"

    def interval(self) -> float:
        return settings.RECONCILE_INTERVAL_SECONDS * random.uniform(0.8, 1.2)

    def tick(self, worker, client: redis.Redis) -> None:
        reconcile.tick(client)


class Sweeper(WorkerThread):
    """Runs the apps' periodic sweeps (jobs.sweeps), each by one worker an interval.

    It ticks about once a second, so a sweep's lock lapsing is seen within a second by
    some worker; a tick that takes no lock is one SET per sweep.
    """

    label = "Periodic sweeps"
    thread_name = "sweeper"

    def interval(self) -> float:
        return min(1.0, sweeps.shortest_interval()) * random.uniform(0.8, 1.2)

    def tick(self, worker, client: redis.Redis) -> None:
        sweeps.tick(client)


class MinuteSampler(WorkerThread):
    """Once a minute, one worker (any host) records the gauges for the dashboard."""

    label = "Metrics minute sampler"
    thread_name = "metrics-sampler"

    def interval(self) -> float:
        return sampler.seconds_to_next_sample()

    def tick(self, worker, client: redis.Redis) -> None:
        sampler.sample_once(client=client)


class TimeLimitWatchdog(UsedByTasks, WorkerThread):
    """Enforces the tasks' time limits in a thread-pool worker, where Celery does not, until
    its last task has ended."""

    label = "Time limit watchdog"
    thread_name = "time-limit-watchdog"

    def include_if(self, worker) -> bool:
        return runs_threads(worker)

    def interval(self) -> float:
        return 1.0

    def tick(self, worker, client: redis.Redis) -> None:
        timelimits.enforce()
