"""Redis stops for 3 s and comes back empty (a restart without persistence, a failover to
a replica that had nothing), under real workers: everything PostgreSQL says is owed is
done anyway, found by the reconciler (jobs.reconcile) within its interval.

Each test runs its workers against a private redis-server on a free port, stops it, and
starts a fresh, empty one on the same port.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from audits import submission
from audits.models import Audit, Page
from jobs.models import ReconcileMark
from outbound.urls import normalize_url
from reaudit.models import FanOut, Placement
from tests.reaudit_factories import DAY
from tests.receiver import Receiver
from tests.test_reaudit_worker import assert_one_reaudit_per_page_each_at_or_after_its_offset
from tests.webhook_helpers import finished_audit_with_callback, start_webhooks_worker
from tests.workers import reaudit_as_make_run, wait_for
from webhooks import deliver
from webhooks.models import Delivery

pytestmark = pytest.mark.slow

# A tick every half second, so a test sees recovery in seconds (the default is 15 s).
RECONCILING_FAST = {"RECONCILE_INTERVAL_SECONDS": "0.5"}


def fresh_workers_beside(*starts):
    """Start a fresh worker beside each running one, after the Redis restart.

    The old workers reconnect and go on (tests/faults/test_broker_outage.py); fresh ones
    beside them, as a deploy would start, consume what the reconciler puts back too.
    """
    return [start() for start in starts]


def wait_for_the_first_mark(*workers) -> None:
    """The reconciler has ticked once against this Redis: it will know when Redis forgets."""
    wait_for(ReconcileMark.objects.exists, timeout=20, message="a first reconcile tick",
             show=workers)  # fmt: skip


def test_twenty_waiting_webhook_deliveries_all_arrive_after_redis_came_back_empty(
    start_worker, private_redis, http_server
):
    receiver_up = threading.Event()
    receiver = http_server(Receiver(lambda at, number: 200 if receiver_up.is_set() else 503))
    worker = start_webhooks_worker(
        start_worker, REDIS_URL=private_redis.url, WEBHOOK_BACKOFF_BASE_SECONDS=8,
        **RECONCILING_FAST,
    )  # fmt: skip
    wait_for_the_first_mark(worker)
    deliveries = []
    for number in range(20):
        delivery, _ = deliver.create_delivery(
            finished_audit_with_callback(receiver.url, number=number).id
        )
        private_redis.publish("webhooks.deliver", [str(delivery.id)],
                              task_id=delivery.task_id, queue="webhooks")  # fmt: skip
        deliveries.append(delivery)
    # The receiver is down: every delivery fails (or is parked by the breaker) and waits
    # for its next attempt, in the delayed store.
    wait_for(
        lambda: Delivery.objects.filter(status=Delivery.Status.RETRYING).count() == 20,
        timeout=30, message="twenty deliveries waiting", show=[worker],
    )  # fmt: skip

    private_redis.restart_empty()
    receiver_up.set()

    wait_for(
        lambda: Delivery.objects.filter(status=Delivery.Status.DELIVERED).count() == 20,
        timeout=60, message="all twenty delivered", show=[worker],
    )  # fmt: skip
    arrived = {r.webhook_id for r in receiver.requests if r.status == 200}
    assert arrived == {f"msg_{d.id.hex}" for d in deliveries}


def test_forty_accepted_audits_all_succeed_after_redis_came_back_empty(
    site, start_worker, private_redis
):
    worker = start_worker("audits", pool="threads", concurrency=4,
                          env={"REDIS_URL": private_redis.url, **RECONCILING_FAST})  # fmt: skip
    wait_for_the_first_mark(worker)
    audits = []
    for number in range(40):
        # Accepted as the API accepts: the row, then its message.
        page = submission.get_or_create_page(
            normalize_url(f"{site.base_url}/slow?delay=0.5&n={number}")
        )
        audit = Audit.objects.create(page=page, task_id=str(uuid.uuid4()))
        private_redis.publish("audits.run_audit", [str(audit.id)], task_id=audit.task_id,
                              queue="audits")  # fmt: skip
        audits.append(audit)
    wait_for(lambda: Audit.objects.filter(status="succeeded").count() >= 4, timeout=30,
             message="the first audits to finish", show=[worker])  # fmt: skip

    private_redis.restart_empty()  # most of the forty were still waiting in the queue
    (worker,) = fresh_workers_beside(
        lambda: start_worker("audits", pool="threads", concurrency=4,
                             env={"REDIS_URL": private_redis.url, **RECONCILING_FAST})
    )  # fmt: skip

    wait_for(
        lambda: Audit.objects.filter(status="succeeded").count() == 40,
        timeout=90, message="all forty audits to succeed", show=[worker],
    )  # fmt: skip
    assert not Audit.objects.exclude(status="succeeded").exists()


def test_a_night_whose_redis_restarts_empty_mid_window_reaudits_every_page_once(
    site, start_worker, private_redis
):
    env = {
        "REDIS_URL": private_redis.url,
        "REAUDIT_SLICE_SECONDS": "3",
        "REAUDIT_VISIBILITY_TIMEOUT_SECONDS": "6",
        "REAUDIT_DOMAIN_SPACING_SECONDS": "1",
        **RECONCILING_FAST,
    }
    # Pages without links: each re-audit is one fetch (link checks have their own test).
    Page.objects.bulk_create(
        Page(url=f"{site.base_url}/noindex?d={domain}&p={n}", domain=domain, reaudit_nightly=True)
        for domain in ("alpha.test", "beta.test", "gamma.test")
        for n in range(4)
    )
    audits_worker = start_worker("audits", pool="threads", concurrency=4, env=env)
    reaudit = start_worker("reaudit", **reaudit_as_make_run(), env=env)
    wait_for_the_first_mark(audits_worker, reaudit)

    private_redis.publish("reaudit.fan_out", [DAY.isoformat(), 15],
                          task_id=f"fan-out-{DAY}", queue="reaudit")  # fmt: skip
    wait_for(lambda: Placement.objects.exclude(fired_at=None).count() >= 2, timeout=30,
             message="the night to start", show=[reaudit])  # fmt: skip
    night = FanOut.objects.get(day=DAY)
    assert Placement.objects.filter(fan_out=night, fired_at=None).exists()

    in_flight = set(Audit.objects.filter(trigger="reaudit").values_list("id", flat=True))
    private_redis.restart_empty()  # mid-window: the chain and the held placements are gone
    old_workers = [audits_worker, reaudit]
    audits_worker, reaudit = fresh_workers_beside(
        lambda: start_worker("audits", pool="threads", concurrency=4, env=env),
        lambda: start_worker("reaudit", **reaudit_as_make_run(), env=env),
    )

    wait_for(lambda: not Placement.objects.filter(fan_out=night, fired_at=None).exists(),
             timeout=60, message="every placement to fire", show=[reaudit, audits_worker])  # fmt: skip
    assert_one_reaudit_per_page_each_at_or_after_its_offset(night)
    # The re-audits placed since all succeed. (One running as Redis went away may fail on
    # it: a Redis error inside an attempt is not retried by the audit policy; the outage
    # work owns that.)
    placed_since = Audit.objects.filter(trigger="reaudit").exclude(id__in=in_flight)
    wait_for(
        lambda: placed_since.filter(status="succeeded").count() == 12 - len(in_flight),
        timeout=60, message="every re-audit to succeed",
        show=[audits_worker, reaudit, *old_workers],
    )  # fmt: skip
