"""The admission domain functions, called directly against the real test Redis."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from celery import shared_task
from django.conf import settings

from audits import admission
from audits.admission import BucketAnswer, client_ip, submit_bucket_key
from audits.tasks import run_audit
from config import redis as plumb_redis
from jobs import backlog, delayed
from jobs.backlog import BacklogSnapshot, backlog_snapshot
from jobs.task import PlumbTask
from observability.collector import exposition
from observability.metrics import minute_key, minute_of

AUDITS = "audits"
PRIORITY_SUB_QUEUES = ["audits\x06\x163", "audits\x06\x166", "audits\x06\x169"]


def audits_backlog() -> BacklogSnapshot:
    return backlog_snapshot(AUDITS)


def hold(redis_client, tag: str) -> None:
    """A message held by an audits worker, as kombu records it."""
    redis_client.hset("unacked:audits", tag, '[{}, "", "audits"]')


# --- the token bucket (through the one script that decides) -----------------------------


@pytest.fixture
def bucket(settings):
    """A bucket of `burst` tokens refilled at `rate_per_minute`, and a roomy backlog."""

    def configure(*, burst: int, rate_per_minute: float) -> None:
        settings.AUDIT_SUBMIT_BURST = burst
        settings.AUDIT_SUBMIT_RATE_PER_MINUTE = rate_per_minute
        settings.AUDIT_QUEUE_MAX_DEPTH = 1000

    return configure


def test_a_bucket_allows_its_burst_then_says_when_the_next_token_comes(bucket, redis_client):
    bucket(burst=3, rate_per_minute=6)
    answers = [admission.admit_submission("192.0.2.1") for _ in range(4)]
    assert [a.admitted for a in answers] == [True, True, True, False]
    # 6 per minute: a token every 10 s, and the last one was just taken.
    assert answers[-1].retry_after == 10


def test_a_bucket_refills_at_its_rate(bucket, redis_client):
    bucket(burst=1, rate_per_minute=600)
    assert admission.admit_submission("192.0.2.1").admitted
    assert not admission.admit_submission("192.0.2.1").admitted
    time.sleep(0.15)  # 600 per minute: a token every 0.1 s
    assert admission.admit_submission("192.0.2.1").admitted


def test_retry_after_is_whole_seconds_and_never_zero():
    assert BucketAnswer(allowed=False, wait_seconds=0.01).retry_after == 1
    assert BucketAnswer(allowed=False, wait_seconds=2.0).retry_after == 2
    assert BucketAnswer(allowed=False, wait_seconds=2.001).retry_after == 3


def test_a_bucket_is_forgotten_once_it_would_be_full_again(bucket, redis_client):
    bucket(burst=5, rate_per_minute=60)
    admission.admit_submission("192.0.2.1")
    # One token spent at one per second: full again in a second.
    assert 0 < redis_client.pttl(submit_bucket_key("192.0.2.1")) <= 1000


def test_processes_share_a_bucket_and_never_both_spend_its_last_token(bucket, redis_client):
    bucket(burst=10, rate_per_minute=0.01)
    clients = [redis.Redis.from_url(settings.REDIS_URL) for _ in range(8)]
    allowed = []
    start = threading.Barrier(len(clients))

    def spend(client):
        start.wait()
        for _ in range(5):
            allowed.append(admission.admit_submission("192.0.2.1", client=client).admitted)

    threads = [threading.Thread(target=spend, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert allowed.count(True) == 10
    assert allowed.count(False) == 30


# --- whose bucket --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("meta", "trusted", "expected"),
    [
        ({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "6.6.6.6"}, 0, "10.0.0.1"),
        ({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "6.6.6.6, 1.2.3.4"}, 1, "1.2.3.4"),
        ({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "6.6.6.6, 1.2.3.4"}, 2, "6.6.6.6"),
        ({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "1.2.3.4"}, 2, "10.0.0.1"),
        ({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "nonsense"}, 1, "10.0.0.1"),
        ({"REMOTE_ADDR": "10.0.0.1"}, 1, "10.0.0.1"),
    ],
    ids=[
        "no-proxy-ignores-the-header",
        "one-proxy-takes-the-last-hop",
        "two-proxies-take-the-second-from-the-right",
        "too-few-hops-falls-back-to-the-peer",
        "not-an-address-falls-back-to-the-peer",
        "no-header-falls-back-to-the-peer",
    ],
)
def test_the_client_address_trusts_only_the_configured_proxies(meta, trusted, expected):
    assert client_ip(meta, trusted_proxy_count=trusted) == expected


def test_ipv6_clients_share_a_bucket_per_slash_64():
    assert submit_bucket_key("2001:db8:1:2::1") == submit_bucket_key("2001:db8:1:2:ffff::9")
    assert submit_bucket_key("2001:db8:1:2::1") != submit_bucket_key("2001:db8:1:3::1")
    assert submit_bucket_key("::ffff:1.2.3.4") == submit_bucket_key("1.2.3.4")


# --- the backlog ---------------------------------------------------------------------


def test_it_counts_waiting_audits_on_every_priority_sub_queue(redis_client):
    for key in [AUDITS, *PRIORITY_SUB_QUEUES]:
        redis_client.lpush(key, "message")
    redis_client.lpush(AUDITS, "another")
    assert audits_backlog() == BacklogSnapshot(waiting=5, retrying=0, running=0)


def running(redis_client, run_id: str, *, lease: float = 70) -> None:
    """An attempt's entry in the running registry, as its start writes it (jobs.task)."""
    redis_client.zadd(backlog.running_key(AUDITS), {run_id: time.time() + lease})


