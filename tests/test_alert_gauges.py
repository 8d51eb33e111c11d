"""The gauges the alert rules need (deploy/prometheus/): read at scrape time from real Redis
and the database, exposed on /metrics."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from jobs import delayed
from observability import gauges
from observability.collector import exposition
from reaudit import services
from reaudit.models import FanOut
from reaudit.tasks import NIGHT_TASKS
from tests.reaudit_factories import DAY, make_pages
from tests.workers import wait_for


def scrape() -> dict[tuple[str, tuple], float]:
    samples = {}
    for family in text_string_to_metric_families(exposition().decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def overdue(queue: str) -> float:
    return scrape()[("plumb_delayed_overdue_seconds", (("queue", queue),))]


@pytest.mark.django_db
def test_a_due_entry_that_no_waker_publishes_shows_its_age_until_one_wakes_it(redis_client):
    # What a worker whose waker thread died looks like: entries come due, nothing publishes
    # them. The gauge must grow with the wait, per queue, and fall to 0 once woken.
    delayed.schedule(delayed.Entry("webhooks.deliver", "webhooks", "late", [1]), delay=0)
    delayed.schedule(delayed.Entry("audits.run_audit", "audits", "later", ["x"]), delay=600)

    wait_for(lambda: overdue("webhooks") >= 1.5, timeout=10, message="the entry's age")
    # Not yet due is not overdue, and a queue with an empty store reads 0.
    assert overdue("audits") == 0
    assert overdue("reaudit") == 0

    assert delayed.wake_due("webhooks", client=redis_client) == 1
    assert overdue("webhooks") == 0


@pytest.mark.django_db
def test_an_entry_whose_lease_lapsed_counts_as_overdue(redis_client):
    # A waker that leased an entry and died before publishing: overdue once its lease lapses.
    delayed.schedule(delayed.Entry("audits.run_audit", "audits", "leased", ["x"]), delay=0)
    (member,) = delayed.lease_due("audits", client=redis_client, lease_seconds=0.5)
    ages = delayed.oldest_overdue_seconds(["audits"], redis_client)
    assert ages == {"audits": 0.0}  # the lease is live: a waker is publishing it
    wait_for(
        lambda: (
            delayed.oldest_overdue_seconds(["audits"], redis_client)["audits"]
            >= delayed.LEASE_SECONDS
        ),
        timeout=5,
        message="the lapsed lease counted from its due time",
    )


@pytest.mark.django_db
def test_the_admission_limit_is_exposed_beside_the_backlog(redis_client, settings):
    settings.AUDIT_QUEUE_MAX_DEPTH = 250
    samples = scrape()
    assert samples[("plumb_queue_max_depth", ())] == 250
    assert samples[("plumb_queue_backlog", ())] == 0


@pytest.mark.django_db
def test_a_nights_placements_due_by_its_plan_and_fired(redis_client, django_assert_max_num_queries):
    assert "reaudit_placements" not in gauges.read_all()  # no night yet: nothing to report
    pages = make_pages({"a.test": 3, "b.test": 2, "c.test": 2})
    night = services.fan_out(
        DAY, night_tasks=NIGHT_TASKS, window_seconds=1800, slice_seconds=600, spacing_seconds=10
    ).fan_out
    sizes = night.slice_sizes
    # Twenty minutes into the night: its first two slices' windows have ended.
    FanOut.objects.filter(id=night.id).update(window_start=timezone.now() - timedelta(seconds=1250))
    services.fire_placement(pages[0].id, DAY)

    with django_assert_max_num_queries(2):  # read at every scrape: the night and one count
        services.night_progress()
    samples = scrape()
    assert samples[("plumb_reaudit_placements", ())] == 7
    assert samples[("plumb_reaudit_placements_due", ())] == sizes[0] + sizes[1]
    assert samples[("plumb_reaudit_placements_fired", ())] == 1
    assert samples[("plumb_reaudit_fanout_timestamp_seconds", ())] == pytest.approx(
        night.created_at.timestamp()
    )
