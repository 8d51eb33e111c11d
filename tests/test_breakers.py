"""The circuit breaker's states against the real Redis, called directly."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from jobs import retention
from jobs.breakers import (
    BREAKERS_KEY,
    FAILURE,
    NO_VERDICT,
    SHORTEST_RATE_SAMPLE_SECONDS,
    SUCCESS,
    Breaker,
    state_counts,
)
from jobs.models import CircuitBreaker
from jobs.policy import PARK, RetryPolicy, delay
from tests.test_metrics import scrape
from tests.workers import wait_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def breaker(settings, redis_client):
    settings.BREAKER_MIN_CALLS = 4
    settings.BREAKER_FAILURE_RATE = 0.5
    settings.BREAKER_WINDOW_SECONDS = 30
    settings.BREAKER_OPEN_SECONDS = 0.5
    settings.BREAKER_HALF_OPEN_PROBES = 2
    return Breaker("audits.run_audit", "downstream.example")


def call(breaker: Breaker, outcome: str):
    permit = breaker.acquire()
    if permit.allowed:
        breaker.record(permit, outcome)
    return permit


def open_it(breaker: Breaker) -> None:
    for _ in range(4):
        call(breaker, FAILURE)
    assert breaker.state()["state"] == "open"


def parked_releases(breaker: Breaker, count: int) -> tuple[list[float], list[float]]:
    """`count` parked calls' release times on this clock, and how uncertain each is: a
    permit says its release relative to the moment the breaker decided, somewhere between
    the call and its answer, a window that a busy machine widens well past the gaps the
    tests compare."""
    releases, windows = [], []
    for _ in range(count):
        sent = time.time()
        release_in = breaker.acquire().release_in
        answered = time.time()
        releases.append((sent + answered) / 2 + release_in)
        windows.append((answered - sent) / 2)
    return releases, windows


def gaps_between(releases: list[float], windows: list[float]) -> list[tuple[float, float]]:
    """Each gap between consecutive releases, with its uncertainty."""
    return [
        (releases[n + 1] - releases[n], windows[n + 1] + windows[n])
        for n in range(len(releases) - 1)
    ]


def wait_until_open_period_ends(breaker: Breaker) -> None:
    time.sleep(max(0.0, breaker.state()["open_until"] - time.time()) + 0.05)


def test_it_stays_closed_below_the_minimum_number_of_calls(breaker):
    for _ in range(3):
        call(breaker, FAILURE)
    assert breaker.state()["state"] == "closed"
    assert breaker.acquire().allowed


def test_it_stays_closed_while_the_failure_rate_is_under_the_threshold(breaker):
    for outcome in [SUCCESS, FAILURE, SUCCESS, SUCCESS, FAILURE, SUCCESS, SUCCESS]:
        call(breaker, outcome)
    assert breaker.state()["state"] == "closed"


def test_it_opens_when_the_failure_rate_crosses_the_threshold(breaker):
    for outcome in [SUCCESS, FAILURE, SUCCESS, FAILURE]:
        call(breaker, outcome)
    state = breaker.state()
    assert state["state"] == "open"
    assert 0 < state["open_until"] - time.time() <= 0.5
    permit = breaker.acquire()
    assert not permit.allowed and permit.decision == "open"
    # Parked at least until the open period ends, with up to a second of jitter.
    assert 0 < permit.release_in <= 0.5
    park = delay(RetryPolicy(), PARK, after=permit.release_in)
    assert permit.release_in <= park <= permit.release_in + 1


def test_the_release_rate_is_the_calls_per_second_before_it_opened(breaker):
    for _ in range(4):  # four calls ending 0.2 s apart: 0.6 s from the first to the last
        call(breaker, FAILURE)
        time.sleep(0.2)
    assert breaker.state()["state"] == "open"
    assert 5.5 < breaker.state()["release_rate"] < 7.0  # 4 / 0.6, not 4 per whole second


def test_parked_calls_are_released_no_faster_than_calls_came_before_it_opened(breaker, settings):
    settings.BREAKER_OPEN_SECONDS = 10  # twelve parked tasks fit one open period at that rate
    open_it(breaker)  # four calls within milliseconds: measured over the shortest sample
    open_until = breaker.state()["open_until"]
    rate = breaker.state()["release_rate"]
    assert rate == pytest.approx(4 / SHORTEST_RATE_SAMPLE_SECONDS)
    releases, windows = parked_releases(breaker, 12)
    # First come, first served, one every 1/rate seconds from the end of the open period.
    assert abs(releases[0] - open_until) < 0.05 + windows[0]
    gaps = gaps_between(releases, windows)
    assert all(abs(gap - 1 / rate) < 0.01 + uncertain for gap, uncertain in gaps), gaps


def test_a_backlog_beyond_one_open_period_at_that_rate_comes_back_faster(breaker):
    # A breaker that opened on its first few calls measured a rate from a small sample;
    # a burst that then meets it must not take minutes to come back at that rate.
    open_it(breaker)  # 16 calls/s; an open period of 0.5 s holds 8 at that rate
    rate = breaker.state()["release_rate"]
    releases, windows = parked_releases(breaker, 100)
    gaps = gaps_between(releases, windows)
    (first, first_uncertain), (last, last_uncertain) = gaps[0], gaps[-1]
    assert abs(first - 1 / rate) < 0.01 + first_uncertain  # the first open period's at the rate
    assert all(
        later <= earlier + 0.01 + earlier_uncertain + later_uncertain
        for (earlier, earlier_uncertain), (later, later_uncertain) in zip(
            gaps, gaps[1:], strict=False
        )
    ), gaps
    assert last + last_uncertain < (first - first_uncertain) / 2
    # 100 tasks within about ln(100 / 8) open periods more, not 100 / rate seconds.
    assert releases[-1] - releases[0] < 0.6 * 100 / rate
    assert breaker.state()["parked"] == 100


def test_calls_that_say_nothing_about_the_downstream_are_not_counted(breaker):
    for _ in range(10):
        call(breaker, NO_VERDICT)
    call(breaker, FAILURE)
    assert breaker.state()["state"] == "closed"


def test_old_failures_slide_out_of_the_window(breaker, settings):
    settings.BREAKER_WINDOW_SECONDS = 1
    for _ in range(3):
        call(breaker, FAILURE)
    time.sleep(2.1)
    call(breaker, FAILURE)
    assert breaker.state()["state"] == "closed"


def test_after_the_open_period_only_the_probes_go_through(breaker):
    open_it(breaker)
    wait_until_open_period_ends(breaker)
    first, second, third = breaker.acquire(), breaker.acquire(), breaker.acquire()
    assert (first.decision, second.decision, third.decision) == ("probe", "probe", "half_open")
    assert breaker.state()["state"] == "half_open"
    # The others wait at least a second for the probes' verdict.
    assert third.release_in >= 1.0


def test_it_closes_once_every_probe_has_succeeded(breaker):
    open_it(breaker)
    wait_until_open_period_ends(breaker)
    probes = [breaker.acquire(), breaker.acquire()]
    breaker.record(probes[0], SUCCESS)
    assert breaker.state()["state"] == "half_open"
    breaker.record(probes[1], SUCCESS)
    assert breaker.state()["state"] == "closed"
    assert breaker.acquire().decision == "allow"


def test_a_failed_probe_opens_it_again(breaker):
    open_it(breaker)
    wait_until_open_period_ends(breaker)
    probe = breaker.acquire()
    breaker.record(probe, FAILURE)
    assert breaker.state()["state"] == "open"
    assert breaker.acquire().decision == "open"


def test_probes_that_never_report_are_replaced(breaker):
    open_it(breaker)
    wait_until_open_period_ends(breaker)
    assert [breaker.acquire().decision for _ in range(3)] == ["probe", "probe", "half_open"]
    # Their workers died: after an open period without a verdict, new probes go.
    time.sleep(0.6)
    assert breaker.acquire().decision == "probe"


def test_workers_racing_for_probes_get_exactly_the_allowed_number(breaker, settings):
    settings.BREAKER_HALF_OPEN_PROBES = 4
    open_it(breaker)
    wait_until_open_period_ends(breaker)
    # The first caller half-opens it (and writes the admin's row in this
    # test's transaction, which the threads could not see): take it here.
    assert breaker.acquire().decision == "probe"
    decisions: list[str] = []
    start = threading.Barrier(20)

    def racer():
        start.wait()
        decisions.append(breaker.acquire().decision)

    threads = [threading.Thread(target=racer) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert decisions.count("probe") == 3
    assert decisions.count("half_open") == 17


def test_transitions_are_counted_and_mirrored_for_the_admin(breaker):
    open_it(breaker)
    mirror = CircuitBreaker.objects.get(task_name="audits.run_audit", host="downstream.example")
    assert (mirror.state, mirror.last_transition, mirror.times_opened) == ("open", "opened", 1)
    assert mirror.open_until is not None
    wait_until_open_period_ends(breaker)
    probes = [breaker.acquire(), breaker.acquire()]
    for probe in probes:
        breaker.record(probe, SUCCESS)
    mirror.refresh_from_db()
    assert (mirror.state, mirror.last_transition) == ("closed", "closed")
    samples = scrape()
    for to_state in ("open", "half_open", "closed"):
        labels = (("key_class", "host"), ("to_state", to_state))
        assert samples[("plumb_breaker_transitions_total", labels)] == 1, to_state


def test_transitions_are_logged_as_key_value_events(breaker, caplog):
    with caplog.at_level("INFO", logger="jobs.breakers"):
        open_it(breaker)
    (record,) = [r for r in caplog.records if r.getMessage() == "breaker.opened"]
    assert record.host == "downstream.example"
    assert record.task == "audits.run_audit"
    assert (record.calls, record.failures) == (4, 4)


def test_an_open_breaker_shows_in_the_next_scrape_and_half_opens_when_its_period_ends(
    breaker, settings
):
    def breakers_by_state() -> dict[str, float]:
        samples = scrape()
        return {
            labels[0][1]: value
            for (name, labels), value in samples.items()
            if name == "plumb_breakers"
        }

    assert breakers_by_state() == {"closed": 0, "open": 0, "half_open": 0}
    other = Breaker("webhooks.deliver", "receiver.example")
    call(other, SUCCESS)
    open_it(breaker)
    assert breakers_by_state() == {"closed": 0, "open": 1, "half_open": 0}
    wait_until_open_period_ends(breaker)
    assert breakers_by_state() == {"closed": 0, "open": 0, "half_open": 1}


# --- Breakers age out --------------------------------------------------------------------


def test_a_closed_breaker_nobody_calls_is_forgotten_and_leaves_the_gauge(
    breaker, settings, redis_client
):
    settings.BREAKER_FORGET_AFTER_SECONDS = 1
    open_it(breaker)
    breaker.close(by="operator")
    assert state_counts() == {"closed": 1, "open": 0, "half_open": 0}
    # A call refreshes its expiry: still known a second after the close.
    time.sleep(0.6)
    call(breaker, SUCCESS)
    time.sleep(0.6)
    assert redis_client.exists(breaker.key)
    # Then nobody calls: gone within its expiry, and the next count drops it from the set.
    wait_for(lambda: not redis_client.exists(breaker.key), timeout=5, message="forgotten")
    assert state_counts() == {"closed": 0, "open": 0, "half_open": 0}
    assert not redis_client.sismember(BREAKERS_KEY, breaker.key)
    # Forgotten is closed, as it was.
    assert breaker.state()["state"] == "closed" and breaker.acquire().allowed


def test_an_open_breaker_is_kept_at_least_until_its_parked_tasks_are_released(
    breaker, settings, redis_client
):
    settings.BREAKER_FORGET_AFTER_SECONDS = 1
    settings.BREAKER_OPEN_SECONDS = 30
    open_it(breaker)
    # Ten tasks parked: released one after another from the end of the open period.
    for _ in range(10):
        assert not breaker.acquire().allowed
    live = breaker.state()
    last_release = max(live["open_until"], live["next_release"])
    seconds, microseconds = redis_client.time()
    server_now = seconds + microseconds / 1_000_000  # 94465 µs is .094465 s, not .94465
    assert redis_client.ttl(breaker.key) >= last_release - server_now
    assert redis_client.ttl(breaker.key) <= last_release - server_now + 2


def test_every_breaker_state_key_has_an_expiry(breaker, redis_client):
    open_it(breaker)
    wait_until_open_period_ends(breaker)
    call(breaker, SUCCESS)  # a probe: half-open
    assert redis_client.ttl(breaker.key) > 0
    breaker.close(by="operator")
    assert redis_client.ttl(breaker.key) > 0
    assert all(redis_client.ttl(key) > 0 for key in redis_client.keys("plumb:breaker:*"))


def test_a_state_written_before_breakers_expired_is_given_its_expiry_by_the_next_count(
    breaker, redis_client
):
    open_it(breaker)
    breaker.close(by="operator")
    redis_client.persist(breaker.key)  # as an older release left it
    assert state_counts()["closed"] == 1
    assert 0 < redis_client.ttl(breaker.key) <= settings.BREAKER_FORGET_AFTER_SECONDS


def test_breaker_rows_unchanged_past_their_horizon_are_pruned(settings):
    settings.BREAKER_RETENTION_DAYS = 30
    now = timezone.now()
    for host, days_ago in [("old.example", 40), ("recent.example", 2)]:
        CircuitBreaker.objects.create(
            task_name="audits.run_audit", host=host, state="closed",
            changed_at=now - timedelta(days=days_ago),
        )  # fmt: skip
    pruned = retention.prune(retention.kind("breakers"), now=now)
    assert pruned.deleted == 1
    assert list(CircuitBreaker.objects.values_list("host", flat=True)) == ["recent.example"]
