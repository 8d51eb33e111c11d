"""The one per-host slot limiter, against real Redis: leases, spacing, Redis's clock."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from jobs.errors import RateLimited
from outbound import hostslots
from outbound.hostslots import SLOTS_RESOURCE, SlotLimit
from ratelimit.observations import Kind, Observation, hot_key, remember

TWO_AT_ONCE = SlotLimit("webhooks", concurrency=2, lease=1.0)


def take(limit: SlotLimit, name: str) -> str | None:
    token = uuid.uuid4().hex
    return token if hostslots.try_acquire(limit, name, token).taken else None


def redis_now(redis_client) -> float:
    seconds, microseconds = redis_client.time()
    return seconds + microseconds / 1e6


@pytest.fixture
def skewed_clock(monkeypatch):
    """Moves this process's clock (time.time) by `offset` seconds, like a worker whose
    clock is wrong; time.monotonic and time.sleep stay real."""

    real = time.time

    def skew(offset: float) -> None:
        monkeypatch.setattr(time, "time", lambda: real() + offset)

    return skew


def test_a_host_has_at_most_its_slots_and_a_dead_holders_slot_frees_itself(redis_client):
    held = [take(TWO_AT_ONCE, "hooks.example.org") for _ in range(2)]
    assert all(held)
    assert take(TWO_AT_ONCE, "hooks.example.org") is None
    assert take(TWO_AT_ONCE, "other.example.org")  # hosts are separate
    hostslots.release(TWO_AT_ONCE, "hooks.example.org", held[0])
    assert take(TWO_AT_ONCE, "hooks.example.org")
    # Nobody releases these (their worker was killed): they expire.
    time.sleep(1.2)
    assert take(TWO_AT_ONCE, "hooks.example.org")
    assert take(TWO_AT_ONCE, "hooks.example.org")


def test_pools_keep_their_own_slots(redis_client):
    links = SlotLimit("links", concurrency=1, lease=30)
    webhooks = SlotLimit("webhooks", concurrency=1, lease=30)
    assert take(links, "example.org")
    assert take(webhooks, "example.org")
    assert take(links, "example.org") is None


def test_workers_with_different_clocks_agree_on_who_holds_a_slot(redis_client, skewed_clock):
    one_at_once = SlotLimit("links", concurrency=1, lease=30)
    assert take(one_at_once, "example.org")  # a worker with a right clock holds the slot
    # A worker an hour ahead would have expired that lease on its own clock, and taken
    # the slot; the lease is scored and read on Redis's clock, so it does not.
    skewed_clock(3600)
    assert take(one_at_once, "example.org") is None
    ((_, expires),) = redis_client.zrange(
        "hostslots:links:example.org:inflight", 0, -1, withscores=True
    )
    assert expires == pytest.approx(redis_now(redis_client) + 30, abs=2)


def test_workers_with_different_clocks_agree_on_the_spacing(redis_client, skewed_clock):
    once_a_second = SlotLimit("links", concurrency=0, rate=1.0, lease=30)
    assert hostslots.try_acquire(once_a_second, "example.org", "a").taken
    # A worker an hour behind is not let in early (nor one an hour ahead).
    for offset in (-3600, 3600):
        skewed_clock(offset)
        attempt = hostslots.try_acquire(once_a_second, "example.org", f"b{offset}")
        assert not attempt.taken
        assert 0 < attempt.wait <= 1.0
        # The attempt reports Redis's time, not the worker's.
        assert attempt.now == pytest.approx(redis_now(redis_client), abs=2)


def test_a_full_host_never_waits_when_told_not_to(redis_client):
    one_at_once = SlotLimit("webhooks", concurrency=1, lease=30)
    assert take(one_at_once, "hooks.example.org")
    started = time.monotonic()
    with (
        pytest.raises(RateLimited) as limited,
        hostslots.slot(
            one_at_once, "hooks.example.org", key="host:hooks.example.org", max_wait=None
        ),
    ):
        pass
    assert time.monotonic() - started < 0.5
    assert limited.value.wait_on == ("host:hooks.example.org", SLOTS_RESOURCE)
    assert limited.value.retry_at is None  # nobody knows when a slot frees


def test_a_busy_host_is_waited_for_up_to_max_wait_then_raises_with_a_retry_time(redis_client):
    one_at_once = SlotLimit("links", concurrency=1, lease=30)
    token = take(one_at_once, "example.org")
    started = time.monotonic()
    with (
        pytest.raises(RateLimited) as limited,
        hostslots.slot(one_at_once, "example.org", key="host:example.org", max_wait=0.3),
    ):
        pass
    waited = time.monotonic() - started
    assert 0.2 <= waited < 1.0
    assert limited.value.retry_at >= redis_now(redis_client) + 0.5

    # Freed within the wait: the caller gets the slot.
    threading.Timer(0.2, hostslots.release, args=(one_at_once, "example.org", token)).start()
    with hostslots.slot(one_at_once, "example.org", key="host:example.org", max_wait=2.0):
        assert redis_client.zcard("hostslots:links:example.org:inflight") == 1
    assert redis_client.zcard("hostslots:links:example.org:inflight") == 0  # released


def test_no_limit_takes_no_slot(redis_client):
    unlimited = SlotLimit("webhooks", concurrency=0, lease=30)
    with hostslots.slot(
        unlimited, "hooks.example.org", key="host:hooks.example.org", max_wait=None
    ):
        assert redis_client.keys("hostslots:*") == []


def test_a_host_that_has_not_answered_lately_starts_slowly_until_it_answers(redis_client):
    pages = SlotLimit("pages", concurrency=8, lease=5.0, wait_inline=False, warmup_rate=2)
    host = "down.example:80"
    assert take(pages, host)
    # Nothing answered yet: the next start waits half a second, though slots are free.
    waiting = hostslots.try_acquire(pages, host, uuid.uuid4().hex)
    assert not waiting.taken and waiting.warming
    busy = hostslots.slot(pages, host, key="host:down.example", max_wait=None)
    with pytest.raises(RateLimited) as raised, busy:
        pass
    assert "has not answered lately" in raised.value.reason
    # Untimed, like a busy host: nobody knows when it will answer, so the job backs off
    # without spending its attempts on the wait.
    assert raised.value.retry_at is None
    time.sleep(0.5)
    assert take(pages, host)  # half a second later, the next start
    hostslots.answered(pages, "other.example:80")
    assert not take(pages, host)  # another host's answer does not count
    hostslots.answered(pages, host)
    # Answered: full speed, up to the concurrency.
    assert all(take(pages, host) for _ in range(6))
    assert not take(pages, host)


# --- A host's rate-limit bucket, read in the slot's own step ------------------------


def test_a_closed_bucket_read_with_the_slot_takes_no_slot(redis_client):
    pages = SlotLimit("pages", concurrency=8, lease=30, wait_inline=False)
    key = "host:http://blocked.example"
    now = time.time()
    remember(Observation(key, "default", observed_at=now, kind=Kind.RATE_LIMITED,
                         status_code=429, blocked_until=now + 600))  # fmt: skip
    attempt = hostslots.try_acquire(
        pages, "http://blocked.example", "a", bucket=(hot_key(key, "default"), now)
    )
    assert not attempt.taken and attempt.bucket_closed
    assert float(attempt.bucket[7]) == pytest.approx(now + 600)
    assert redis_client.zcard("hostslots:pages:http://blocked.example:inflight") == 0
    # Its block over (read on the caller's clock, the observations'), the slot is taken.
    attempt = hostslots.try_acquire(
        pages, "http://blocked.example", "b", bucket=(hot_key(key, "default"), now + 601)
    )
    assert attempt.taken and not attempt.bucket_closed


def test_a_bucket_redis_does_not_hold_takes_the_slot_and_says_so(redis_client):
    pages = SlotLimit("pages", concurrency=8, lease=30, wait_inline=False)
    attempt = hostslots.try_acquire(
        pages, "http://new.example", "a", bucket=("ratelimit:nothing-here", time.time())
    )
    assert attempt.taken and attempt.bucket[0] is None  # the caller reads the database
