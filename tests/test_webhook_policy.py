"""The pieces of webhook delivery that need no worker: its retry policy, parsing, secrets."""

from __future__ import annotations

import base64
import random

import pytest

from jobs.errors import MalformedTaskMessage
from jobs.policy import JITTER_HIGH, JITTER_LOW, RETRY, delay
from outbound.integrations.webhook import validate_secret
from webhooks.deliver import parse_delivery_id
from webhooks.tasks import WEBHOOK_POLICY, deliver_webhook


@pytest.fixture
def webhook_backoff(settings):
    settings.WEBHOOK_BACKOFF_BASE_SECONDS = 5.0
    settings.WEBHOOK_BACKOFF_MAX_SECONDS = 300.0
    settings.RETRY_JITTER = True
    return settings


def delays(attempt: int, samples: int = 4000) -> list[float]:
    rng = random.Random(8)
    return [delay(WEBHOOK_POLICY, RETRY, step=attempt, rng=rng) for _ in range(samples)]


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
    webhook_backoff.RETRY_JITTER = False
    assert [delay(WEBHOOK_POLICY, step=n) for n in (1, 2, 3, 10)] == [5.0, 10.0, 20.0, 300.0]


def test_a_receivers_retry_after_wins_over_the_backoff(webhook_backoff):
    waits = [delay(WEBHOOK_POLICY, RETRY, step=1, after=120.0) for _ in range(200)]
    assert min(waits) >= 120.0 and max(waits) <= 132.0


def test_every_wait_of_a_delivery_is_kept_in_the_delayed_store_not_in_a_worker():
    assert WEBHOOK_POLICY.countdowns_held is False


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ([], {}),
        (["0b5bdf5e-3a4f-4b8e-9d51-8f1c2c9a0e11", "extra"], {}),
        (["0b5bdf5e-3a4f-4b8e-9d51-8f1c2c9a0e11"], {"unknown": 1}),
    ],
)
def test_a_message_whose_arguments_do_not_fit_is_malformed(args, kwargs):
    with pytest.raises(MalformedTaskMessage):
        deliver_webhook._check_arguments(tuple(args), kwargs)


@pytest.mark.parametrize("value", ["not-a-uuid", 17, None])
def test_a_message_that_names_no_delivery_is_malformed(value):
    with pytest.raises(MalformedTaskMessage):
        parse_delivery_id(value)


def test_a_good_message_parses():
    assert parse_delivery_id("0B5BDF5E-3A4F-4B8E-9D51-8F1C2C9A0E11") == (
        "0b5bdf5e-3a4f-4b8e-9d51-8f1c2c9a0e11"
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
