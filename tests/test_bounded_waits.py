"""No wait outlives its purpose: headers are clamped, only a 429 or a 503 blocks a host,
a wait past RATELIMIT_MAX_WAIT_SECONDS is never stored, and the backlog is what can
run within the wait horizon (issue 31, point 1)."""

from __future__ import annotations

import json
import math
import time

import httpx2
import pytest

from audits.admission import admit_submission
from jobs import delayed
from jobs.backlog import backlog_snapshot
from jobs.errors import RateLimited
from jobs.policy import DEFERRAL, RETRY, RetryPolicy, delay, too_long, wait_horizon
from outbound.client import OutboundClient
from outbound.integrations.links import link_check_slots
from ratelimit.admission import admit
from ratelimit.headers import FARTHEST_SECONDS, LARGEST_COUNT, parse_limit_headers
from ratelimit.headers import parse_retry_after as retry_after
from ratelimit.observations import RateLimitObservation, github_installation_key, host_key
from ratelimit.responses import classify, observe

pytestmark = pytest.mark.django_db

NOW = 1_700_000_000.0
FAR = float(FARTHEST_SECONDS)


# --- Headers: absurd values are clamped, never an exception -------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("9" * 400, FAR),  # raised OverflowError and dead-lettered the job
        ("9" * 5000, FAR),  # past Python's int-conversion limit
        ("999999999", 999_999_999.0),  # 2058: kept as asked, only never waited
        ("0", 0.0),
        ("Fri, 31 Dec 9999 23:59:59 GMT", FAR),
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),  # in the past: now
        ("-5", None),
        ("inf", None),
        ("nan", None),
        ("1e400", None),
        ("\u0661\u0662", None),  # Arabic-Indic digits are digits to str.isdigit
        ("Sun, 99 Foo 99999 99:99:99 GMT", None),
    ],
)
def test_a_retry_after_is_clamped_to_the_farthest_time_or_ignored(value, seconds):
    assert retry_after(value, now=NOW) == seconds


@pytest.mark.parametrize(
    ("value", "reset_at", "remaining"),
    [
        ("9" * 400, NOW + FAR, LARGEST_COUNT),
        ("1e300", NOW + FAR, LARGEST_COUNT),
        ("inf", NOW + FAR, LARGEST_COUNT),
        ("-inf", NOW, -LARGEST_COUNT),
        ("-1e300", NOW, -LARGEST_COUNT),
        ("-30", NOW, -30),
        ("nan", None, None),
        ("30", NOW + 30, 30),
        (str(int(NOW + 60)), NOW + 60, int(NOW + 60)),
    ],
)
def test_a_huge_negative_or_nan_reset_or_count_is_clamped(value, reset_at, remaining):
    limits = parse_limit_headers(
        httpx2.Headers({"x-ratelimit-reset": value, "x-ratelimit-remaining": value}), now=NOW
    )
    assert limits.reset_at == reset_at
    assert limits.remaining == remaining
    ietf = parse_limit_headers(
        httpx2.Headers({"ratelimit": f"limit=5, remaining=0, reset={value}"}), now=NOW
    )
    assert ietf.reset_at is None or math.isfinite(ietf.reset_at)
    assert ietf.reset_at is None or NOW <= ietf.reset_at <= NOW + FAR


def test_a_400_digit_retry_after_is_recorded_not_raised(scripted, redis_client):
    server = scripted((429, {"Retry-After": "9" * 400}, None))
    started = time.time()
    with pytest.raises(RateLimited) as limited:
        OutboundClient(httpx2.Client(), inline_max_wait=1).send(
            httpx2.Request("GET", f"{server.url}/x")
        )
    assert started + FAR <= limited.value.retry_at <= time.time() + FAR
    row = RateLimitObservation.objects.get()
    assert row.blocked_until.timestamp() == pytest.approx(limited.value.retry_at, abs=1)


# --- Which answers block a host ------------------------------------------------------


def answered(status: int, headers: dict, body: dict | None = None) -> httpx2.Response:
    return httpx2.Response(status, headers=headers, json=body if body is not None else {})


@pytest.mark.parametrize("status", [200, 301, 404, 500, 502])
def test_a_retry_after_on_any_other_answer_blocks_nobody(status, redis_client):
    verdict = classify(answered(status, {"Retry-After": "86400"}), now=NOW, plain_host=True)
    assert not verdict.limited and verdict.blocked_until is None
    key = host_key("example.org")
    observe(answered(status, {"Retry-After": "86400"}), key=key, resource="default")
    assert admit(key, "default").go
    assert not RateLimitObservation.objects.filter(blocked_until__isnull=False).exists()


@pytest.mark.parametrize("status", [200, 301, 403, 500])
def test_a_spent_bucket_on_any_other_answer_of_a_plain_host_blocks_nobody(status, redis_client):
    key = host_key("example.org")
    spent = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(time.time() + 86400))}
    observe(answered(status, spent), key=key, resource="default")
    assert admit(key, "default").go


