"""Finished audits reach their callback URL, signed, through real workers and real HTTP."""

from __future__ import annotations

import json
import math
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from audits import submission
from jobs.models import CircuitBreaker
from outbound.integrations.webhook import signed_headers
from outbound.urls import normalize_url, origin_key
from tests.receiver import Receiver
from tests.test_metrics import scrape
from tests.webhook_helpers import (
    FAST_RETRIES,
    SECRET,
    delivery,
    schedule,
    start_webhooks_worker,
)
from tests.workers import wait_for
from webhooks.models import Delivery

pytestmark = pytest.mark.slow


@pytest.fixture
def receiver(http_server):
    return lambda respond=lambda at, number: 200, **options: http_server(
        Receiver(respond, **options)
    )


def test_a_finished_audit_is_delivered_and_verifies_with_standardwebhooks(
    site, receiver, start_worker, caplog
):
    caplog.set_level("DEBUG")
    hook = receiver()
    audits_worker = start_worker("audits")
    webhooks_worker = start_webhooks_worker(start_worker)
    audit = submission.submit_audit(
        normalize_url(f"{site.base_url}/"), callback_url=hook.url, callback_secret=SECRET
    )
    wait_for(lambda: hook.count(200) == 1, timeout=30, message="the delivery")

    (request,) = hook.requests
    payload = Webhook(SECRET).verify(request.body, request.headers)
    assert payload["type"] == "audit.finished"
    assert payload["data"]["id"] == str(audit.id)
    assert payload["data"]["status"] == "succeeded"
    assert "callback_secret" not in json.dumps(payload) and SECRET not in json.dumps(payload)

    tampered = request.body.replace(b"succeeded", b"failed")
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(tampered, request.headers)
    # Signed correctly, but ten minutes ago: a replayed request.
    stale = signed_headers(
        secret=SECRET,
        webhook_id=request.webhook_id,
        body=request.body.decode(),
        at=datetime.now(UTC) - timedelta(minutes=10),
    )
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(SECRET).verify(request.body, stale)

    # The row says so just after the receiver answered.
    row = wait_for(
        lambda: Delivery.objects.filter(audit_id=audit.id, status="delivered").first(),
        timeout=10, message="the delivery recorded",
    )  # fmt: skip
    assert row.attempts == 1 and row.last_status_code == 200

    # The secret never reaches a log line, in this process or the workers'.
    key = SECRET.removeprefix("whsec_")
    for text in (caplog.text, audits_worker.output(), webhooks_worker.output()):
        assert SECRET not in text and key not in text
    assert request.webhook_id == row.webhook_id


def test_a_failing_destination_opens_its_breaker_and_its_deliveries_wait_parked(
    receiver, start_worker
):
    # The destination is down until the test has watched five deliveries wait parked, then
    # up: the outage lasts as long as the parking takes, however slow the machine, instead
    # of a fixed number of requests that a slow worker could outlive without parking.
    up = threading.Event()
    hook = receiver(lambda at, number: 200 if up.is_set() else 503)
    worker = start_webhooks_worker(
        start_worker,
        WEBHOOK_PER_HOST_CONCURRENCY=1,
        WEBHOOK_MAX_ATTEMPTS=20,
        BREAKER_MIN_CALLS=3,
        BREAKER_FAILURE_RATE=0.5,
        BREAKER_OPEN_SECONDS=1.0,
        BREAKER_HALF_OPEN_PROBES=1,
        DELAYED_POLL_INTERVAL_SECONDS=0.2,
        **FAST_RETRIES,
    )
    rows = [schedule(hook.url, number=n) for n in range(8)]
    parked = (("reason", "breaker_parked"), ("task", "webhooks.deliver"))

    wait_for(lambda: hook.count(503) >= 1, timeout=30, message="the first request", show=[worker])
    down_since = time.monotonic()
    wait_for(
        lambda: scrape().get(("plumb_task_retries_total", parked), 0) >= 5,
        timeout=30, message="five deliveries parked", show=[worker],
    )  # fmt: skip
    up.set()
    outage_seconds = time.monotonic() - down_since

    def all_delivered():
        return all(delivery(row).status == "delivered" for row in rows)

    wait_for(all_delivered, timeout=60, message="every delivery", show=[worker])
    breaker = CircuitBreaker.objects.get(task_name="webhooks.deliver", host=origin_key(hook.url))
    assert breaker.times_opened >= 1
    # Before three failures open it, each delivery may have made its first request (they
    # pass the closed breaker together); then one probe per open second while it is down,
    # and one more that may have been on its way when it came up. Retried one by one
    # instead (every 0.1-0.5 s, eight deliveries), the outage would have seen dozens.
    assert hook.count(503) <= len(rows) + math.ceil(outage_seconds) + 1, worker.output()
    # And once it is back, each delivery arrives once.
    assert hook.count(200) == len(rows)
