"""Redis stops under a running worker of each queue and comes back empty: the worker
process lives on, reconnects, and its threads tick again.

Each worker holds messages it has not acknowledged when Redis goes (ETA messages
it keeps until they are due), so kombu restores them while the connection is torn
down: that is where the reaudit worker used to die ("Unrecoverable error:
AttributeError: 'NoneType' object has no attribute 'hostname'"). After Redis is back,
a job put in the delayed store is published by the worker's waker and run: the
waker thread survived the ticks that failed during the outage.
"""

from __future__ import annotations

import uuid
from contextlib import contextmanager
from datetime import date

import pytest
from django.conf import settings

from audits import submission
from audits.models import Audit, Page
from config.celery_app import app, unacked_key_for_queue
from jobs import delayed
from outbound.urls import normalize_url
from tests.private_redis import PrivateRedis
from tests.receiver import Receiver
from tests.webhook_helpers import finished_audit_with_callback
from tests.workers import reaudit_as_make_run, wait_for
from webhooks.models import Delivery

pytestmark = pytest.mark.slow

# How long Redis stays away: a blip, as a restart or a failover takes.
OUTAGE_SECONDS = 3
# Held by the worker (not due) while Redis goes away, so kombu has unacked messages
# to restore as it closes the lost connection.
HELD_MESSAGES = 3


@contextmanager
def publishing_to(url: str):
    with app.connection_for_write(url) as connection:
        yield connection


def hold_messages(queue: str, task_name: str, args: list, private: PrivateRedis) -> None:
    """Give the worker messages it holds unacknowledged: ETA an hour away."""
    with publishing_to(private.url) as connection:
        for _ in range(HELD_MESSAGES):
            app.send_task(task_name, args=args, queue=queue, countdown=3600, connection=connection)
    unacked = unacked_key_for_queue(queue)
    wait_for(
        lambda: private.client().hlen(unacked) >= HELD_MESSAGES,
        timeout=20,
        message="the worker to hold its ETA messages",
    )


def wake_through_delayed_store(entry: delayed.Entry, private: PrivateRedis) -> None:
    # Due at once: only a live waker thread publishes it.
    delayed.schedule(entry, delay=0, client=private.client())


def connections_made(worker) -> int:
    return sum(" Connected to " in line for line in worker.lines)


def survive_outage(worker, private: PrivateRedis) -> None:
    before = connections_made(worker)
    private.restart_empty(down_seconds=OUTAGE_SECONDS)
    # Back: the worker must reconnect, not exit.
    wait_for(
        lambda: connections_made(worker) > before or worker.process.poll() is not None,
        timeout=60,
        message="the worker to reconnect",
        show=[worker],
    )
    assert worker.process.poll() is None, worker.output()


def test_an_audits_worker_outlives_a_redis_restart(site, start_worker, private_redis):
    worker = start_worker(
        "audits",
        pool=settings.AUDITS_WORKER_POOL,
        concurrency=4,
        env={"REDIS_URL": private_redis.url},
    )
    hold_messages("audits", "audits.run_audit", [str(uuid.uuid4())], private_redis)

    survive_outage(worker, private_redis)

    page = submission.get_or_create_page(normalize_url(f"{site.base_url}/noindex"))
    audit = Audit.objects.create(page=page, task_id=str(uuid.uuid4()))
    entry = delayed.Entry("audits.run_audit", "audits", audit.task_id, [str(audit.id)])
    wake_through_delayed_store(entry, private_redis)
    wait_for(
        lambda: Audit.objects.get(id=audit.id).status == Audit.Status.SUCCEEDED,
        timeout=60,
        message="an audit woken after the restart",
        show=[worker],
    )
    assert worker.process.poll() is None


def test_a_reaudit_worker_outlives_a_redis_restart(start_worker, private_redis):
    page = Page.objects.create(
        url="http://127.0.0.1:9/reaudit-outage", domain="127.0.0.1", reaudit_nightly=True
    )
    worker = start_worker("reaudit", **reaudit_as_make_run(), env={"REDIS_URL": private_redis.url})
    hold_messages("reaudit", "reaudit.place", [page.id, "2030-01-14"], private_redis)

    survive_outage(worker, private_redis)

    day = date(2030, 1, 15).isoformat()
    entry = delayed.Entry("reaudit.place", "reaudit", str(uuid.uuid4()), [page.id, day])
    wake_through_delayed_store(entry, private_redis)
    wait_for(
        lambda: Audit.objects.filter(page=page, trigger=Audit.Trigger.REAUDIT).exists(),
        timeout=60,
        message="a placement woken after the restart",
        show=[worker],
    )
    assert worker.process.poll() is None


def test_a_webhooks_worker_outlives_a_redis_restart(start_worker, private_redis, http_server):
    receiver = http_server(Receiver())
    worker = start_worker(
        "webhooks", concurrency=None, pool="threads", env={"REDIS_URL": private_redis.url}
    )
    hold_messages("webhooks", "webhooks.deliver", [str(uuid.uuid4())], private_redis)

    survive_outage(worker, private_redis)

    audit = finished_audit_with_callback(receiver.url)
    row = Delivery.objects.create(
        audit=audit, event="audit.finished", url=receiver.url, task_id=str(uuid.uuid4())
    )
    entry = delayed.Entry("webhooks.deliver", "webhooks", row.task_id, [str(row.id)])
    wake_through_delayed_store(entry, private_redis)
    wait_for(
        lambda: receiver.count(200) == 1,
        timeout=60,
        message="a delivery woken after the restart",
        show=[worker],
    )
    assert worker.process.poll() is None


@pytest.mark.parametrize("queue", ["audits", "reaudit", "webhooks"])
def test_a_worker_whose_pubsub_connection_drops_goes_on_consuming(
    queue, start_worker, private_redis
):
    # Redis stays up and closes only the worker's pub/sub connection (its remote-control
    # channel), as a restart does when the server is back before the worker reads the
    # close: the worker's event loop must not end up waiting on a fresh subscription
    # for a message that never comes, with its queue unread.
    worker = start_worker(
        queue, pool="threads", concurrency=None if queue == "webhooks" else 2,
        env={"REDIS_URL": private_redis.url},
    )  # fmt: skip
    client = private_redis.client()
    wait_for(
        lambda: client.client_list(_type="pubsub"),
        timeout=20,
        message="the worker to subscribe",
    )
    assert client.client_kill_filter(_type="pubsub") >= 1
    # A task for a row that does not exist: the worker takes it and finishes it.
    task_id = str(uuid.uuid4())
    task, args = {
        "audits": ("audits.run_audit", [str(uuid.uuid4())]),
        "reaudit": ("reaudit.place", [0, date.today().isoformat()]),
        "webhooks": ("webhooks.deliver", [str(uuid.uuid4())]),
    }[queue]
    with publishing_to(private_redis.url) as connection:
        app.send_task(task, args=args, queue=queue, task_id=task_id, connection=connection)
    wait_for(
        lambda: f"task.finished task={task} task_id={task_id}" in worker.output(),
        timeout=60,
        message="the worker to take a task after its pub/sub connection dropped",
        show=[worker],
    )
