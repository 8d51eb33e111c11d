"""Observations, admission and the outbound client, against real Redis, the database and HTTP."""

from __future__ import annotations

import json
import random
import time

import httpx2
import pytest

from jobs import delayed
from jobs.errors import RateLimited
from jobs.policy import RETRY, delay
from outbound.client import OutboundClient
from ratelimit.admission import INLINE_WAITS, admit
from ratelimit.headers import parse_limit_headers, parse_retry_after
from ratelimit.observations import (
    Kind,
    Observation,
    RateLimitObservation,
    github_app_key,
    github_installation_key,
    latest,
    latest_from_database,
    record,
    remember,
)
from ratelimit.responses import classify

pytestmark = pytest.mark.django_db

INSTALLATION = github_installation_key(77)


def response(status=200, headers=None, body=None) -> httpx2.Response:
    return httpx2.Response(status, headers=headers or {}, json=body if body is not None else {})


# --- Reading the headers ---------------------------------------------------------


def test_it_reads_githubs_rate_limit_headers():
    limits = parse_limit_headers(
        httpx2.Headers({
            "x-ratelimit-limit": "5000", "x-ratelimit-remaining": "0", "x-ratelimit-used": "5000",
            "x-ratelimit-reset": "1900000000", "x-ratelimit-resource": "graphql",
        }),
        now=1_800_000_000,
    )  # fmt: skip
    assert (limits.limit, limits.remaining, limits.used) == (5000, 0, 5000)
    assert limits.reset_at == 1_900_000_000
    assert limits.resource == "graphql"


@pytest.mark.parametrize(
    "headers",
    [
        {"RateLimit": "limit=100, remaining=0, reset=30"},
        {"RateLimit": '"default";r=0;t=30', "RateLimit-Policy": '"default";q=100;w=60'},
        {"RateLimit-Limit": "100", "RateLimit-Remaining": "0", "RateLimit-Reset": "30"},
    ],
)
def test_it_reads_the_ietf_ratelimit_fields(headers):
    limits = parse_limit_headers(httpx2.Headers(headers), now=1000.0)
    assert limits.limit == 100
    assert limits.remaining == 0
    assert limits.reset_at == 1030.0  # IETF reset is delta-seconds


def test_a_retry_after_is_read_in_full_as_seconds_or_a_date():
    assert parse_retry_after("60") == 60.0
    assert parse_retry_after("3600") == 3600.0  # never truncated
    assert parse_retry_after("Thu, 01 Jan 1970 00:01:40 GMT", now=40.0) == 60.0
    assert parse_retry_after("soon") is None


# --- Telling rate limits apart -----------------------------------------------------


def test_a_403_with_retry_after_is_a_secondary_limit_not_exhaustion():
    verdict = classify(
        response(403, {"retry-after": "60", "x-ratelimit-remaining": "4000"}), now=1000.0
    )
    assert verdict.kind == Kind.SECONDARY
    assert verdict.blocked_until == 1060.0


def test_githubs_secondary_message_without_retry_after_waits_a_minute():
    body = {"message": "You have exceeded a secondary rate limit. Please wait."}
    verdict = classify(response(403, {"x-ratelimit-remaining": "4000"}, body), now=1000.0)
    assert verdict.kind == Kind.SECONDARY
    assert verdict.blocked_until == 1060.0


def test_a_403_with_nothing_remaining_is_primary_exhaustion():
    headers = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1900000000"}
    verdict = classify(response(403, headers, {"message": "API rate limit exceeded"}), now=1000.0)
    assert verdict.kind == Kind.PRIMARY


def test_a_graphql_200_with_rate_limited_errors_is_rate_limited():
    body = {
        "data": None,
        "errors": [{"type": "RATE_LIMITED", "message": "API rate limit exceeded"}],
    }
    assert classify(response(200, {}, body), now=1000.0).kind == Kind.RATE_LIMITED
    exhausted = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1900000000"}
    assert classify(response(200, exhausted, body), now=1000.0).kind == Kind.PRIMARY


def test_a_plain_403_is_an_answer_not_a_rate_limit():
    assert classify(response(403, {}, {"message": "Forbidden"}), now=1000.0).kind == Kind.OK


# --- The hot store and the newest row per bucket -----------------------------------


def exhausted_core(now: float, *, key: str = INSTALLATION) -> Observation:
    return Observation(key, "core", now, Kind.PRIMARY, 403, 5000, 0, 5000, now + 600)


def healthy(key: str, resource: str, at: float) -> Observation:
    return Observation(key, resource, at, Kind.OK, 200, 5000, 4990, 10, at + 3600)


def test_ten_graphql_observations_do_not_hide_an_exhausted_core_bucket(redis_client):
    now = time.time()
    record(exhausted_core(now))
    for n in range(10):
        record(healthy(INSTALLATION, "graphql", now + 1 + n))
    assert RateLimitObservation.objects.filter(key=INSTALLATION).count() == 11
    assert admit(INSTALLATION, "core").until == pytest.approx(now + 600)
    assert admit(INSTALLATION, "graphql").go
    # The database path filters by resource in the query too (Redis lost, say).
    assert latest_from_database(INSTALLATION, "core").remaining == 0
    redis_client.flushdb()
    assert admit(INSTALLATION, "core").until == pytest.approx(now + 600)


def test_an_app_jwt_observation_does_not_clear_an_installations_backoff(redis_client):
    now = time.time()
    record(exhausted_core(now))
    record(healthy(github_app_key(4242), "core", now + 5))
    assert not admit(INSTALLATION, "core").go
    assert admit(github_app_key(4242), "core").go


