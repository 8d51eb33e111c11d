"""A webhooks worker's retries against receivers that fail, refuse or ask it to wait: one
worker with fast retries and three attempts, shared by the module's tests."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from tests.receiver import Receiver
from tests.webhook_helpers import FAST_RETRIES, delivery, module_webhooks_worker, schedule
from tests.workers import wait_for

pytestmark = pytest.mark.slow


fast_retrying_worker = module_webhooks_worker(WEBHOOK_MAX_ATTEMPTS=3, **FAST_RETRIES)


@pytest.fixture
def receiver(http_server):
    return lambda respond: http_server(Receiver(respond))


def test_a_failing_receiver_gets_retries_with_the_same_webhook_id(receiver, fast_retrying_worker):
    hook = receiver(lambda at, number: 503 if number < 2 else 200)
    row = schedule(hook.url)
    wait_for(lambda: delivery(row).status == "delivered", timeout=30, message="the delivery")
    assert [r.status for r in hook.requests] == [503, 503, 200]
    assert {r.webhook_id for r in hook.requests} == {row.webhook_id}
    assert delivery(row).attempts == 3


def test_retries_stop_at_the_attempt_limit(receiver, fast_retrying_worker):
    hook = receiver(lambda at, number: 503)
    row = schedule(hook.url)
    wait_for(lambda: delivery(row).status == "failed", timeout=30, message="the delivery to fail")
    # A fourth attempt would come within 0.9 s (FAST_RETRIES caps the backoff at 0.5 s,
    # x1.25 jitter, then the delayed store's 0.25 s poll): 1.5 s is past it.
    time.sleep(1.5)
    assert hook.count() == 3
    failed = delivery(row)
    assert failed.attempts == 3 and failed.last_status_code == 503
    assert "gave up after 3 attempt(s)" in failed.last_error


def test_a_4xx_fails_the_delivery_at_once(receiver, fast_retrying_worker):
    hook = receiver(lambda at, number: 410)
    row = schedule(hook.url)
    wait_for(lambda: delivery(row).status == "failed", timeout=30, message="the delivery to fail")
    # A retry would come within 0.4 s (FAST_RETRIES' 0.1 s backoff x1.25, then the delayed
    # store's 0.25 s poll): a second is past it.
    time.sleep(1.0)
    assert hook.count() == 1
    assert delivery(row).attempts == 1 and delivery(row).last_status_code == 410


def test_a_receivers_retry_after_is_obeyed(receiver, fast_retrying_worker):
    hook = receiver(lambda at, number: (429, {"Retry-After": "3"}) if number == 0 else 200)
    # FAST_RETRIES: backoff alone would retry in 0.1 s.
    row = schedule(hook.url)
    wait_for(lambda: delivery(row).status == "delivered", timeout=30, message="the delivery")
    first, second = hook.requests
    assert second.at - first.at >= 3.0
    assert delivery(row).attempts == 2


def test_a_receiver_asking_for_longer_than_the_bound_fails_the_delivery_saying_so(
    receiver, fast_retrying_worker
):
    # Before RATELIMIT_MAX_WAIT_SECONDS, the delivery waited in the store until 2058.
    hook = receiver(lambda at, number: (503, {"Retry-After": "999999999"}))
    row = schedule(hook.url)
    wait_for(lambda: delivery(row).status == "failed", timeout=30, message="the delivery to fail")
    assert hook.count() == 1
    year = datetime.fromtimestamp(time.time() + 999999999, tz=UTC).year
    assert f"rate limited until {year}-" in delivery(row).last_error
