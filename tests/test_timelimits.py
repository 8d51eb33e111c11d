"""Time limits in a thread pool: the attempt past its limit is interrupted, no other."""

from __future__ import annotations

import threading
import time

from billiard.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded

from jobs import timelimits


def run_in_thread(work, *, soft: float | None, hard: float | None):
    """Run `work` as a registered attempt in a new thread; return (thread, outcome list)."""
    outcome: list = []
    registered = threading.Event()

    def attempt():
        timelimits.attempt_started("tests.work", "task-1", soft_limit=soft, hard_limit=hard)
        registered.set()
        try:
            work()
            outcome.append("finished")
        except BaseException as exc:  # what the limit raised, whatever it is
            outcome.append(type(exc))
        finally:
            timelimits.attempt_stopped()

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    registered.wait(5)
    return thread, outcome


def busy(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.005)


def test_an_attempt_past_its_soft_limit_is_interrupted_with_soft_time_limit_exceeded():
    thread, outcome = run_in_thread(lambda: busy(10), soft=0.1, hard=None)
    time.sleep(0.15)
    assert timelimits.enforce() == 1
    thread.join(5)
    assert outcome == [SoftTimeLimitExceeded]


def test_an_attempt_that_swallowed_its_soft_limit_gets_the_hard_one():
    def stubborn():
        try:
            busy(10)
        except SoftTimeLimitExceeded:
            busy(10)

    thread, outcome = run_in_thread(stubborn, soft=0.05, hard=0.2)
    time.sleep(0.1)
    assert timelimits.enforce() == 1
    time.sleep(0.15)
    assert timelimits.enforce() == 1
    thread.join(5)
    assert outcome == [TimeLimitExceeded]


def test_an_attempt_within_its_limits_and_a_finished_one_are_left_alone():
    thread, outcome = run_in_thread(lambda: busy(0.3), soft=5, hard=10)
    assert timelimits.enforce() == 0
    thread.join(5)
    assert outcome == ["finished"]
    # Gone from the registry: a later check raises in no thread.
    assert timelimits.enforce(now=time.monotonic() + 3600) == 0
