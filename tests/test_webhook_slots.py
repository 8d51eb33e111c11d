"""A delivery holds a slot of its receiver only for its POST, through the outbound client.

The tests share one webhooks worker allowing one delivery at a time per receiver."""

from __future__ import annotations

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections

from outbound.urls import origin_key
from tests.receiver import Receiver
from tests.webhook_helpers import delivery, finished_audit_with_callback, module_webhooks_worker
from tests.workers import wait_for
from webhooks import deliver, tasks

pytestmark = pytest.mark.slow

# One slot a receiver: a slot held by a delivery that is not POSTing would keep every
# other delivery to it waiting.
one_slot_worker = module_webhooks_worker(WEBHOOK_PER_HOST_CONCURRENCY=1, WEBHOOK_MAX_CONCURRENCY=4)


def claims_waiting_on_a_lock() -> int:
    """Sessions of the worker waiting for a row lock on a delivery (its claim's UPDATE)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE 'UPDATE \"webhooks_delivery\"%%'"
        )
        return cursor.fetchone()[0]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="reads PostgreSQL's lock waits")
def test_a_delivery_stuck_in_the_database_holds_no_slot_of_its_receiver(
    one_slot_worker, redis_client
):
    receiver = Receiver(hold_seconds=1.0).start()
    # The receiver's slots: its origin's, in the webhooks pool (not shared with page
    # fetches or link checks of the same origin).
    slot_key = f"hostslots:webhooks:{origin_key(receiver.url)}:inflight"
    stuck, _ = deliver.create_delivery(finished_audit_with_callback(receiver.url, number=1).id)
    moving, _ = deliver.create_delivery(finished_audit_with_callback(receiver.url, number=2).id)
    # A slow database for the first delivery: its row is locked, so its claim waits.
    locker = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with locker.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("SELECT 1 FROM webhooks_delivery WHERE id = %s FOR UPDATE", [stuck.id])
            tasks.enqueue_delivery(stuck)
            wait_for(lambda: claims_waiting_on_a_lock() == 1, timeout=30, message="the claim")
            assert redis_client.zcard(slot_key) == 0  # nothing held while the claim waits
            tasks.enqueue_delivery(moving)
            wait_for(lambda: receiver.in_flight == 1, timeout=15, message="the second POST")
            assert redis_client.zcard(slot_key) == 1  # the slot is held for the exchange
            wait_for(
                lambda: delivery(moving).status == "delivered",
                timeout=15, message="the second delivery, while the first is stuck",
            )  # fmt: skip
            assert redis_client.zcard(slot_key) == 0
            assert claims_waiting_on_a_lock() == 1  # the first was stuck all along
            cursor.execute("ROLLBACK")
        wait_for(
            lambda: delivery(stuck).status == "delivered", timeout=30, message="the first delivery"
        )
        assert receiver.count() == 2
        assert [delivery(stuck).attempts, delivery(moving).attempts] == [1, 1]
    finally:
        locker.close()
        receiver.stop()


def test_a_busy_receiver_defers_the_delivery_without_spending_an_attempt(
    one_slot_worker, redis_client
):
    receiver = Receiver().start()
    slot_key = f"hostslots:webhooks:{origin_key(receiver.url)}:inflight"
    # Another worker's POST holds the receiver's one slot (a lease that lapses on its own).
    redis_client.zadd(slot_key, {"elsewhere": redis_client.time()[0] + 60})
    row = tasks.schedule_delivery(audit_id=finished_audit_with_callback(receiver.url).id)
    seen = []

    def deferred() -> bool:
        seen.append(delivery(row))
        return seen[-1].status == "retrying" and seen[-1].next_attempt_at is not None

    wait_for(deferred, timeout=30, message="the delivery deferred")
    assert receiver.count() == 0
    assert seen[-1].attempts == 0  # the attempt its claim counted was given back
    redis_client.zrem(slot_key, "elsewhere")
    wait_for(lambda: delivery(row).status == "delivered", timeout=30, message="the delivery")
    assert (receiver.count(), delivery(row).attempts, delivery(row).last_error) == (1, 1, "")