def test_it_counts_held_messages_that_are_not_running_as_retrying(redis_client):
    for tag in ["a", "b", "c"]:
        hold(redis_client, tag)
    running(redis_client, "run-1")
    assert audits_backlog() == BacklogSnapshot(waiting=0, retrying=2, running=1)
    redis_client.zrem(backlog.running_key(AUDITS), "run-1")
    assert audits_backlog() == BacklogSnapshot(waiting=0, retrying=3, running=0)


def test_it_counts_every_entry_of_the_audits_delayed_store_leased_or_not(redis_client):
    for n in range(3):
        delayed.schedule(delayed.Entry("audits.run_audit", AUDITS, f"t{n}"), delay=600 * n)
    assert audits_backlog() == BacklogSnapshot(waiting=0, retrying=3, running=0)
    # The due one is leased by a waker that has not published it yet: still owed a slot.
    assert len(delayed.lease_due(AUDITS, client=redis_client)) == 1
    assert audits_backlog() == BacklogSnapshot(waiting=0, retrying=3, running=0)


def test_a_running_lease_left_by_a_dead_process_expires(redis_client):
    hold(redis_client, "a")
    redis_client.zadd(backlog.running_key(AUDITS), {"dead-run": time.time() - 1})
    assert audits_backlog() == BacklogSnapshot(waiting=0, retrying=1, running=0)
    assert redis_client.zcard(backlog.running_key(AUDITS)) == 0


@shared_task(bind=True, base=PlumbTask, name="tests.running_lease_probe", queue=AUDITS,
             deadline=run_audit.deadline)  # fmt: skip
def running_lease_probe(self):
    """Its own entry in the running registry, read while it runs: when the entry lapses."""
    return plumb_redis.redis_client().zrange(backlog.running_key(AUDITS), 0, -1, withscores=True)


def test_a_running_lease_outlives_the_hard_time_limit(redis_client):
    # The audit task's deadline, written by an attempt's own start.
    started = time.time()
    ((_, lapses_at),) = running_lease_probe.apply().get()
    assert running_lease_probe.time_limit == run_audit.time_limit
    assert lapses_at - started > run_audit.time_limit
    # And the end of the attempt takes the entry away.
    assert redis_client.zcard(backlog.running_key(AUDITS)) == 0


def test_other_queues_are_not_the_audits_backlog(redis_client):
    redis_client.lpush("reaudit", "placement")
    redis_client.lpush("reaudit\x06\x169", "placement")
    redis_client.hset("unacked:reaudit", "tag", "placement held until its ETA")
    delayed.schedule(delayed.Entry("webhooks.deliver", "webhooks", "t"), delay=60)
    assert audits_backlog() == BacklogSnapshot(waiting=0, retrying=0, running=0)


