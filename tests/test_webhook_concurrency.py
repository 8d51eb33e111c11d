"""A burst of deliveries runs at most the caps at once; the rest wait in the queue."""

from __future__ import annotations

import threading

import pytest
from django.db import transaction

from tests.receiver import Receiver
from tests.webhook_helpers import delivery, schedule, start_webhooks_worker
from tests.workers import wait_for
from webhooks.models import Delivery

pytestmark = pytest.mark.slow

CAP = 3
BURST = 12


@pytest.fixture
def slow_receiver(http_server):
    return http_server(Receiver(hold_seconds=0.6))


class HeldMessages:
    """Samples, while a burst runs, what the webhooks workers hold and what waits in the queue."""

    def __init__(self, redis_client):
        self.redis = redis_client
        self.most_held = 0
        self.most_queued = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self._stop.is_set():
            self.most_held = max(self.most_held, self.redis.hlen("unacked:webhooks"))
            self.most_queued = max(self.most_queued, self.redis.llen("webhooks"))
            self._stop.wait(0.02)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def burst(url: str, size: int) -> list[Delivery]:
    """`size` deliveries published together: made in one transaction, each is published at
    its commit. Made one by one, on a slow machine they took over a second, and the worker
    took each as it came, so the queue never held the burst (5 where 8 were asserted)."""
    with transaction.atomic():
        return [schedule(url, number=n) for n in range(size)]


def all_delivered(rows: list[Delivery]) -> bool:
    return Delivery.objects.filter(id__in=[r.id for r in rows], status="delivered").count() == len(
        rows
    )


@pytest.mark.parametrize("cap_on", [True, False], ids=["cap", "cap-disabled"])
def test_a_burst_larger_than_the_cap_never_runs_more_than_the_cap(
    cap_on, slow_receiver, start_worker, redis_client
):
    start_webhooks_worker(
        start_worker,
        WEBHOOK_MAX_CONCURRENCY=CAP if cap_on else 0,
        WEBHOOK_PER_HOST_CONCURRENCY=0,
    )
    with HeldMessages(redis_client) as held:
        rows = burst(slow_receiver.url, BURST)
        wait_for(lambda: all_delivered(rows), timeout=60, message="the burst to be delivered")
    if cap_on:
        assert slow_receiver.peak_in_flight == CAP
        # The worker took a message only with a thread free for it; the rest stayed queued.
        assert held.most_held <= CAP
        assert held.most_queued >= BURST - CAP - 1
    else:
        # The same burst without the cap: the assertions above would fail.
        assert slow_receiver.peak_in_flight > CAP
        assert held.most_held > CAP


def test_one_host_gets_at_most_its_slots_across_workers_without_using_attempts(
    slow_receiver, start_worker
):
    settings = {"WEBHOOK_MAX_CONCURRENCY": CAP, "WEBHOOK_PER_HOST_CONCURRENCY": 2}
    workers = [start_webhooks_worker(start_worker, **settings) for _ in range(2)]
    rows = burst(slow_receiver.url, 8)
    wait_for(lambda: all_delivered(rows), timeout=60, message="the burst to be delivered")
    assert slow_receiver.peak_in_flight == 2
    assert slow_receiver.count() == 8
    # Waiting for the host's slot was a deferral, not a failed attempt.
    assert {delivery(r).attempts for r in rows} == {1}
    # Six threads for two slots: some deliveries did find the host full.
    assert any("task.deferred" in worker.output() for worker in workers)
