"""The whole `make run` stack, killed: nothing it started outlives it.

runstack starts its own Redis here (REDIS_URL names a free local port), so the test
covers that child too, and gunicorn's workers, the grandchildren.
"""

from __future__ import annotations

import psutil

from config.devservices import free_port
from tests.stack import healthy, left_running, runstack, stack_env
from tests.workers import wait_for


def test_a_sigkilled_stack_leaves_no_process(tmp_path):
    env = stack_env(tmp_path, {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    stack = runstack(env)
    family = []
    try:
        wait_for(lambda: healthy(stack, env), timeout=180, interval=0.5, message="/healthz")
        family = psutil.Process(stack.pid).children(recursive=True)
        names = " ".join(" ".join(p.cmdline()) for p in family)
        assert "redis-server" in names and "gunicorn" in names and "celery" in names
        stack.kill()
        stack.communicate(timeout=10)
        assert left_running(family, within=15) == []
    finally:
        for process in left_running(family, within=0):
            process.kill()