@shared_task(bind=True, base=PlumbTask, name="tests.bookkeeping_probe", queue=AUDITS)
def bookkeeping_probe(self):
    return "ran"


def test_an_attempt_runs_and_succeeds_when_its_bookkeeping_cannot_be_written(settings, caplog):
    # Its metrics and running-registry entry go in one pipeline at the start and one at
    # the end; with Redis down each is logged, and the run is not touched.
    settings.REDIS_URL = "redis://127.0.0.1:9/0"
    assert bookkeeping_probe.apply().get() == "ran"
    unrecorded = [r for r in caplog.records if r.getMessage() == "task.bookkeeping_unrecorded"]
    assert [r.moment for r in unrecorded] == ["attempt_started", "attempt_stopped"]


# --- the decision --------------------------------------------------------------------


@pytest.fixture
def limits(settings):
    settings.AUDIT_SUBMIT_BURST = 2
    settings.AUDIT_SUBMIT_RATE_PER_MINUTE = 1
    settings.AUDIT_QUEUE_MAX_DEPTH = 3
    return settings


def test_it_admits_until_the_bucket_is_empty(limits, redis_client):
    outcomes = [admission.admit_submission("1.2.3.4").outcome for _ in range(3)]
    assert outcomes == ["admitted", "admitted", "refused_ip"]
    # Another address has its own bucket.
    assert admission.admit_submission("5.6.7.8").admitted


def test_it_refuses_at_the_cap_and_takes_no_token_for_it(limits, redis_client):
    redis_client.lpush(AUDITS, "a", "b")
    hold(redis_client, "in-backoff")
    refusals = [admission.admit_submission("1.2.3.4") for _ in range(5)]
    assert {d.outcome for d in refusals} == {"refused_backlog"}
    assert refusals[0].backlog == 3 and refusals[0].max_depth == 3
    assert 5 <= refusals[0].retry_after <= 15

    redis_client.delete(AUDITS)
    # Five refusals later the bucket is still full.
    assert [admission.admit_submission("1.2.3.4").outcome for _ in range(3)] == [
        "admitted",
        "admitted",
        "refused_ip",
    ]


def test_an_empty_bucket_is_refused_before_the_backlog_is_considered(limits, redis_client):
    admission.admit_submission("1.2.3.4")
    admission.admit_submission("1.2.3.4")
    redis_client.lpush(AUDITS, "a", "b", "c")
    decision = admission.admit_submission("1.2.3.4")
    assert decision.outcome == "refused_ip"
    assert 1 <= decision.retry_after <= 60


def test_an_admission_the_share_overturns_gives_its_token_back_and_is_counted_as_refused(
    limits, redis_client
):
    # The submission's statement found the client at its share (audits.submission).
    limits.AUDIT_QUEUE_MAX_DEPTH = 30
    limits.AUDIT_CLIENT_MAX_SHARE = 0.1  # 3
    admitted = admission.admit_submission("1.2.3.4")
    assert admitted.admitted and admitted.client_share == 3
    refused = admission.refuse_client(admitted, 3)
    assert (refused.outcome, refused.client_held, refused.client_share) == ("refused_client", 3, 3)
    assert 5 <= refused.retry_after <= 15
    counts = admission.admission_counts()
    assert (counts["admitted"], counts["refused_client"]) == (0, 1)
    minute = redis_client.hgetall(minute_key(minute_of(None)))
    assert (int(minute[b"admissions:admitted"]), int(minute[b"admissions:refused_client"])) == (
        0,
        1,
    )
    # The token came back: the burst of two is all there.
    outcomes = [admission.admit_submission("1.2.3.4").outcome for _ in range(3)]
    assert outcomes == ["admitted", "admitted", "refused_ip"]


