"""A redis-server of one test's own, on a free port of 127.0.0.1: for the tests that stop
Redis, restart it empty or start it with other settings, which the shared test Redis
must never see. The `start_private_redis` and `private_redis` fixtures (tests/conftest.py)
start one and stop it when the test ends.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from config import devservices
from config.celery_app import app
from tests.workers import wait_for


class PrivateRedis:
    """`options`: redis-server arguments beyond devservices.redis_command's (no persistence)."""

    def __init__(self, *options: str):
        self.options = options
        self.port = devservices.free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.data_dir = Path(tempfile.mkdtemp(prefix="plumb-private-redis-"))
        self.process: subprocess.Popen | None = None

    def start(self) -> PrivateRedis:
        """Start it (again, on the same port, empty) and wait until it answers."""
        command = [*devservices.redis_command(self.port, self.data_dir), *self.options]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        wait_for(
            lambda: devservices.redis_answers(self.url, timeout=0.2)
            or self.process.poll() is not None,
            timeout=10, interval=0.05, message=f"redis-server on port {self.port}",
        )  # fmt: skip
        if self.process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {self.process.returncode}")
        return self

    def stop(self) -> None:
        """Stop it (SIGTERM: without persistence, everything it held is gone)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def restart_empty(self, *, down_seconds: float = 3.0) -> None:
        """Away for `down_seconds`, as in a restart or a failover, then back with nothing."""
        self.stop()
        time.sleep(down_seconds)  # the outage itself: what the test is about
        self.start()

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def publish(self, task: str, args: list, *, task_id: str, queue: str) -> None:
        """Publish as the web process would, to this Redis."""
        with app.connection_for_write(self.url) as connection:
            app.send_task(task, args=args, task_id=task_id, queue=queue, connection=connection)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
