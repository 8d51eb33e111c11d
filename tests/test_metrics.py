"""Recording functions, the Redis totals behind /metrics, and the Prometheus exposition."""

from __future__ import annotations

import multiprocessing
import shutil
import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from audits import admission
from config.celery_app import queue_list_keys
from jobs import backlog
from observability import gauges, metrics
from observability.collector import exposition
from observability.metrics import Field, minute_key, minute_of

NOW = 1_800_000_000.0  # a fixed instant, so buckets are predictable


def scrape() -> dict[tuple[str, tuple], float]:
    """Every sample of the exposition as {(name, sorted labels): value}."""
    samples = {}
    for family in text_string_to_metric_families(exposition().decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


@pytest.mark.django_db
def test_each_event_bumps_its_prometheus_counter_and_its_minute_bucket(redis_client, settings):
    metrics.record_task_attempt("audits.run_audit", first=True, job_id="job-1", now=NOW)
    metrics.record_task_attempt("audits.run_audit", first=False, job_id="job-1", now=NOW)
    metrics.record_retry("audits.run_audit", "error", now=NOW)
    metrics.record_completion("audits.run_audit", now=NOW)
    metrics.record_dead_letter("audits.run_audit", now=NOW)
    metrics.record_downstream_request("host", 503, "transient_status", 0.2, now=NOW)
    # Admission counts inside its own script: a refusal while an audit waits to retry.
    settings.AUDIT_SUBMIT_BURST = 1
    redis_client.hset("unacked:audits", "held", "m")
    assert admission.admit_submission("192.0.2.1").admitted
    assert not admission.admit_submission("192.0.2.1").admitted

    samples = scrape()
    task = (("task", "audits.run_audit"),)
    assert samples[("plumb_task_attempts_total", task)] == 2
    assert samples[("plumb_task_first_attempts_total", task)] == 1
    assert samples[("plumb_task_retries_total", (("reason", "error"), *task))] == 1
    assert samples[("plumb_task_completions_total", task)] == 1
    assert samples[("plumb_task_dead_letters_total", task)] == 1
    assert (
        samples[
            (
                "plumb_downstream_requests_total",
                (("key_class", "host"), ("outcome", "transient_status"), ("status_class", "5xx")),
            )
        ]
        == 1
    )
    assert (
        samples[
            (
                "plumb_admission_decisions_total",
                (("decision", "refused_ip"), ("in_backoff", "true")),
            )
        ]
        == 1
    )

    bucket = redis_client.hgetall(minute_key(minute_of(NOW)))
    assert bucket[Field.ATTEMPTS.encode()] == b"2"
    assert bucket[Field.FIRST_ATTEMPTS.encode()] == b"1"
    assert bucket[Field.retries("error").encode()] == b"1"
    assert bucket[Field.COMPLETIONS.encode()] == b"1"
    assert bucket[Field.DEAD_LETTERS.encode()] == b"1"
    assert bucket[Field.DOWNSTREAM_REQUESTS.encode()] == b"1"
    this_minute = redis_client.hgetall(minute_key(minute_of()))
    assert this_minute[Field.admissions("refused_ip").encode()] == b"1"
    assert this_minute[Field.admissions_in_backoff("refused_ip").encode()] == b"1"


def admitted_exported() -> float:
    admitted = (("decision", "admitted"), ("in_backoff", "false"))
    return scrape()[("plumb_admission_decisions_total", admitted)]


@pytest.mark.django_db
def test_a_share_refusal_never_takes_the_exported_admitted_count_down(redis_client):
    """A scrape between the admission script and the share's refusal saw the submission
    admitted; a lower total after it would read to Prometheus as a restarted counter, and
    rate() would count the whole total again."""
    overturned = admission.admit_submission("192.0.2.1")
    assert admitted_exported() == 1
    admission.refuse_client(overturned, held=3)
    assert admission.admission_counts()["admitted"] == 0  # the stored total moved
    samples = scrape()
    refused = (("decision", "refused_client"), ("in_backoff", "false"))
    assert samples[("plumb_admission_decisions_total", refused)] == 1
    assert admitted_exported() == 1
    # Level until the admissions catch up with what was exported, then as stored.
    assert admission.admit_submission("192.0.2.1").admitted
    assert admitted_exported() == 1
    assert admission.admit_submission("192.0.2.1").admitted
    assert admitted_exported() == 2 == admission.admission_counts()["admitted"]


@pytest.mark.django_db
def test_a_counter_whose_totals_are_gone_restarts_from_zero(redis_client):
    """A Redis that came back empty (or lost the counter's key) restarts the counter, as
    Prometheus expects of a restarted process: its highest exported totals go with it."""
    task = ("plumb_task_completions_total", (("task", "audits.run_audit"),))
    for _ in range(3):
        metrics.record_completion("audits.run_audit")
    assert scrape()[task] == 3
    redis_client.delete(metrics.counter_key(metrics.TASK_COMPLETIONS))
    assert task not in scrape()
    metrics.record_completion("audits.run_audit")
    assert scrape()[task] == 1


def test_a_label_value_outside_its_closed_set_is_refused(redis_client):
    with pytest.raises(ValueError, match="reason"):
        metrics.record_retry("audits.run_audit", "because")
    with pytest.raises(ValueError, match="key_class"):
        metrics.record_downstream_request("example.org", 200, "ok", 0.1)
    assert redis_client.keys("metrics:*") == []


def test_minute_buckets_expire_after_the_retention(redis_client, settings):
    settings.METRICS_RETENTION_HOURS = 2
    metrics.record_completion("audits.run_audit")
    ttl = redis_client.ttl(minute_key(minute_of()))
    assert 2 * 3600 <= ttl <= 2 * 3600 + 60
    # The Prometheus totals never expire: a counter only goes up.
    assert redis_client.ttl(metrics.counter_key(metrics.TASK_COMPLETIONS)) == -1


def test_a_histogram_is_exposed_with_cumulative_buckets(redis_client):
    for seconds in (0.003, 0.04, 0.04, 7.0, 99.0):
        metrics.record_downstream_request("host", 200, "ok", seconds)
    samples = scrape()
    name = "plumb_downstream_request_duration_seconds"

    def bucket(le):
        return samples[(f"{name}_bucket", (("key_class", "host"), ("le", le)))]

    assert bucket("0.01") == 1
    assert bucket("0.05") == 3
    assert bucket("10.0") == 4
    assert bucket("+Inf") == 5
    assert samples[(f"{name}_count", (("key_class", "host"),))] == 5
    assert samples[(f"{name}_sum", (("key_class", "host"),))] == pytest.approx(106.083)


def _record_completions(count: int) -> None:
    for _ in range(count):
        metrics.record_completion("audits.run_audit")


def test_recordings_from_several_processes_add_up_in_one_scrape(redis_client):
    # What gunicorn workers and Celery pool children do: separate processes, one total.
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_record_completions, args=(200,)) for _ in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    samples = scrape()
    assert samples[("plumb_task_completions_total", (("task", "audits.run_audit"),))] == 800


