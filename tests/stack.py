"""`manage.py runstack` (what `make run` runs) as a test starts it (its own SQLite file,
var/ directory and free ports; Redis as the test says), and what is left of its processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import psutil

from config.devservices import free_port

ROOT = Path(__file__).resolve().parent.parent


def stack_env(tmp_path: Path, redis_env: dict[str, str]) -> dict[str, str]:
    return {
        **os.environ,
        **redis_env,
        "DEBUG": "true",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'stack.sqlite3'}",
        "PLUMB_VAR_DIR": str(tmp_path / "var"),
        "WEB_PORT": str(free_port()),
        "FLOWER_PORT": str(free_port()),
        "AUDITS_WORKER_PROCESSES": "1",
    }


def runstack(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "manage.py", "runstack"], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def healthy(stack: subprocess.Popen, env: dict[str, str]) -> bool:
    """Whether the stack's /healthz answers 200 (fails if the stack has exited)."""
    assert stack.poll() is None, stack.stdout.read()
    try:
        return (
            httpx2.get(f"http://127.0.0.1:{env['WEB_PORT']}/healthz", timeout=2).status_code == 200
        )
    except httpx2.HTTPError:
        return False


def running(process: psutil.Process) -> bool:
    # A zombie has exited: its new parent (init, for an orphan) has yet to reap it.
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def left_running(processes: list[psutil.Process], within: float) -> list[psutil.Process]:
    """The processes still running after up to `within` s."""
    deadline = time.monotonic() + within
    while (alive := [p for p in processes if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive
