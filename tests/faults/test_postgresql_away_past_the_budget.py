"""PostgreSQL away 45 s, far past the attempt budget: nothing fails, the backlog shows
every waiting audit, and every audit succeeds once when it returns.

tests/faults/under_load.py: what the outage tests under load share, and why.
"""

from __future__ import annotations

import time

import pytest

from jobs import backlog
from tests.faults.outages import via
from tests.faults.under_load import (
    AUDITS,
    RECOVERY_SECONDS,
    THREADS,
    WORKER_ENV,
    all_succeeded,
    assert_every_audit_succeeded_once,
    slow_pages,
)
from tests.submitting import submit
from tests.workers import wait_for

pytestmark = [pytest.mark.slow]


def test_postgresql_away_past_the_attempt_budget_fails_nothing_and_shows_the_wait(
    db_proxy,
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
        submit(url)
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
