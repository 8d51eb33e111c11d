"""The delayed store: one entry per waiting job, an atomic lease, and a waker that can die
at any step without losing or duplicating the job."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import redis
from django.conf import settings

from audits import submission
from audits.models import Audit
from jobs import delayed
from outbound.urls import normalize_url
from tests.workers import ROOT, database_url_for_workers, wait_for

QUEUE = "audits"


def entry(task_id: str, **fields) -> delayed.Entry:
    return delayed.Entry("audits.run_audit", QUEUE, task_id, ["x"], **fields)


def test_a_due_entry_is_leased_to_exactly_one_waker(redis_client):
    for n in range(50):
        delayed.schedule(entry(f"t{n}"), delay=0)
    leased: list[list[bytes]] = []
    start = threading.Barrier(4)

    def waker():
        client = redis.Redis.from_url(settings.REDIS_URL)
        start.wait()
        leased.append(delayed.lease_due(QUEUE, client=client, batch=20))

    threads = [threading.Thread(target=waker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    members = [member for batch in leased for member in batch]
    assert len(members) == len(set(members)) == 50


def test_an_entry_not_yet_due_stays_and_a_lapsed_lease_comes_back(redis_client):
    delayed.schedule(entry("later"), delay=600)
    delayed.schedule(entry("now"), delay=0)
    (member,) = delayed.lease_due(QUEUE, client=redis_client, lease_seconds=0.2)
    assert delayed.Entry.loads(member).task_id == "now"
    assert delayed.lease_due(QUEUE, client=redis_client) == []
    assert delayed.waiting(QUEUE) == 2  # leased, not lost
    # The waker that leased it never came back: after the lease it is due again.
    wait_for(
        lambda: delayed.lease_due(QUEUE, client=redis_client) == [member],
        timeout=5, message="the lapsed lease",
    )  # fmt: skip


def test_a_second_publish_of_one_entry_does_not_run_but_a_redelivery_of_the_first_does(
    redis_client,
):
    first = {delayed.ENTRY_HEADER: "e1", delayed.PUBLISH_HEADER: "p1"}
    second = {delayed.ENTRY_HEADER: "e1", delayed.PUBLISH_HEADER: "p2"}
    assert delayed.claim(first)
    assert not delayed.claim(second)
    assert delayed.claim(first)  # its worker died; the broker handed it out again
    assert delayed.claim({})  # a message that never waited in the store


WAKER_STEPS = """
import os, signal, sys
import django
django.setup()
from config.redis import dedicated_client
from jobs import delayed

client = dedicated_client()
(member,) = delayed.lease_due(sys.argv[1], client=client, lease_seconds=1.0)
if sys.argv[2] == "after-publish":
    delayed.publish(delayed.Entry.loads(member))
os.kill(os.getpid(), signal.SIGKILL)  # the waker dies before its next step
"""


def die_after(step: str) -> None:
    env = {
        **os.environ,
        "DEBUG": "true",
        "DATABASE_URL": database_url_for_workers(),
        "REDIS_URL": settings.REDIS_URL,
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    waker = subprocess.run(
        [sys.executable, "-c", WAKER_STEPS, QUEUE, step], cwd=ROOT, env=env, timeout=60
    )
    assert waker.returncode == -9


@pytest.mark.slow
@pytest.mark.parametrize("step", ["after-lease", "after-publish"])
def test_a_waker_killed_between_steps_neither_loses_nor_duplicates_the_job(
    step, site, start_worker, redis_client
):
    page = submission.get_or_create_page(normalize_url(f"{site.base_url}/noindex?step={step}"))
    audit = Audit.objects.create(page=page, task_id=f"task-{step}", status=Audit.Status.RETRYING)
    delayed.schedule(
        delayed.Entry("audits.run_audit", QUEUE, audit.task_id, [str(audit.id)], wait="retry"),
        delay=0,
    )
    die_after(step)
    assert delayed.waiting(QUEUE) == 1  # still leased to the dead waker

    worker = start_worker("audits", env={"DELAYED_POLL_INTERVAL_SECONDS": "0.1"})
    wait_for(
        lambda: Audit.objects.get(id=audit.id).status == "succeeded",
        timeout=30, message="the audit to run", show=[worker],
    )  # fmt: skip
    # Once the dead waker's lease lapses the entry is published (again, after a publish).
    wait_for(
        lambda: delayed.waiting(QUEUE) == 0 and redis_client.llen(QUEUE) == 0,
        timeout=10, message="the store and queue to empty", show=[worker],
    )  # fmt: skip
    if step == "after-publish":
        wait_for(
            lambda: "task.duplicate_skipped" in worker.output(),
            timeout=10, message="the second publish to be skipped", show=[worker],
        )  # fmt: skip
    assert site.hits["/noindex"] == 1
    assert Audit.objects.get(id=audit.id).attempts == 1
