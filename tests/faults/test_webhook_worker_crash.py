"""A webhooks worker killed mid-delivery loses no delivery, and receivers can dedupe."""

from __future__ import annotations

import pytest

from tests.receiver import Receiver
from tests.webhook_helpers import delivery, schedule, start_webhooks_worker
from tests.workers import wait_for

pytestmark = pytest.mark.slow

FAST_REDELIVERY = {"WEBHOOKS_VISIBILITY_TIMEOUT_SECONDS": 5}


def test_a_sigkilled_webhooks_worker_loses_no_delivery(start_worker, http_server):
    hook = http_server(Receiver(hold_seconds=3))
    doomed = start_webhooks_worker(start_worker, **FAST_REDELIVERY)
    row = schedule(hook.url)
    wait_for(lambda: len(hook.requests) == 1, timeout=20, message="the delivery in flight")
    doomed.kill()  # mid-request, with the message unacknowledged

    survivor = start_webhooks_worker(start_worker, **FAST_REDELIVERY)
    wait_for(lambda: delivery(row).status == "delivered", timeout=45,
             message="the delivery to be redelivered")  # fmt: skip
    finished = delivery(row)
    # Every attempt is recorded, and both carry the same webhook-id for dedupe.
    assert finished.attempts == len(hook.requests) == 2, survivor.output()
    assert len({request.headers["webhook-id"] for request in hook.requests}) == 1
