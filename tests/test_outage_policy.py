"""What counts as Plumb's own infrastructure being away, and how long an outage waits."""

from __future__ import annotations

import random

import psycopg
import psycopg.errors
import pytest
import redis.exceptions
from django import db

from jobs.errors import Transient
from jobs.policy import OUTAGE, RETRY, RetryPolicy, delay, infrastructure_away


def django_error(kind, cause):
    """As Django raises it: its own class, the driver's error as the cause."""
    try:
        raise kind(str(cause)) from cause
    except kind as exc:
        return exc


@pytest.mark.parametrize(
    "exc",
    [
        django_error(db.OperationalError, psycopg.OperationalError("connection refused")),
        django_error(db.OperationalError, psycopg.errors.AdminShutdown()),
        django_error(db.OperationalError, psycopg.errors.CannotConnectNow()),
        db.OperationalError("no cause"),
        db.InterfaceError("connection already closed"),
        redis.exceptions.ConnectionError("refused"),
        redis.exceptions.TimeoutError("timed out"),
        redis.exceptions.ReadOnlyError("READONLY"),
    ],
)
def test_an_unreachable_server_is_an_outage(exc):
    assert infrastructure_away(exc)


@pytest.mark.parametrize(
    "exc",
    [
        # The statement, not the server, is at fault: retried as an error, spending attempts.
        django_error(db.OperationalError, psycopg.errors.QueryCanceled()),
        django_error(db.OperationalError, psycopg.errors.SerializationFailure()),
        Transient("503 from the page"),
        ValueError("a bug"),
    ],
)
def test_a_failing_statement_or_downstream_is_not_an_outage(exc):
    assert not infrastructure_away(exc)


def test_an_outage_backs_off_to_its_own_short_cap(settings):
    settings.RETRY_BACKOFF_BASE_SECONDS = 1.0
    settings.RETRY_BACKOFF_MAX_SECONDS = 60.0
    settings.OUTAGE_BACKOFF_MAX_SECONDS = 5.0
    rng = random.Random(7)
    policy = RetryPolicy()
    waits = [delay(policy, OUTAGE, step=step, rng=rng) for step in range(1, 12)]
    assert 0.75 <= waits[0] <= 1.25
    assert all(wait <= 5.0 * 1.25 for wait in waits)
    assert max(waits) >= 5.0 * 0.75  # it reaches the cap, jittered
    # An ordinary retry of the same step waits far longer: the caps are apart.
    assert delay(policy, RETRY, step=10, rng=rng) >= 60.0 * 0.75
