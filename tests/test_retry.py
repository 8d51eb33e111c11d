"""The retry policy: backoff bounds (also at the cap), Retry-After, and what is held vs parked."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from audits.tasks import run_audit
from ratelimit.headers import parse_retry_after
from ratelimit.parking import longest_held_delay
from ratelimit.retry import backoff_delay, retry_delay

DRAWS = 2000


def draws(attempt: int, jitter: str, *, base=1.0, cap=60.0, previous=None) -> list[float]:
    rng = random.Random(attempt)
    return [
        backoff_delay(attempt, base=base, cap=cap, jitter=jitter, previous=previous, rng=rng)
        for _ in range(DRAWS)
    ]


@pytest.mark.parametrize("attempt", [1, 2, 3, 4, 5])
def test_multiplicative_backoff_doubles_within_a_quarter_either_way(attempt):
    delays = draws(attempt, "multiplicative")
    exponential = 2 ** (attempt - 1)
    assert min(delays) >= 0.75 * exponential
    assert max(delays) <= 1.25 * exponential
    # The jitter really spreads: draws cover most of the band.
    assert max(delays) - min(delays) > 0.4 * exponential


def test_jitter_still_spreads_delays_at_the_cap():
    # Attempt 30 would be 2**29 s without the cap.
    delays = draws(30, "multiplicative")
    assert 45.0 <= min(delays) < 47.0
    assert 73.0 < max(delays) <= 75.0
    assert len({round(d, 1) for d in delays}) > 200


def test_without_jitter_the_delay_is_the_cap_at_the_cap():
    delays = draws(30, "none")
    assert min(delays) == max(delays) == 60.0


def test_a_retry_after_wins_over_the_backoff_and_is_never_truncated(settings):
    settings.RETRY_BACKOFF_MAX_SECONDS = 60
    rng = random.Random(1)
    for _ in range(DRAWS):
        # Longer than the cap: still waited in full.
        delay = retry_delay(1, retry_after=3600, rng=rng)
        assert 3600 <= delay <= 3600 + 360
        # Shorter than the computed backoff of a late attempt: still what it says.
        short = retry_delay(8, retry_after=2, rng=rng)
        assert 2 <= short <= 3


def test_the_setting_chooses_the_jitter(settings):
    settings.RETRY_JITTER = "none"
    settings.RETRY_BACKOFF_BASE_SECONDS = 1.0
    assert [retry_delay(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]


def test_retry_after_reads_seconds_and_http_dates():
    now = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)
    later = datetime(2026, 12, 2, 10, 2, 30, tzinfo=UTC)
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(format_datetime(later, usegmt=True), now=now.timestamp()) == 150.0
    assert parse_retry_after(format_datetime(now, usegmt=True), now=later.timestamp()) == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_waits_longer_than_a_worker_may_hold_a_message_are_parked(settings):
    # 300 s visibility - (10 s fetch + 60 s) hard time limit - 30 s margin.
    assert settings.AUDITS_VISIBILITY_TIMEOUT_SECONDS == 300
    assert longest_held_delay(run_audit) == 200
    # The longest backoff (the cap with jitter) is held; a long Retry-After is not.
    assert longest_held_delay(run_audit) > 1.25 * settings.RETRY_BACKOFF_MAX_SECONDS
