"""A name lookup runs on a kept thread (outbound.guard.LookupThreads): one started for every
lookup cost more than the lookup (bench/dns_lookups.py)."""

from __future__ import annotations

import multiprocessing
import threading

from outbound.guard import LookupThreads, lookup_threads, resolve
from tests.workers import wait_for


def test_a_lookup_s_thread_serves_the_next_lookup():
    threads = LookupThreads()
    for _ in range(20):
        assert threads.lookup("localhost", 80).result(5)
        # Its thread is idle again once it has answered.
        wait_for(lambda: threads.idle() >= 1, timeout=5, message="the thread to be idle")
    assert threads.idle() == 1


def test_an_idle_thread_ends():
    threads = LookupThreads(idle_seconds=0.5)
    threads.lookup("localhost", 80).result(5)
    wait_for(lambda: threads.idle() == 1, timeout=5, message="the thread to be idle")
    wait_for(lambda: threads.idle() == 0, timeout=5, message="the idle thread to end")
    # And the next lookup starts a thread again.
    assert threads.lookup("localhost", 80).result(5)


def _resolve_in_child(answers) -> None:
    answers.put(resolve("localhost", 80, 2.0))


def test_a_forked_child_looks_up_on_threads_of_its_own():
    # The parent has an idle lookup thread; a forked child has none of its threads.
    resolve("localhost", 80, 2.0)
    wait_for(lambda: lookup_threads().idle() >= 1, timeout=5, message="an idle thread")
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    child = context.Process(target=_resolve_in_child, args=(answers,))
    child.start()
    assert answers.get(timeout=10) == ["127.0.0.1"]
    child.join(10)
    assert child.exitcode == 0


def test_no_lookup_is_lost_when_threads_give_up_waiting_as_they_are_handed_one():
    # Threads that give up waiting almost at once: a lookup is often handed to a thread in
    # the instant it gives up. That thread must serve it, or the lookup waits forever.
    threads = LookupThreads(idle_seconds=0.001)
    errors: list[BaseException] = []

    def look_up_many() -> None:
        try:
            for _ in range(100):
                assert threads.lookup("localhost", 80).result(5)
        except Exception as exc:  # reported below, in the test's own thread
            errors.append(exc)

    callers = [threading.Thread(target=look_up_many) for _ in range(8)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(60)
    assert not errors, errors[:3]
