"""The one retry policy: backoff bounds (also at the cap), known waits in full, and what is
held in the broker versus stored in the delayed store."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import format_datetime

import kombu.exceptions
import pytest
import redis.exceptions
from django import db

from audits.tasks import AUDIT_POLICY, check_shared_link, run_audit
from jobs.errors import Transient
from jobs.policy import DEFERRAL, PARK, RETRY, RetryPolicy, delay, longest_held_countdown
from ratelimit.headers import parse_retry_after
from reaudit.tasks import place
from webhooks.tasks import WEBHOOK_POLICY, deliver_webhook

DRAWS = 2000


def draws(step: int, *, reason=RETRY, policy=AUDIT_POLICY, after=None) -> list[float]:
    rng = random.Random(step)
    return [delay(policy, reason, step=step, after=after, rng=rng) for _ in range(DRAWS)]


@pytest.mark.parametrize("attempt", [1, 2, 3, 4, 5])
def test_backoff_doubles_within_a_quarter_either_way(attempt):
    delays = draws(attempt)
    exponential = 2 ** (attempt - 1)
    assert min(delays) >= 0.75 * exponential
    assert max(delays) <= 1.25 * exponential
    # The jitter really spreads: draws cover most of the band.
    assert max(delays) - min(delays) > 0.4 * exponential


def test_jitter_still_spreads_delays_at_the_cap():
    # Attempt 30 would be 2**29 s without the cap.
    delays = draws(30)
    assert 45.0 <= min(delays) < 47.0
    assert 73.0 < max(delays) <= 75.0
    assert len({round(d, 1) for d in delays}) > 200


def test_a_retry_after_wins_over_the_backoff_and_is_never_truncated(settings):
    settings.RETRY_BACKOFF_MAX_SECONDS = 60
    rng = random.Random(1)
    for _ in range(DRAWS):
        # Longer than the cap: still waited in full.
        long = delay(AUDIT_POLICY, RETRY, step=1, after=3600, rng=rng)
        assert 3600 <= long <= 3600 + 360
        # Shorter than the computed backoff of a late attempt: still what it says.
        short = delay(AUDIT_POLICY, RETRY, step=8, after=2, rng=rng)
        assert 2 <= short <= 3


def test_a_rate_limit_wait_is_obeyed_in_full_like_a_retry_after():
    delays = draws(1, reason=DEFERRAL, after=900)
    assert min(delays) >= 900
    assert max(delays) <= 990


def test_a_breaker_park_waits_until_its_release_plus_at_most_a_second():
    delays = draws(1, reason=PARK, after=30)
    assert min(delays) >= 30
    assert max(delays) <= 31


def test_a_busy_host_backs_off_on_its_deferral_count_up_to_the_request_timeout(settings):
    settings.WEBHOOK_TIMEOUT_SECONDS = 10
    first = draws(1, reason=DEFERRAL, policy=WEBHOOK_POLICY)
    assert min(first) >= 0.25 * 0.75 and max(first) <= 0.25 * 1.25
    late = draws(30, reason=DEFERRAL, policy=WEBHOOK_POLICY)
    assert min(late) >= 7.5 and max(late) <= 12.5


def test_each_task_declares_its_own_base_and_cap(settings):
    settings.RETRY_JITTER = False
    settings.WEBHOOK_BACKOFF_BASE_SECONDS = 5
    settings.WEBHOOK_BACKOFF_MAX_SECONDS = 3600
    settings.RETRY_BACKOFF_BASE_SECONDS = 1.0
    assert [delay(AUDIT_POLICY, step=n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert [delay(WEBHOOK_POLICY, step=n) for n in (1, 2, 3)] == [5.0, 10.0, 20.0]


def test_without_jitter_every_wait_is_exact(settings):
    settings.RETRY_JITTER = False
    assert delay(RetryPolicy(), RETRY, after=12.5) == 12.5
    assert delay(RetryPolicy(), PARK, after=3) == 3


def test_retry_after_reads_seconds_and_http_dates():
    now = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)
    later = datetime(2026, 12, 2, 10, 2, 30, tzinfo=UTC)
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(format_datetime(later, usegmt=True), now=now.timestamp()) == 150.0
    assert parse_retry_after(format_datetime(now, usegmt=True), now=later.timestamp()) == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_waits_longer_than_a_worker_may_hold_a_message_are_stored(settings):
    # 300 s visibility - the attempt's 108.5 s lease (10 s fetch, 8.5 s for a large page's
    # tree builder, 30 s to the soft limit, 30 to the hard, 30 of slack: jobs.deadlines).
    assert settings.AUDITS_VISIBILITY_TIMEOUT_SECONDS == 300
    assert longest_held_countdown("audits", run_audit.deadline.lease) == 191.5
    # The longest backoff (the cap with jitter) is held; a long Retry-After is not.
    assert longest_held_countdown("audits", run_audit.deadline.lease) > 1.25 * 60


@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.ConnectionError("Redis went away"),
        redis.exceptions.ReadOnlyError("READONLY You can't write against a read only replica."),
        redis.exceptions.TimeoutError("Timeout reading from socket"),
        kombu.exceptions.OperationalError("broker unreachable"),
        db.OperationalError("server closed the connection unexpectedly"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_every_job_retries_when_plumb_s_own_infrastructure_is_away(error):
    # A Redis blip in the middle of an audit dead-lettered it as if the page had failed.
    for task in (run_audit, check_shared_link, deliver_webhook, place):
        assert task.policy.retries(error), task.name
    assert not isinstance(error, Transient)  # so no breaker counts it
