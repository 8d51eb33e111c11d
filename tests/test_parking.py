"""Parking with real workers: open breakers and long Retry-After waits hold tasks outside the broker.

Two `audits` workers, each shared by the tests next to each other that ask for it: one
whose breakers open, half-open and close within seconds (the breaker tests), one that
holds short countdowns only and gives up after two attempts (the Retry-After tests)."""

from __future__ import annotations

import pytest
from django.conf import settings

from audits.models import Audit
from audits.tasks import AUDIT_POLICY
from jobs import backlog, delayed
from jobs.breakers import FAILURE, Breaker
from jobs.models import CircuitBreaker, DeadLetter
from observability.metrics import TASK_ATTEMPTS, read_counter
from outbound.urls import origin_key
from tests.submitting import submit
from tests.test_metrics import scrape
from tests.workers import module_worker, wait_for

pytestmark = pytest.mark.slow

FAST_SWEEP = {"DELAYED_POLL_INTERVAL_SECONDS": "0.2"}

# Breakers that open on three calls of which half failed, stay open 1.5 s and close on
# one good probe; quick retries of the failed calls.
breaker_worker = module_worker(
    "audits",
    env={
        **FAST_SWEEP,
        "BREAKER_MIN_CALLS": "3",
        "BREAKER_FAILURE_RATE": "0.5",
        "BREAKER_OPEN_SECONDS": "1.5",
        "BREAKER_HALF_OPEN_PROBES": "1",
        "RETRY_BACKOFF_BASE_SECONDS": "0.2",
    },
)

# Visibility 75 s - (1 s fetch + 60 s) hard time limit - 10 s margin: a worker may hold
# a countdown of at most 4 s. Nothing is slept inline, and an audit has two attempts.
retry_after_worker = module_worker(
    "audits",
    env={
        **FAST_SWEEP,
        "AUDIT_FETCH_TIMEOUT_SECONDS": "1",
        "AUDITS_VISIBILITY_TIMEOUT_SECONDS": "75",
        "RATELIMIT_INLINE_MAX_WAIT_SECONDS": "0",
        "AUDIT_MAX_ATTEMPTS": "2",
    },
)


def status_of(audit: Audit) -> str:
    return Audit.objects.get(id=audit.id).status


def attempts_counted() -> float:
    return read_counter(TASK_ATTEMPTS).get(("audits.run_audit",), 0)


def parked() -> list[delayed.Entry]:
    return [entry for entry, _due in delayed.entries(settings.AUDIT_QUEUE)]


def test_a_task_parked_by_an_open_breaker_keeps_its_attempt_count(
    site, breaker_worker, settings, redis_client
):
    worker = breaker_worker
    settings.BREAKER_MIN_CALLS, settings.BREAKER_OPEN_SECONDS = 2, 3
    origin = origin_key(site.base_url)
    breaker = Breaker("audits.run_audit", origin)
    for _ in range(2):
        breaker.record(breaker.acquire(), FAILURE)
    assert breaker.state()["state"] == "open"

    audit = submit(f"{site.base_url}/noindex")  # no links to check
    (entry,) = wait_for(parked, timeout=15, message="the audit to be parked", show=[worker])
    assert (entry.wait, entry.reason) == ("park", f"breaker open for {origin}")
    assert entry.task_id == audit.task_id
    assert entry.retries == 0
    assert entry.args == [str(audit.id)]
    # Not started, so not an attempt; nothing went to the downstream.
    row = Audit.objects.get(id=audit.id)
    assert (row.status, row.attempts) == ("retrying", 0)
    assert site.hits["/noindex"] == 0
    # The start's one step wrote the park alone: no attempt counted, nothing noted running.
    assert attempts_counted() == 0
    assert redis_client.zcard(backlog.running_key(settings.AUDIT_QUEUE)) == 0

    wait_for(lambda: status_of(audit) == "succeeded", timeout=20, message="the audit to run")
    assert Audit.objects.get(id=audit.id).attempts == 1, worker.output()
    assert attempts_counted() == 1
    assert site.hits["/noindex"] == 1
    assert "task.retry" not in worker.output()
    # It was the probe that closed the breaker (just after the audit finished).
    wait_for(
        lambda: CircuitBreaker.objects.get(host=origin).last_transition == "closed",
        timeout=5, message="the probe to close the breaker",
    )  # fmt: skip
    assert breaker.state()["state"] == "closed"


