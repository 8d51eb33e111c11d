"""A delivery message that cannot be parsed is given up on its first receive, never retried."""

from __future__ import annotations

import time
import uuid
from functools import partial

import pytest
from kombu import Connection, Exchange, Producer

from config.celery_app import app
from jobs import delayed
from jobs.models import DeadLetter
from tests.receiver import Receiver
from tests.webhook_helpers import FAST_RETRIES, delivery, schedule, start_webhooks_worker
from tests.workers import wait_for

pytestmark = pytest.mark.slow


def publish_undecodable_body(redis_url: str) -> None:
    """A well-formed broker envelope whose body is not JSON at all."""
    with Connection(redis_url) as connection:
        Producer(connection).publish(
            b"{not json",
            exchange=Exchange("webhooks", type="direct"),
            routing_key="webhooks",
            serializer=None,
            content_type="application/json",
            content_encoding="utf-8",
            headers={"task": "webhooks.deliver", "id": str(uuid.uuid4()), "retries": 0},
            declare=[],
        )


def test_malformed_messages_are_not_retried(start_worker, redis_client, settings, http_server):
    hook = http_server(Receiver())
    worker = start_webhooks_worker(start_worker, **FAST_RETRIES)
    # As another producer would send them: send_task checks nothing before publishing.
    send = partial(app.send_task, "webhooks.deliver", queue="webhooks")
    send(args=["not-a-delivery-id"])
    send(args=[])
    send(args=[str(uuid.uuid4())], kwargs={"surprise": 1})
    publish_undecodable_body(settings.REDIS_URL)
    # A good delivery behind them: once it is through, the bad ones were received.
    row = schedule(hook.url)
    wait_for(lambda: delivery(row).status == "delivered", timeout=30, message="the delivery")
    # A retry of a malformed message would come within 0.9 s (FAST_RETRIES caps the
    # backoff at 0.5 s, x1.25 jitter, then the delayed store's 0.25 s poll).
    time.sleep(1.5)
    log = worker.output()
    assert log.count("task.malformed_message") == 3, log
    # The undecodable body is dead-lettered by the consumer on its first receive.
    assert DeadLetter.objects.filter(reason=DeadLetter.Reason.MALFORMED).count() >= 1, log
    assert "task.retry" not in log
    assert redis_client.llen("webhooks") == 0
    assert redis_client.hlen("unacked:webhooks") == 0
    assert delayed.waiting("webhooks") == 0
