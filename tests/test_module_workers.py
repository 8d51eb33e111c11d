"""The harness's shared workers (tests/workers.py `module_worker`): shared by the tests that
ask for one, and never running during a test that does not. These tests run in file order
(pytest-django keeps file order among transactional tests; one file runs on one xdist worker)
and read what the one before saw."""

from __future__ import annotations

import os

import pytest

from tests.workers import module_worker

pytestmark = pytest.mark.slow

audits_worker = module_worker("audits")
seen: dict[str, int] = {}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_test_asking_for_the_shared_worker_gets_a_running_one(audits_worker):
    assert audits_worker.running()
    seen["first"] = audits_worker.process.pid


def test_the_next_test_asking_for_it_gets_the_same_process_with_its_own_output(audits_worker):
    assert audits_worker.process.pid == seen["first"]
    assert not any(" ready." in line for line in audits_worker.lines)


def test_it_is_ended_before_a_test_that_does_not_ask_for_it(transactional_db):
    # Ended (SIGKILL of its group) and waited for before this test's body runs.
    assert not alive(seen["first"])


def test_a_later_test_asking_for_it_gets_a_new_one(audits_worker):
    assert audits_worker.running()
    assert audits_worker.process.pid != seen["first"]