def test_the_breaker_opens_parks_half_opens_and_closes_against_a_failing_downstream(
    site, breaker_worker, redis_client
):
    worker = breaker_worker
    # One downstream that fails its first four requests, whoever makes them.
    audits = [submit(f"{site.base_url}/flaky?key=shared&fail=4") for _ in range(6)]

    def all_succeeded():
        return all(status_of(audit) == "succeeded" for audit in audits)

    wait_for(all_succeeded, timeout=60, message="every audit to succeed", show=[worker])
    # Three failures open it; the first probe meets the fourth failure and
    # opens it again; the next probe succeeds and closes it. Prometheus sees the
    # transitions by new state, the parks as retries by reason; the admin's row counts
    # the openings of this host's breaker.
    breaker = CircuitBreaker.objects.get(
        task_name="audits.run_audit", host=origin_key(site.base_url)
    )
    assert (breaker.times_opened, breaker.last_transition) == (2, "closed")
    samples = scrape()
    assert (
        samples[("plumb_breaker_transitions_total", (("key_class", "host"), ("to_state", "open")))]
        == 2
    )
    assert (
        samples[
            ("plumb_breaker_transitions_total", (("key_class", "host"), ("to_state", "closed")))
        ]
        == 1
    )
    assert (
        samples[
            (
                "plumb_breaker_transitions_total",
                (("key_class", "host"), ("to_state", "half_open")),
            )
        ]
        == 2
    )
    parked_retries = samples[
        ("plumb_task_retries_total", (("reason", "breaker_parked"), ("task", "audits.run_audit")))
    ]
    assert parked_retries >= 3
    assert parked_retries == worker.output().count("task.parked")
    # Four failures and one success per audit: nothing hammered the downstream while it was down.
    assert site.flaky_counts["shared"] == 4 + len(audits)
    assert not DeadLetter.objects.exists()
    assert not parked()


def test_a_retry_after_longer_than_a_worker_may_hold_is_parked_and_waited_in_full(
    site, retry_after_worker, redis_client
):
    # The worker may hold a countdown of at most 4 s (retry_after_worker).
    worker = retry_after_worker
    long_wait = submit(f"{site.base_url}/busy?key=long&fail=1&retry_after=6")
    short_wait = submit(f"{site.base_url}/busy?key=short&fail=1&retry_after=2")

    def stored_retries() -> list[delayed.Entry]:
        # The short one's host is the long one's: admission may defer it meanwhile.
        return [entry for entry in parked() if entry.wait == "retry"]

    (entry,) = wait_for(stored_retries, timeout=15, message="the long wait to be stored")
    assert entry.wait == "retry"
    assert entry.task_id == long_wait.task_id
    # A retry: it has used its first attempt.
    assert entry.retries == 1
    assert status_of(long_wait) == "retrying"

    # Held by nobody once the first attempt's message is acknowledged: neither
    # queued nor kept unacknowledged (as an ETA would be) by a worker.
    def in_the_broker() -> bool:
        held = redis_client.hvals(f"unacked:{settings.AUDIT_QUEUE}")
        queued = redis_client.lrange(settings.AUDIT_QUEUE, 0, -1)
        return any(long_wait.task_id.encode() in message for message in held + queued)

    wait_for(lambda: not in_the_broker(), timeout=3, message="the first attempt's ack")
    assert parked()

    for audit in (long_wait, short_wait):
        wait_for(lambda a=audit: status_of(a) == "succeeded", timeout=30, message="success")
    for key, retry_after in (("long", 6), ("short", 2)):
        first, second = site.request_times[key]
        assert second - first >= retry_after, (key, worker.output())
    assert Audit.objects.get(id=long_wait.id).attempts == 2
    assert not parked()


def test_a_host_that_keeps_rate_limiting_is_deferred_up_to_the_cap_then_spends_attempts(
    site, retry_after_worker, redis_client
):
    # Every answer is 429 with Retry-After: 1, and nothing is slept inline (two attempts).
    worker = retry_after_worker
    audit = submit(f"{site.base_url}/busy?key=always&fail=1000&status=429&retry_after=1")
    wait_for(
        lambda: status_of(audit) == "failed", timeout=90, message="the audit to give up",
        show=[worker],
    )  # fmt: skip
    output = worker.output()
    # Ten deferrals spend nothing; after them each wait is a retry that spends an attempt.
    assert output.count("task.deferred") == AUDIT_POLICY.max_deferrals == 10
    assert output.count("task.retry") == 1
    assert site.flaky_counts["always"] == 12
    dead = DeadLetter.objects.get(task_id=audit.task_id)
    assert (dead.reason, dead.attempts) == ("attempts_exhausted", 2)
    assert Audit.objects.get(id=audit.id).attempts == 2
