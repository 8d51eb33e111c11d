"""A pytest plugin (pyproject's addopts loads it): the environment the suite runs in,
set before pytest-django imports the settings, so `pytest` alone works as `make test` does.

- DEBUG defaults to on (manage.py's own default) for the test process, and SECRET_KEY to a
  strong key made for this process: the celery workers the tests start inherit it and run
  with DEBUG off, as a deployment's do (tests/workers.py), and every process of a test
  derives the same callback-secret key from it (audits.secrets);
- Redis defaults to TEST_REDIS_URL, else the local server's database 15, never the
  developer's database 0 (every test flushes its database);
- each pytest-xdist worker gets a Redis database of its own, REDIS_URL's number minus the
  worker's index (gw0: 15, gw1: 14, gw2: 13), so settings.REDIS_URL, the `_empty_redis`
  flush and the celery workers the tests start all agree on it.

bin/test (`make test`) sets REDIS_URL and DATABASE_URL itself, starting a throwaway Redis
when none answers; `pytest` alone uses what answers (SQLite unless DATABASE_URL is set).
"""

from __future__ import annotations

import os
import secrets

import pytest

DEFAULT_TEST_REDIS_URL = "redis://127.0.0.1:6379/15"


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    os.environ.setdefault("DEBUG", "true")
    os.environ.setdefault("SECRET_KEY", "plumb-tests-" + secrets.token_urlsafe(48))
    os.environ.setdefault("REDIS_URL", os.environ.get("TEST_REDIS_URL", DEFAULT_TEST_REDIS_URL))
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ...; unset without xdist
    if not worker:
        return
    base, _, database = os.environ["REDIS_URL"].rpartition("/")
    os.environ["REDIS_URL"] = f"{base}/{int(database) - int(worker.removeprefix('gw'))}"