def test_a_backlog_refusal_the_share_explains_is_recounted_and_takes_no_token(limits, redis_client):
    limits.AUDIT_QUEUE_MAX_DEPTH = 30
    limits.AUDIT_CLIENT_MAX_SHARE = 0.1
    redis_client.lpush(AUDITS, *range(30))
    hold(redis_client, "in-backoff")
    full = admission.admit_submission("1.2.3.4")
    assert full.outcome == "refused_backlog"
    assert admission.refuse_client(full, 3).outcome == "refused_client"
    counts = admission.admission_counts()
    assert (counts["refused_backlog"], counts["refused_client"]) == (0, 1)
    assert (counts["refused_backlog_in_backoff"], counts["refused_client_in_backoff"]) == (0, 1)
    redis_client.delete(AUDITS, "unacked:audits")
    outcomes = [admission.admit_submission("1.2.3.4").outcome for _ in range(3)]
    assert outcomes == ["admitted", "admitted", "refused_ip"]


def test_a_token_given_back_never_fills_the_bucket_past_its_burst(limits, redis_client):
    admitted = admission.admit_submission("1.2.3.4")
    redis_client.delete(submit_bucket_key("1.2.3.4"))  # refilled meanwhile: full again
    admission.refuse_client(admitted, 3)
    outcomes = [admission.admit_submission("1.2.3.4").outcome for _ in range(3)]
    assert outcomes == ["admitted", "admitted", "refused_ip"]


def test_a_share_refusal_stands_when_its_recount_cannot_be_written(limits, caplog):
    admitted = admission.admit_submission("1.2.3.4")
    limits.REDIS_URL = "redis://127.0.0.1:9/0"
    refused = admission.refuse_client(admitted, 3)
    assert refused.outcome == "refused_client"
    assert [r.getMessage() for r in caplog.records].count("admission.recount_failed") == 1


def test_a_client_share_is_at_least_one(settings):
    settings.AUDIT_QUEUE_MAX_DEPTH = 5
    settings.AUDIT_CLIENT_MAX_SHARE = 0.1
    assert admission.client_share() == 1


def test_decisions_are_counted_and_split_by_whether_audits_were_in_backoff(limits, redis_client):
    admission.admit_submission("1.2.3.4")
    hold(redis_client, "in-backoff")
    admission.admit_submission("1.2.3.4")
    admission.admit_submission("1.2.3.4")  # bucket empty
    redis_client.lpush(AUDITS, "a", "b")
    admission.admit_submission("5.6.7.8")  # backlog 3
    assert admission.admission_counts() == {
        "admitted": 2,
        "admitted_in_backoff": 1,
        "refused_ip": 1,
        "refused_ip_in_backoff": 1,
        "refused_client": 0,
        "refused_client_in_backoff": 0,
        "refused_backlog": 1,
        "refused_backlog_in_backoff": 1,
    }
    # The same decisions reach /metrics and the dashboard, counted in the same step.
    scraped = metrics_text()
    assert 'plumb_admission_decisions_total{decision="admitted",in_backoff="false"} 1.0' in scraped
    assert 'plumb_admission_decisions_total{decision="admitted",in_backoff="true"} 1.0' in scraped
    assert (
        'plumb_admission_decisions_total{decision="refused_backlog",in_backoff="true"} 1.0'
        in scraped
    )
    minute = redis_client.hgetall(minute_key(minute_of(None)))
    assert int(minute[b"admissions:admitted"]) == 2
    assert int(minute[b"admissions_in_backoff:refused_ip"]) == 1


def test_a_refusal_is_logged_with_the_backlog_it_saw(limits, redis_client, caplog):
    caplog.set_level("INFO", logger="audits.admission")
    redis_client.lpush(AUDITS, "a")
    hold(redis_client, "x")
    hold(redis_client, "y")
    admission.admit_submission("1.2.3.4")
    (record,) = [r for r in caplog.records if r.getMessage() == "admission.refused"]
    assert record.reason == "refused_backlog"
    assert (record.backlog, record.waiting, record.retrying, record.max_depth) == (3, 1, 2, 3)
    assert record.client_ip == "1.2.3.4"


def test_it_raises_admission_unavailable_when_redis_is_down(limits):
    limits.REDIS_URL = "redis://127.0.0.1:9/0"
    with pytest.raises(admission.AdmissionUnavailable):
        admission.admit_submission("1.2.3.4")


def metrics_text() -> str:
    return exposition().decode()
