"""Staff replay a dead delivery from the admin, and never see a callback secret there."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from tests.receiver import Receiver
from tests.webhook_helpers import (
    FAST_RETRIES,
    SECRET,
    delivery,
    schedule,
    start_webhooks_worker,
)
from tests.workers import wait_for


@pytest.fixture
def staff_client(client, db):
    admin = get_user_model().objects.create_superuser("admin", "admin@example.org", "pw")
    client.force_login(admin)
    return client


@pytest.mark.slow
def test_replaying_a_dead_delivery_from_the_admin_delivers_it(
    staff_client, start_worker, http_server
):
    receiver_healthy = False
    hook = http_server(Receiver(lambda at, number: 200 if receiver_healthy else 500))
    start_webhooks_worker(start_worker, WEBHOOK_MAX_ATTEMPTS=2, **FAST_RETRIES)
    row = schedule(hook.url)
    wait_for(lambda: delivery(row).status == "failed", timeout=30, message="it to fail")
    assert hook.count(500) == 2

    receiver_healthy = True
    response = staff_client.post(
        "/admin/webhooks/delivery/",
        {"action": "redeliver", "_selected_action": [str(row.id)]},
        follow=True,
    )
    assert response.status_code == 200
    assert "Queued 1 delivery(ies) again." in response.content.decode()
    wait_for(lambda: delivery(row).status == "delivered", timeout=30, message="the replay")
    assert [r.status for r in hook.requests] == [500, 500, 200]
    # A replay is the same event: receivers that already have it can drop it.
    assert {r.webhook_id for r in hook.requests} == {row.webhook_id}
    assert delivery(row).attempts == 3


@pytest.mark.django_db
def test_the_admin_never_shows_a_callback_secret(staff_client, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks():  # the delivery row, not its enqueue
        row = schedule("https://hooks.example.org/plumb")
    pages = [
        f"/admin/audits/audit/{row.audit_id}/change/",
        "/admin/audits/audit/",
        f"/admin/webhooks/delivery/{row.id}/change/",
        "/admin/webhooks/delivery/",
    ]
    for page in pages:
        response = staff_client.get(page)
        assert response.status_code == 200, page
        body = response.content.decode()
        assert SECRET not in body and SECRET.removeprefix("whsec_") not in body, page
    # The change pages do show the callback URL: the secret is left out, not the page.
    assert "hooks.example.org/plumb" in staff_client.get(pages[0]).content.decode()
