"""Callback secrets are encrypted at rest, rotatable, and dropped once their delivery succeeded."""

from __future__ import annotations

import base64

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection

from audits.models import Audit, Page
from tests.receiver import Receiver
from tests.webhook_helpers import SECRET
from webhooks import deliver

pytestmark = pytest.mark.django_db

PAGE_SECRET = "whsec_" + base64.b64encode(b"plumb-page-secret-0123456789abcd").decode()


def stored(model, row_id) -> str:
    """The row's callback_secret column as stored; the id as its column holds it (an audit's
    uuid is 32 hex digits on SQLite)."""
    row_id = model._meta.pk.get_db_prep_value(row_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT callback_secret FROM {model._meta.db_table} WHERE id = %s", [row_id]
        )
        return cursor.fetchone()[0]


def make_audit(**fields) -> Audit:
    page = Page.objects.create(
        url="https://example.org/", domain="example.org",
        callback_url="https://owner.example/hook", callback_secret=PAGE_SECRET,
    )  # fmt: skip
    return Audit.objects.create(page=page, task_id="t", **fields)


def test_secrets_are_stored_encrypted_and_read_back_in_clear():
    audit = make_audit(callback_url="https://hooks.example/", callback_secret=SECRET)
    for model, row_id, secret in [
        (Audit, audit.id, SECRET),
        (Page, audit.page_id, PAGE_SECRET),
    ]:
        raw = stored(model, row_id)
        assert raw and secret not in raw and "whsec_" not in raw
    assert Audit.objects.get(id=audit.id).callback_secret == SECRET
    assert Page.objects.get(id=audit.page_id).callback_secret == PAGE_SECRET


def test_a_key_rotation_re_encrypts_with_the_new_key(settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.CALLBACK_SECRET_KEYS = [old]
    audit = make_audit(callback_url="https://hooks.example/", callback_secret=SECRET)
    settings.CALLBACK_SECRET_KEYS = [new, old]  # the new key first: it encrypts
    assert Audit.objects.get(id=audit.id).callback_secret == SECRET
    call_command("rotate_callback_secrets")
    settings.CALLBACK_SECRET_KEYS = [new]  # the old key gone
    assert Audit.objects.get(id=audit.id).callback_secret == SECRET
    assert Page.objects.get(id=audit.page_id).callback_secret == PAGE_SECRET
    assert Fernet(new).decrypt(stored(Audit, audit.id).encode()).decode() == SECRET


# attempt_delivery hands its connection back during the POST: no test transaction around it.
@pytest.mark.django_db(transaction=True)
def test_a_submission_s_secret_is_dropped_once_its_delivery_succeeded(redis_client, http_server):
    hook = http_server(Receiver())
    audit = make_audit(status=Audit.Status.SUCCEEDED, callback_url=hook.url, callback_secret=SECRET)
    delivery, created = deliver.create_delivery(audit.id)
    assert created
    assert deliver.run_delivery(str(delivery.id)) == deliver.Outcome.DELIVERED
    assert hook.count(200) == 1
    assert stored(Audit, audit.id) == ""
    # The page's secret stays: it signs every later `audit.changed`.
    assert Page.objects.get(id=audit.page_id).callback_secret == PAGE_SECRET