@pytest.mark.parametrize("status", [429, 503])
def test_a_429_or_a_503_with_retry_after_blocks_the_host(status, redis_client):
    key = host_key("example.org")
    before = time.time()
    verdict = observe(answered(status, {"Retry-After": "600"}), key=key, resource="default")
    # A 429 is a limit the sender waits out; a 503 is an answer its caller retries after
    # the same wait, and which holds every other call to the host meanwhile.
    assert verdict.limited is (status == 429)
    assert admit(key, "default").until >= before + 600


def test_a_403_blocks_a_github_credential_but_never_a_plain_host(redis_client):
    limits = {"Retry-After": "600", "x-ratelimit-remaining": "0"}
    assert not classify(answered(403, limits), now=NOW, plain_host=True).limited
    assert classify(answered(403, limits), now=NOW).limited
    body = {"errors": [{"type": "RATE_LIMITED"}]}
    assert not classify(answered(200, {}, body), now=NOW, plain_host=True).limited
    key = host_key("example.org")
    observe(answered(403, limits), key=key, resource="default")
    assert admit(key, "default").go
    credential = github_installation_key(77)
    observe(answered(403, limits), key=credential, resource="core")
    assert not admit(credential, "core").go


def test_a_200_with_retry_after_does_not_hold_the_next_call_to_the_host(scripted, redis_client):
    server = scripted((200, {"Retry-After": "86400"}, None), (200, {}, None))
    client = OutboundClient(httpx2.Client(), inline_max_wait=1)
    assert client.send(httpx2.Request("GET", f"{server.url}/a")).status_code == 200
    assert client.send(httpx2.Request("GET", f"{server.url}/b")).status_code == 200
    assert server.requests == 2


def test_a_host_blocked_past_the_inline_budget_is_refused_without_a_slot(scripted, redis_client):
    server = scripted((429, {"Retry-After": "999999999"}, None))
    client = OutboundClient(httpx2.Client(), slots=link_check_slots(), inline_max_wait=1)
    with pytest.raises(RateLimited):
        client.send(httpx2.Request("GET", f"{server.url}/a"))
    # A hundred more calls, at a slot rate of one a second: refused at once, no request.
    started = time.monotonic()
    for n in range(100):
        with pytest.raises(RateLimited):
            client.send(httpx2.Request("GET", f"{server.url}/{n}"))
    assert time.monotonic() - started < 10
    assert server.requests == 1


# --- The one delay function never waits past the horizon ----------------------------


def test_no_wait_is_given_past_the_horizon(settings):
    settings.RATELIMIT_MAX_WAIT_SECONDS = 3600
    assert wait_horizon() == 3960
    assert too_long(3601) and not too_long(3600) and not too_long(None)
    policy = RetryPolicy(backoff_base=lambda: 1000.0, backoff_max=lambda: 10_000.0)
    for step in range(1, 10):
        assert delay(policy, RETRY, step=step) <= wait_horizon()
        assert delay(policy, DEFERRAL, step=step, after=3600) <= wait_horizon()
    assert delay(policy, DEFERRAL, after=3600) >= 3600  # a named wait is never shortened


# --- The backlog is what can run within the horizon ---------------------------------


def store(redis_client, *, due_in: float, n: int = 1, queue: str = "audits") -> None:
    for index in range(n):
        entry = delayed.Entry(
            "audits.check_shared_link", queue, f"t-{due_in}-{index}", [index + 1],
            wait="deferral", wait_on=("host:limited.example", "default"),
        )  # fmt: skip
        redis_client.zadd(delayed.delayed_key(queue), {entry.dumps(): time.time() + due_in})


def test_entries_due_past_the_horizon_are_reported_apart_and_hold_no_slot(settings, redis_client):
    settings.AUDIT_QUEUE_MAX_DEPTH = 5
    # What the finding left in the store: waits due in 2058, from before the bound.
    store(redis_client, due_in=999_999_999, n=10)
    store(redis_client, due_in=60, n=2)
    snapshot = backlog_snapshot("audits", redis_client)
    assert snapshot.backlog == 2
    assert snapshot.deferred_beyond_horizon == 10
    assert admit_submission("203.0.113.9").admitted


def test_the_waker_publishes_entries_due_past_the_horizon(redis_client):
    store(redis_client, due_in=999_999_999, n=3)
    store(redis_client, due_in=60, n=1)
    assert delayed.wake_due("audits", client=redis_client) == 3
    published = [json.loads(m)["headers"]["id"] for m in redis_client.lrange("audits", 0, -1)]
    assert sorted(published) == [f"t-999999999-{n}" for n in range(3)]
    assert len(delayed.entries("audits", redis_client)) == 1  # the one due in a minute


def test_the_waker_publishes_an_entry_whose_bucket_closed_past_the_bound(settings, redis_client):
    settings.RATELIMIT_MAX_WAIT_SECONDS = 3600
    key = host_key("limited.example")
    observe(answered(429, {"Retry-After": "999999999"}), key=key, resource="default")
    store(redis_client, due_in=-1, n=1)
    # Postponed, it would wait until 2058; published, it meets the block and ends.
    assert delayed.wake_due("audits", client=redis_client) == 1
    assert delayed.waiting("audits", redis_client) == 0