@pytest.mark.django_db
def test_gauges_are_read_when_scraped(redis_client):
    # Two held messages (retries in backoff, as a worker keeps them) and one running attempt.
    redis_client.hset("unacked:audits", mapping={"t1": "m", "t2": "m", "t3": "m"})
    redis_client.zadd(backlog.running_key("audits"), {"a-running": time.time() + 60})
    # kombu keeps one list per priority step: all of them are waiting work.
    plain, *by_priority = queue_list_keys("audits")
    redis_client.rpush(plain, "m1", "m2")
    redis_client.rpush(by_priority[0], "m3")

    readings = gauges.read_all()
    assert [readings[f] for f in ("waiting", "retrying", "running", "scheduled")] == [3, 2, 1, 0]
    samples = scrape()
    assert samples[("plumb_queue_waiting", ())] == 3
    assert samples[("plumb_queue_retrying", ())] == 2
    assert samples[("plumb_queue_running", ())] == 1
    assert samples[("plumb_queue_backlog", ())] == 5
    assert samples[("plumb_queue_deferred_beyond_horizon", ())] == 0
    assert samples[("plumb_breakers", (("state", "open"),))] == 0


def test_unique_jobs_are_counted_within_the_hyperloglog_error(redis_client):
    # Redis HyperLogLog: 12 kB per minute however many jobs, at a standard error of
    # 0.81 %. Small counts (a test run, a quiet minute) come out exact.
    for i in range(5):
        metrics.record_task_attempt("audits.run_audit", first=True, job_id=f"small-{i}", now=NOW)
    assert redis_client.pfcount(metrics.jobs_key(minute_of(NOW))) == 5
    later = NOW + 60
    pipe = redis_client.pipeline()
    for i in range(20_000):
        pipe.pfadd(metrics.jobs_key(minute_of(later)), f"job-{i}")
    pipe.execute()
    assert redis_client.pfcount(metrics.jobs_key(minute_of(later))) == pytest.approx(
        20_000, rel=0.03
    )


@pytest.mark.django_db
def test_the_metrics_endpoint_passes_promtool(client, redis_client):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus; .ci/run does)")
    metrics.record_task_attempt("audits.run_audit", first=True, job_id="j", queue_wait=0.2)
    metrics.record_retry("audits.run_audit", "rate_limited")
    metrics.record_audit_duration(1.5, outcome="succeeded")
    metrics.record_downstream_request("github-app", None, "timeout", 10.0)
    metrics.record_breaker_transition("open")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=response.content, capture_output=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
    assert b"plumb_task_retries_total" in response.content


@pytest.mark.django_db
def test_metrics_and_stats_need_the_bearer_token_once_one_is_set(client, settings, redis_client):
    settings.METRICS_BEARER_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 403
    assert client.get("/api/stats").status_code == 403
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 403
    assert client.get("/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/api/stats", headers={"Authorization": "Bearer s3cret"}).status_code == 200


@pytest.mark.django_db
def test_metrics_and_stats_answer_503_while_redis_is_away(client, settings):
    # The totals live in Redis; a scrape during a Redis outage was a 500 (bench/outages.py).
    settings.REDIS_URL = "redis://127.0.0.1:9/0"
    for path in ("/metrics", "/api/stats"):
        response = client.get(path)
        assert response.status_code == 503, (path, response.status_code)
        assert response.json()["error"] == "metrics_unavailable"
        assert response["Retry-After"] == "5"


@pytest.mark.django_db
def test_an_admission_refusal_writes_its_log_line_with_the_backlog_seen(
    redis_client, settings, caplog
):
    caplog.set_level("INFO", logger="audits.admission")
    settings.AUDIT_QUEUE_MAX_DEPTH = 2
    redis_client.rpush("audits", "m1", "m2")
    admission.admit_submission("192.0.2.7")
    events = [record for record in caplog.records if record.getMessage() == "admission.refused"]
    assert [(event.reason, event.backlog) for event in events] == [("refused_backlog", 2)]
