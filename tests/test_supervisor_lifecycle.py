"""`make run`'s supervisor stops whole: on SIGINT and SIGTERM every time, and when it is
SIGKILLed its children die with it and the next start stops what they left.

The supervisor runs in a process of its own, in its main thread with its signal
handling, as `manage.py runstack` runs it; its programs are light (sleep, and a shell
with a child of its own) so forty starts and stops take seconds, not the stack's minutes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.stack import left_running, running
from tests.workers import wait_for

ROOT = Path(__file__).resolve().parent.parent
STOPS_PER_SIGNAL = 20

SUPERVISE = """
import sys
from pathlib import Path
from devstack.supervisor import Supervisor

supervisor = Supervisor(sys.stdout, stop_timeout=5, pid_file=Path(sys.argv[1]))
supervisor.add("sleeper", "sleep 600")
supervisor.add("python", sys.executable + " -c 'import time; time.sleep(600)'")
# A program with a child of its own, as gunicorn and Celery's prefork pool have.
supervisor.add("family", "sh -c 'sleep 600 & wait'")
sys.exit(supervisor.run())
"""
PROGRAMS = 3


# Every process a test's supervisors started: whatever a failing test leaves is killed.
_seen: list[psutil.Process] = []


@pytest.fixture(autouse=True)
def _kill_leftovers():
    yield
    for process in _seen:
        if running(process):
            process.kill()
    _seen.clear()


def start_supervisor(pid_file: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", SUPERVISE, str(pid_file)], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def started_family(supervisor: subprocess.Popen, pid_file: Path) -> list[psutil.Process]:
    """Every process under the supervisor, once each program and the shell's child run."""

    def all_started():
        if supervisor.poll() is not None:
            raise AssertionError(f"the supervisor exited: {supervisor.stdout.read()}")
        if not pid_file.exists() or len(json.loads(pid_file.read_text())["groups"]) < PROGRAMS:
            return None
        family = psutil.Process(supervisor.pid).children(recursive=True)
        return family if len(family) >= PROGRAMS + 1 else None

    family = wait_for(all_started, timeout=20, interval=0.02, message="the programs to start")
    _seen.extend(family)
    return family


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_every_process_every_time(tmp_path, signum):
    pid_file = tmp_path / "stack.pids"
    for attempt in range(STOPS_PER_SIGNAL):
        supervisor = start_supervisor(pid_file)
        family = started_family(supervisor, pid_file)
        supervisor.send_signal(signum)
        try:
            output, _ = supervisor.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            supervisor.kill()
            pytest.fail(f"stop {attempt + 1}: the supervisor still ran 20 s after {signum.name}")
        assert supervisor.returncode == 0, output
        assert f"{signum.name}: stopping every process" in output
        assert left_running(family, within=5) == [], f"stop {attempt + 1}:\n{output}"
        assert not pid_file.exists()  # a clean stop leaves nothing for the next start to do


def test_children_die_with_a_sigkilled_supervisor_and_the_next_start_stops_the_rest(tmp_path):
    pid_file = tmp_path / "stack.pids"
    supervisor = start_supervisor(pid_file)
    family = started_family(supervisor, pid_file)
    children = psutil.Process(supervisor.pid).children()
    assert len(children) == PROGRAMS

    supervisor.kill()
    supervisor.wait(timeout=10)
    # The kernel's parent-death signal: every program the supervisor started.
    assert left_running(children, within=5) == []
    # The shell's own child outlived it (re-parented to init): the pid file names its
    # process group, and the next start stops it before starting anything.
    orphans = [p for p in family if p not in children and running(p)]
    assert orphans

    again = start_supervisor(pid_file)
    try:
        started_family(again, pid_file)
        assert left_running(orphans, within=10) == []
    finally:
        again.send_signal(signal.SIGTERM)
        output, _ = again.communicate(timeout=20)
    assert "stopping family left by the last run" in output


def test_a_second_supervisor_refuses_to_start_beside_a_live_one(tmp_path):
    pid_file = tmp_path / "stack.pids"
    first = start_supervisor(pid_file)
    try:
        family = started_family(first, pid_file)
        second = start_supervisor(pid_file)
        output, _ = second.communicate(timeout=20)
        assert second.returncode != 0
        assert "another stack's supervisor is running" in output
        assert all(process.is_running() for process in family)
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=20)
