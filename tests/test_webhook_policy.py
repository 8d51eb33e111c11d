"""The pieces of webhook delivery that need no worker: policy, slots, schedule, parsing."""

from __future__ import annotations

import base64
import random
import time

import pytest

from outbound.integrations.webhook import validate_secret
from ratelimit.retry import JITTER_HIGH, JITTER_LOW
from webhooks import schedule as delayed
from webhooks.deliver import MalformedDeliveryMessage, parse_message
from webhooks.tasks import deliver_webhook


@pytest.fixture
def webhook_backoff(settings):
    settings.WEBHOOK_BACKOFF_BASE_SECONDS = 5.0
    settings.WEBHOOK_BACKOFF_MAX_SECONDS = 300.0
    settings.WEBHOOK_BACKOFF_JITTER = True
    return settings


def delays(attempt: int, samples: int = 4000) -> list[float]:
    rng = random.Random(8)
    return [deliver_webhook.retry_delay(attempt, rng=rng) for _ in range(samples)]


def test_webhook_retries_use_their_own_base_with_jitter_in_bounds(webhook_backoff):
    first = delays(1)
    assert min(first) >= 5.0 * JITTER_LOW and max(first) <= 5.0 * JITTER_HIGH
    third = delays(3)  # 5 * 2 * 2
    assert min(third) >= 20.0 * JITTER_LOW and max(third) <= 20.0 * JITTER_HIGH


def test_jitter_still_spreads_retries_at_the_maximum(webhook_backoff):
    at_cap = delays(30)  # far past the cap: 5 * 2**29 is capped at 300
    assert min(at_cap) >= 300.0 * JITTER_LOW and max(at_cap) <= 300.0 * JITTER_HIGH
    # Not all at the cap: deliveries that failed together leave it spread over ±25 %.
    assert min(at_cap) < 300.0 * 0.8 and max(at_cap) > 300.0 * 1.2


def test_the_naive_baseline_doubles_exactly(webhook_backoff):
    webhook_backoff.WEBHOOK_BACKOFF_JITTER = False
    assert [deliver_webhook.retry_delay(n) for n in (1, 2, 3, 10)] == [5.0, 10.0, 20.0, 300.0]


def test_a_receivers_retry_after_wins_over_the_backoff(webhook_backoff):
    waits = [deliver_webhook.retry_delay(1, retry_after=120.0) for _ in range(200)]
    assert min(waits) >= 120.0 and max(waits) <= 132.0


def test_a_delayed_publish_waits_in_redis_until_due(redis_client, settings):
    deliver_webhook.apply_async(args=["a"], task_id="t-later", countdown=30)
    deliver_webhook.apply_async(args=["b"], task_id="t-soon", countdown=0.01, retries=2)
    assert redis_client.llen(settings.WEBHOOK_QUEUE) == 0
    assert delayed.waiting() == 2
    time.sleep(0.05)
    assert delayed.promote_due() == 1
    assert delayed.waiting() == 1
    assert redis_client.llen(settings.WEBHOOK_QUEUE) == 1
    assert b"t-soon" in redis_client.lindex(settings.WEBHOOK_QUEUE, 0)
    # The other is due in 30 s: a promoter running 31 s from now moves it.
    later = time.time() + 31
    assert delayed.promote_due(now=later) == 1
    assert redis_client.llen(settings.WEBHOOK_QUEUE) == 2


def test_an_entry_a_dead_promoter_leased_comes_back_after_the_lease(redis_client):
    deliver_webhook.apply_async(args=["a"], task_id="t-1", countdown=0.01)
    time.sleep(0.05)
    now = time.time()
    # A promoter that leased the entry and died before publishing it:
    assert redis_client.eval(delayed._CLAIM_DUE, 1, delayed.DELAYED_KEY, now, 10, now + 30)
    assert delayed.promote_due(now=now) == 0
    assert delayed.promote_due(now=now + 31) == 1


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ([], {}),
        (["not-a-uuid"], {}),
        ([17], {}),
        (["0b5bdf5e-3a4f-4b8e-9d51-8f1c2c9a0e11", "extra"], {}),
        (["0b5bdf5e-3a4f-4b8e-9d51-8f1c2c9a0e11"], {"deferrals": -1}),
        (["0b5bdf5e-3a4f-4b8e-9d51-8f1c2c9a0e11"], {"unknown": 1}),
    ],
)
def test_a_message_that_names_no_delivery_is_malformed(args, kwargs):
    with pytest.raises(MalformedDeliveryMessage):
        parse_message(args, kwargs)


def test_a_good_message_parses():
    assert parse_message(["0B5BDF5E-3A4F-4B8E-9D51-8F1C2C9A0E11"], {"deferrals": 2}) == (
        "0b5bdf5e-3a4f-4b8e-9d51-8f1c2c9a0e11",
        2,
    )


@pytest.mark.parametrize(
    "secret",
    [
        "",
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",  # no prefix
        "whsec_not base64!",
        "whsec_" + base64.b64encode(b"short").decode(),
        "whsec_" + base64.b64encode(b"x" * 65).decode(),
    ],
)
def test_a_secret_not_in_standard_webhooks_form_is_refused(secret):
    with pytest.raises(ValueError):
        validate_secret(secret)


def test_a_standard_webhooks_secret_is_accepted():
    secret = "whsec_" + base64.b64encode(b"k" * 24).decode()
    assert validate_secret(secret) == secret
