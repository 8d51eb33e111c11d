"""A last attempt that fails while PostgreSQL is away is recorded once it returns.

tests/faults/under_load.py: what the outage tests under load share, and why.
"""

from __future__ import annotations

import time

import pytest

from audits.models import Audit
from jobs.models import DeadLetter
from tests.faults.outages import via
from tests.faults.under_load import OUTSIDE_BODY, PAGE_SECONDS, RECOVERY_SECONDS
from tests.submitting import submit
from tests.workers import wait_for

pytestmark = [pytest.mark.slow]


def test_a_failure_met_while_postgresql_is_away_is_recorded_once_it_returns(
    db_proxy,
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
        submit(f"{site.base_url}/slow?delay={PAGE_SECONDS}&status=500&n={n}")
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
