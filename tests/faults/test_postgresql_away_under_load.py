"""PostgreSQL away 20 s under load: no attempt is spent, every audit succeeds once.

tests/faults/under_load.py: what the outage tests under load share, and why.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.outages import via
from tests.faults.under_load import (
    AUDITS,
    OUTAGE_SECONDS,
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


def test_postgresql_away_20s_under_load_spends_no_attempt(db_proxy, site, start_worker):
    worker = start_worker(
        "audits", concurrency=THREADS, pool="threads",
        env={"DATABASE_URL": via(db_proxy), **WORKER_ENV},
    )  # fmt: skip
    for url in slow_pages(site, "pg20"):
        submit(url)
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
