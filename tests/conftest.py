from __future__ import annotations

import pytest
import redis
from django.conf import settings

from audits.demo_site import DemoSite
from tests.workers import WorkerProcess


@pytest.fixture(autouse=True)
def _allow_private_targets(settings):
    # The test downstreams live on 127.0.0.1; tests of the guard pass allow_private=False.
    settings.AUDIT_ALLOW_PRIVATE_TARGETS = True


@pytest.fixture
def site():
    """The demo site on a free port on 127.0.0.1: a real HTTP downstream."""
    server = DemoSite().start()
    yield server
    server.stop()


@pytest.fixture
def redis_client():
    """The test Redis database, emptied before each test that uses it."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def start_worker(transactional_db, redis_client):
    """Start real `celery worker` subprocesses: start_worker("audits", env={...})."""
    started: list[WorkerProcess] = []

    def start(
        queue: str, *, concurrency: int | None = 1, pool: str | None = None, env: dict | None = None
    ) -> WorkerProcess:
        worker = WorkerProcess(queue, concurrency=concurrency, pool=pool, env=env).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
