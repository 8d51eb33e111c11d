"""The workers the suite starts end with the test process that started them, however it ends."""

from __future__ import annotations

import subprocess
import sys

import psutil

from tests.workers import DIE_WITH_THE_TEST_PROCESS, wait_for

WORKER = "import time; time.sleep(120)"
# A stand-in test process: it starts a stand-in worker as WorkerProcess.start does (its own
# session, the same first step), prints the worker's pid and waits to be killed.
TEST_PROCESS = """
import os, subprocess, sys, time
worker = subprocess.Popen(
    [sys.executable, "-c", sys.argv[1], str(os.getpid()), "-c", sys.argv[2]],
    start_new_session=True,
)
print(worker.pid, flush=True)
time.sleep(120)
"""


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_worker_ends_when_its_test_process_is_killed_outright():
    test_process = subprocess.Popen(
        [sys.executable, "-c", TEST_PROCESS, DIE_WITH_THE_TEST_PROCESS, WORKER],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        worker = int(test_process.stdout.readline())
        # Killed once the worker runs its own command: before, its first step ends it.
        wait_for(lambda: psutil.Process(worker).cmdline()[1:] == ["-c", WORKER], timeout=10,
                 message="the worker's own command")  # fmt: skip
        test_process.kill()  # no teardown runs: SIGKILL, or a timeout's SIGTERM
        test_process.wait(timeout=10)
        wait_for(lambda: not running(worker), timeout=10, message="the worker to end with it")
    finally:
        test_process.kill()
        test_process.wait(timeout=10)
