"""What a downstream answers is stored whatever bytes it holds: bounded, and without the
NUL that PostgreSQL's text columns refuse."""

from __future__ import annotations

import pytest

from jobs.errors import MESSAGE_LIMIT, Permanent, Transient
from jobs.models import DeadLetter
from tests.receiver import Receiver
from tests.webhook_helpers import FAST_RETRIES, delivery, schedule, start_webhooks_worker
from tests.workers import wait_for


def test_an_error_s_message_has_no_nul_and_a_bound():
    assert str(Permanent("HTTP 400: no\x00thanks")) == "HTTP 400: no\\x00thanks"
    assert len(str(Transient("HTTP 503: " + "x" * 100_000))) == MESSAGE_LIMIT


@pytest.mark.slow
def test_a_receiver_answering_a_nul_fails_the_delivery_with_its_answer_recorded(
    start_worker, http_server
):
    hook = http_server(Receiver(lambda at, number: (400, {}, b"refused\x00: bad signature")))
    start_webhooks_worker(start_worker, **FAST_RETRIES)
    row = schedule(hook.url)
    # The write of its error failed (PostgreSQL: "cannot contain NUL (0x00)
    # characters"): the delivery stayed `delivering`, its answer unrecorded.
    wait_for(lambda: delivery(row).status == "failed", timeout=60, message="the delivery to fail")
    failed = delivery(row)
    assert failed.last_status_code == 400
    assert failed.last_error.endswith("HTTP 400: refused\\x00: bad signature")
    letter = wait_for(
        lambda: DeadLetter.objects.filter(task_id=row.task_id).first(),
        timeout=30, message="the refused delivery's dead letter",
    )  # fmt: skip
    assert "refused\\x00: bad signature" in letter.exception
