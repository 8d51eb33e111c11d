"""The soak's fault schedule (bench/soak.py) scales with its length: a 5-minute run sees
every fault once, an hour three rounds, each fault inside the load."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.pgcluster import PgCluster
from bench.services import PrivateRedis
from bench.soak import CallbackReceiver, fault_schedule


@pytest.fixture
def parts():
    cluster = PgCluster()  # not started: the schedule only names what it will do
    yield {"broker": PrivateRedis(), "cluster": cluster, "receiver": CallbackReceiver()}
    cluster.close()


def names(load_seconds: float, rounds: int, parts, *, sentinel: bool = False) -> Counter:
    faults = fault_schedule(load_seconds, rounds, **parts, sentinel=sentinel, night=lambda: None)
    assert all(0 < fault.at < load_seconds for fault in faults)
    assert [fault.at for fault in faults] == sorted(fault.at for fault in faults)
    return Counter(fault.name for fault in faults)


def test_a_five_minute_soak_has_every_fault_once(parts):
    counts = names(300, 1, parts)
    assert counts["night fanned out"] == 1
    assert counts["Redis stopped, started again empty"] == 1
    assert counts["PostgreSQL primary restarted"] == 1
    assert counts["PostgreSQL primary killed, replica promoted"] == 1
    # Down at 120 s and 270 s; the second lasts until the load ends, and it comes back for the drain.
    assert (counts["receiver down"], counts["receiver up"]) == (2, 1)
    assert "Sentinel failover" not in counts


def test_an_hour_has_three_rounds_and_one_promotion_and_sentinel_failovers_when_asked(parts):
    counts = names(3600, 3, parts, sentinel=True)
    assert counts["Redis stopped, started again empty"] == 3
    assert counts["PostgreSQL primary restarted"] == 3
    assert counts["Sentinel failover"] == 3
    # Once: the promoted replica has no replica of its own to promote.
    assert counts["PostgreSQL primary killed, replica promoted"] == 1
