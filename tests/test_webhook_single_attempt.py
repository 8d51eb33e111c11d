"""One delivery is never attempted on two connections at once (issue 26), even when the broker
hands its message to a second thread while the first attempt is still waiting on the receiver."""

from __future__ import annotations

import pytest

from tests.receiver import Receiver
from tests.webhook_helpers import delivery, schedule, start_webhooks_worker
from tests.workers import wait_for
from webhooks.models import Delivery

pytestmark = pytest.mark.slow

VISIBILITY_TIMEOUT = 5  # the least the setting allows; restored after about 6 s
HOLD_SECONDS = 8  # the receiver answers after the message came back to the queue


@pytest.fixture
def slow_receiver(http_server):
    return http_server(Receiver(hold_seconds=HOLD_SECONDS))


def test_a_redelivered_message_waits_for_the_attempt_in_flight_instead_of_posting_again(
    start_worker, slow_receiver
):
    worker = start_webhooks_worker(
        start_worker,
        WEBHOOKS_VISIBILITY_TIMEOUT_SECONDS=VISIBILITY_TIMEOUT,
        WEBHOOK_TIMEOUT_SECONDS=HOLD_SECONDS + 5,
        WEBHOOK_MAX_CONCURRENCY=2,
    )
    row = schedule(slow_receiver.url)
    # The second thread gets the same delivery while the first is in flight: it either
    # waits for the run in flight (its in-flight key, held for the POST) or posts it again.
    wait_for(
        lambda: slow_receiver.count() > 1
        or any("task.duplicate_in_flight" in line for line in worker.lines),
        timeout=HOLD_SECONDS + 20, message="the redelivered copy to run", show=[worker],
    )  # fmt: skip
    wait_for(lambda: delivery(row).status == Delivery.Status.DELIVERED, timeout=10)
    assert slow_receiver.peak_in_flight == 1
    assert slow_receiver.count() == 1
    assert delivery(row).attempts == 1
