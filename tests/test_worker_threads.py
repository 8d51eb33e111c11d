"""Every worker thread (jobs.bootsteps) outlives any exception in its tick, logs it, and
ticks again. tests/faults/test_broker_outage.py shows the same with Redis really gone."""

from __future__ import annotations

import logging
import threading

import pytest
from celery import bootsteps

from config.celery_app import app
from jobs.bootsteps import (
    DelayedWaker,
    MinuteSampler,
    Reconciler,
    Sweeper,
    TimeLimitWatchdog,
    WorkerThread,
)
from tests.workers import wait_for

THREADS = [DelayedWaker, MinuteSampler, Reconciler, Sweeper, TimeLimitWatchdog]


class FailingTicks:
    """A tick that always raises, as every Redis call does while Redis is away."""

    def __init__(self):
        self.ticks = 0
        self.lock = threading.Lock()

    def __call__(self, worker, client):
        with self.lock:
            self.ticks += 1
        raise ConnectionError("Redis went away")


class Worker:
    app = app
    pool = None  # a worker whose pool has not started, or has none


@pytest.mark.parametrize("thread_class", THREADS, ids=lambda cls: cls.__name__)
def test_a_worker_thread_ticks_again_after_its_tick_fails(thread_class, monkeypatch, caplog):
    assert issubclass(thread_class, WorkerThread) and issubclass(thread_class, bootsteps.Step)
    failing = FailingTicks()
    monkeypatch.setattr(thread_class, "tick", lambda self, worker, client: failing(worker, client))
    monkeypatch.setattr(thread_class, "interval", lambda self: 0.01)
    step = thread_class(Worker())
    with caplog.at_level(logging.ERROR, logger="jobs.bootsteps"):
        step.start(Worker())
        try:
            wait_for(lambda: failing.ticks >= 3, timeout=10, message="three failed ticks")
            assert step._thread.is_alive()
        finally:
            step.stop(Worker())
    failures = [r for r in caplog.records if r.getMessage() == "worker_thread.failed"]
    assert failures and failures[0].worker_thread == thread_class.thread_name
    assert failures[0].exc_info[0] is ConnectionError
