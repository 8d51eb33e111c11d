"""A pytest plugin (bin/test loads it with -p): each pytest-xdist worker gets a Redis
database of its own, REDIS_URL's number minus the worker's index (gw0: 15, gw1: 14).

It runs before pytest-django imports the settings, so settings.REDIS_URL, the
`_empty_redis` flush and the celery workers the tests start all agree on it.
"""

from __future__ import annotations

import os

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ...; unset without xdist
    url = os.environ.get("REDIS_URL")
    if not worker or not url:
        return
    base, _, database = url.rpartition("/")
    os.environ["REDIS_URL"] = f"{base}/{int(database) - int(worker.removeprefix('gw'))}"
