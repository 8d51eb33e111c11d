"""The workers the suite starts end with the test process that started them, however it ends."""

from __future__ import annotations

import subprocess
import sys

import psutil

from tests.stack import left_running, running
from tests.workers import ROOT

# A stand-in test process: it starts a stand-in worker as WorkerProcess.start does (a
# session of its own, devstack.supervisor.die_with_parent), prints the worker's pid once
# the worker runs (Popen returns after the exec), and waits to be killed.
TEST_PROCESS = """
import os, subprocess, sys, time
from devstack.supervisor import die_with_parent
worker = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(120)"],
    start_new_session=True, preexec_fn=die_with_parent(os.getpid()),
)
print(worker.pid, flush=True)
time.sleep(120)
"""


def test_a_worker_ends_when_its_test_process_is_killed_outright():
    test_process = subprocess.Popen(
        [sys.executable, "-c", TEST_PROCESS], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        worker = psutil.Process(int(test_process.stdout.readline()))
        assert running(worker)
        test_process.kill()  # no teardown runs: SIGKILL, or a timeout's SIGTERM
        test_process.wait(timeout=10)
        assert left_running([worker], within=10) == []
    finally:
        test_process.kill()
        test_process.wait(timeout=10)
