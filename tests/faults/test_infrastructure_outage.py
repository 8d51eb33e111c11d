"""PostgreSQL or Redis away under load: no attempt is spent, nothing is lost, and every
audit runs within seconds of the outage's end (issue 32, point 1).

Audits of a page that answers slowly are running and queued when the outage starts.
Before the outage wait, every audit spent its attempts on `OperationalError` within
the cut, the last failure could not be written ("Exception raised outside body") and
its message came back only when the visibility timeout ran out.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from audits import submission
from audits.models import Audit
from config import devservices
from jobs import backlog
from jobs.models import DeadLetter, ReconcileMark
from outbound.urls import normalize_url
from tests.faults.test_database_outage import db_proxy, via  # noqa: F401 (a fixture)
from tests.faults.test_redis_restart import WebProcess
from tests.workers import database_url_for_workers, wait_for

pytestmark = [pytest.mark.slow]

AUDITS = 12
PAGE_SECONDS = 2
THREADS = 6
OUTAGE_SECONDS = 20
# Within this of the outage's end every audit has succeeded (the issue asks for 60 s).
RECOVERY_SECONDS = 60
# Small backoff, few attempts: the old policy spent all of them within the cut.
WORKER_ENV = {"RETRY_BACKOFF_BASE_SECONDS": "0.5", "AUDIT_MAX_ATTEMPTS": "3"}
OUTSIDE_BODY = "Exception raised outside body"


def slow_pages(site, tag: str) -> list[str]:
    return [f"{site.base_url}/slow?delay={PAGE_SECONDS}&{tag}={n}" for n in range(AUDITS)]


def assert_every_audit_succeeded_once(worker_log: str):
    audits = list(Audit.objects.values_list("status", "attempts", "error"))
    assert [(status, attempts) for status, attempts, _ in audits] == [("succeeded", 1)] * AUDITS, (
        audits,
        worker_log[-4000:],
    )
    assert not DeadLetter.objects.exists(), list(DeadLetter.objects.values("exception"))
    assert OUTSIDE_BODY not in worker_log


def all_succeeded() -> bool:
    return Audit.objects.filter(status=Audit.Status.SUCCEEDED).count() == AUDITS


def test_postgresql_away_20s_under_load_spends_no_attempt(db_proxy, site, start_worker):  # noqa: F811
    worker = start_worker(
        "audits", concurrency=THREADS, pool="threads",
        env={"DATABASE_URL": via(db_proxy), **WORKER_ENV},
    )  # fmt: skip
    for url in slow_pages(site, "pg20"):
        submission.submit_audit(normalize_url(url))
    # Some fetching, the rest queued behind them, when the database goes.
    wait_for(lambda: site.hits["/slow"] >= THREADS // 2, timeout=30, message="fetches to start")
    db_proxy.cut()
    time.sleep(OUTAGE_SECONDS)
    db_proxy.restore()
    back = time.monotonic()

    wait_for(all_succeeded, timeout=RECOVERY_SECONDS, interval=0.5,
             message=f"every audit to succeed within {RECOVERY_SECONDS} s of the return")  # fmt: skip
    log = "".join(worker.lines)
    assert "task.outage_wait" in log
    assert_every_audit_succeeded_once(log)
    print(f"all {AUDITS} succeeded {time.monotonic() - back:.1f} s after PostgreSQL returned")


def test_postgresql_away_past_the_attempt_budget_fails_nothing_and_shows_the_wait(
    db_proxy,  # noqa: F811
    site,
    start_worker,
):
    # 3 attempts at 0.5 s, 1 s: the old policy gave up within two seconds of the cut.
    outage = 45
    worker = start_worker(
        "audits", concurrency=THREADS, pool="threads",
        env={"DATABASE_URL": via(db_proxy), **WORKER_ENV},
    )  # fmt: skip
    for url in slow_pages(site, "pg45"):
        submission.submit_audit(normalize_url(url))
    wait_for(lambda: site.hits["/slow"] >= THREADS // 2, timeout=30, message="fetches to start")
    db_proxy.cut()
    cut_at = time.monotonic()

    # The backlog admission weighs shows every audit owed, waiting out the outage.
    def every_audit_in_the_backlog() -> bool:
        snapshot = backlog.backlog_snapshot("audits")
        return snapshot.backlog + snapshot.running >= AUDITS and snapshot.retrying > 0

    wait_for(every_audit_in_the_backlog, timeout=outage - 5, interval=0.5,
             message="the waiting audits in the backlog")  # fmt: skip
    while time.monotonic() - cut_at < outage:
        # Nothing fails while the database is away (the worker cannot write it: its log).
        assert "task.failed" not in "".join(worker.lines)
        time.sleep(1)
    held = backlog.backlog_snapshot("audits")
    assert held.backlog >= AUDITS - THREADS, held
    db_proxy.restore()

    wait_for(all_succeeded, timeout=RECOVERY_SECONDS, interval=0.5,
             message=f"every audit to succeed within {RECOVERY_SECONDS} s of the return")  # fmt: skip
    assert_every_audit_succeeded_once("".join(worker.lines))


def test_redis_away_20s_under_load_spends_no_attempt(site, start_worker, transactional_db):
    port = devservices.free_port()
    data_dir = Path(tempfile.mkdtemp(prefix="plumb-redis-outage-"))
    redis_url = f"redis://127.0.0.1:{port}/0"
    redis = devservices.start_redis(port, data_dir)
    env = {**os.environ, "DEBUG": "true", "REDIS_URL": redis_url,
           "DATABASE_URL": database_url_for_workers(), "AUDIT_ALLOW_PRIVATE_TARGETS": "true"}  # fmt: skip
    web = WebProcess(env)
    try:
        worker = start_worker(
            "audits", concurrency=THREADS, pool="threads",
            env={"REDIS_URL": redis_url, "RECONCILE_INTERVAL_SECONDS": "1", **WORKER_ENV},
        )  # fmt: skip
        wait_for(ReconcileMark.objects.exists, timeout=20, message="a first reconcile tick")
        for url in slow_pages(site, "redis20"):
            assert web.submit(url).status_code == 202
        wait_for(lambda: site.hits["/slow"] >= THREADS // 2, timeout=30, message="fetches")

        redis.terminate()
        redis.wait(timeout=10)
        time.sleep(OUTAGE_SECONDS)
        redis = devservices.start_redis(port, data_dir)  # back, and empty
        back = time.monotonic()

        wait_for(all_succeeded, timeout=RECOVERY_SECONDS, interval=0.5,
                 message=f"every audit to succeed within {RECOVERY_SECONDS} s of the return")  # fmt: skip
        assert_every_audit_succeeded_once("".join(worker.lines))
        print(f"all {AUDITS} succeeded {time.monotonic() - back:.1f} s after Redis returned")
    finally:
        web.stop()
        redis.terminate()
        redis.wait(timeout=10)


def test_a_failure_met_while_postgresql_is_away_is_recorded_once_it_returns(
    db_proxy,  # noqa: F811
    site,
    start_worker,
):
    """The last attempt fails (a 500) while the database is away: its dead letter and the
    audit's failure cannot be written. Recorded from on_failure, outside the task's body,
    this was "Exception raised outside body" and a message nobody owned until the
    visibility timeout (300 s). Now the job waits the outage out and ends once it can."""
    failures = 4
    worker = start_worker(
        "audits", concurrency=failures, pool="threads",
        env={"DATABASE_URL": via(db_proxy), "RETRY_BACKOFF_BASE_SECONDS": "0.5",
             "AUDIT_MAX_ATTEMPTS": "1"},
    )  # fmt: skip
    audits = [
        submission.submit_audit(
            normalize_url(f"{site.base_url}/slow?delay={PAGE_SECONDS}&status=500&n={n}")
        )
        for n in range(failures)
    ]
    wait_for(lambda: site.hits["/slow"] >= failures, timeout=30, message="every fetch to start")
    db_proxy.cut()  # before any of the pages has answered
    # The pages answer within PAGE_SECONDS: every last attempt fails while it is away.
    time.sleep(PAGE_SECONDS + 8)
    db_proxy.restore()

    def every_audit_failed() -> bool:
        return Audit.objects.filter(status=Audit.Status.FAILED).count() == failures

    wait_for(every_audit_failed, timeout=RECOVERY_SECONDS, interval=0.5,
             message="every failure recorded once the database is back")  # fmt: skip
    log = "".join(worker.lines)
    assert OUTSIDE_BODY not in log
    assert "task.failure_not_recorded" in log
    for audit in audits:
        row = Audit.objects.get(id=audit.id)
        assert (row.attempts, row.error.startswith("gave up after 1 attempt(s)")) == (1, True), (
            row.error
        )
        assert DeadLetter.objects.filter(task_id=audit.task_id).count() == 1
