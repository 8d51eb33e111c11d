"""PostgreSQL or Redis away under load: no attempt is spent, nothing is lost, and every
audit runs within seconds of the outage's end (issue 32, point 1). What the four tests
share. Each is a file of its own (test_postgresql_away_under_load.py,
test_postgresql_away_past_the_budget.py, test_redis_away_under_load.py,
test_failure_while_postgresql_is_away.py), so xdist runs them at once: a test file stays on
one xdist worker, and together, mostly waiting out their cuts, they were the suite's
longest file (140 s).

Audits of a page that answers slowly are running and queued when the outage starts.
Before the outage wait, every audit spent its attempts on `OperationalError` within
the cut, the last failure could not be written ("Exception raised outside body") and
its message came back only when the visibility timeout ran out.
"""

from __future__ import annotations

from audits.models import Audit
from jobs.models import DeadLetter

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