def test_a_response_in_flight_when_a_block_was_set_does_not_lift_it(redis_client):
    now = time.time()
    remember(Observation(INSTALLATION, "core", now, Kind.SECONDARY, 403, blocked_until=now + 60))
    remember(healthy(INSTALLATION, "core", now + 1))  # sent before the block, answered after
    assert admit(INSTALLATION, "core").until == pytest.approx(now + 60)
    # Within one window (same reset) remaining only goes down, whatever order answers come in.
    remember(Observation("host:a", "default", now, Kind.OK, 200, 10, 0, None, now + 30))
    remember(Observation("host:a", "default", now + 1, Kind.OK, 200, 10, 3, None, now + 30))
    assert latest("host:a", "default").remaining == 0
    # A new window does clear it.
    remember(Observation("host:a", "default", now + 2, Kind.OK, 200, 10, 9, None, now + 90))
    assert admit("host:a", "default").go


def test_a_secondary_limit_holds_every_resource_of_the_credential(redis_client):
    now = time.time()
    record(Observation(INSTALLATION, "secondary", now, Kind.SECONDARY, 403, blocked_until=now + 60))
    assert admit(INSTALLATION, "graphql").until == pytest.approx(now + 60)
    assert admit(github_app_key(4242), "core").go


# --- The client: inline waits and handing long ones to the queue -------------------


class Sleeps(list):
    def __call__(self, seconds):
        self.append(seconds)
        time.sleep(min(seconds, 0.01))


def test_a_60s_retry_after_is_not_retried_inline(scripted):
    server = scripted((429, {"Retry-After": "60"}, None), (200, {}, None))
    sleeps = Sleeps()
    client = OutboundClient(httpx2.Client(), inline_max_wait=5, sleep=sleeps)
    started = time.time()
    with pytest.raises(RateLimited) as limited:
        client.send(httpx2.Request("GET", f"{server.url}/x"))
    assert server.requests == 1
    assert sleeps == []
    assert limited.value.retry_at >= started + 60
    # And the next call to that host is refused before it is made.
    with pytest.raises(RateLimited):
        client.send(httpx2.Request("GET", f"{server.url}/y"))
    assert server.requests == 1


def test_a_short_retry_after_is_slept_in_full_plus_jitter_then_retried(scripted):
    server = scripted((429, {"Retry-After": "1"}, None), (200, {}, None))
    sleeps = Sleeps()
    client = OutboundClient(
        httpx2.Client(), inline_max_wait=5, sleep=lambda s: (sleeps(s), time.sleep(s))
    )
    assert client.send(httpx2.Request("GET", f"{server.url}/x")).status_code == 200
    assert server.requests == 2
    assert len(sleeps) == 1 and sleeps[0] >= 0.9  # the whole Retry-After, never less


def inline_wait(step: int, *, at_least: float = 0.0, rng: random.Random) -> float:
    """The sender's inline wait number `step` (0 for the first), as it asks for it."""
    after = at_least if at_least > 0 else None
    return delay(INLINE_WAITS, RETRY, step=step + 1, after=after, rng=rng)


def test_inline_waits_climb_a_jittered_ladder():
    rng = random.Random(7)
    first = [inline_wait(0, rng=rng) for _ in range(50)]
    assert len(set(first)) == 50  # never a fixed step
    assert all(0.25 <= d <= 0.75 for d in first)
    assert all(1.0 <= inline_wait(2, rng=rng) <= 3.0 for _ in range(50))
    assert all(inline_wait(0, at_least=2.0, rng=rng) >= 2.0 for _ in range(50))


# --- Waking parked work -------------------------------------------------------------


def test_the_waker_reads_the_tasks_own_bucket_and_reparks_while_it_is_spent(redis_client):
    now = time.time()
    record(exhausted_core(now))
    record(healthy(github_app_key(4242), "core", now + 1))  # newer, another bucket
    entry = delayed.Entry(
        "audits.check_shared_link", "audits", "t-1", [1], headers={"plumb_deferrals": 1},
        wait="deferral", wait_on=(INSTALLATION, "core"),
    )  # fmt: skip
    delayed.schedule(entry, delay=0)
    assert delayed.wake_due("audits", client=redis_client) == 0
    assert redis_client.llen("audits") == 0
    ((_, due),) = delayed.entries("audits", redis_client)
    assert due >= now + 600  # back to sleep until the installation's own reset

    # The installation's bucket resets; the entry comes due.
    record(healthy(INSTALLATION, "core", time.time()))
    redis_client.zadd(delayed.delayed_key("audits"), {entry.dumps(): 0})
    assert delayed.wake_due("audits", client=redis_client) == 1
    assert delayed.waiting("audits") == 0
    message = json.loads(redis_client.lindex("audits", 0))
    assert message["headers"]["id"] == "t-1"
    assert message["headers"]["retries"] == 0  # no attempt spent
    assert message["headers"]["plumb_deferrals"] == 1


def test_the_observation_admin_is_read_only_and_filters_by_key_and_resource(
    admin_client, redis_client
):
    now = time.time()
    remember_and_record = [
        exhausted_core(now),
        healthy(INSTALLATION, "graphql", now),
        healthy("host:example.org", "default", now),
    ]
    for observation in remember_and_record:
        record(observation)
    url = "/admin/ratelimit/ratelimitobservation/"
    page = admin_client.get(url, {"key_kind": "github-installation", "resource": "core"})
    assert page.status_code == 200
    shown = list(page.context["cl"].queryset.values_list("key", "resource"))
    assert shown == [(INSTALLATION, "core")]
    assert admin_client.get(f"{url}add/").status_code == 403
