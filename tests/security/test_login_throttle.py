"""Logins are throttled: after LOGIN_FAILURE_LIMIT failures a (username, address) pair is locked."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def admin_login(client: Client, password: str, address: str = "203.0.113.7"):
    return client.post(
        "/admin/login/?next=/admin/",
        {"username": "ops", "password": password},
        REMOTE_ADDR=address,
    )


def test_the_admin_login_locks_out_after_repeated_failures(django_user_model, settings):
    django_user_model.objects.create_superuser("ops", "ops@example.org", "right-password-1")
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert admin_login(client, "wrong").status_code == 200  # the form again
    # The limit: the last failure locks the pair, and then even the right password is refused.
    assert admin_login(client, "wrong").status_code == 429
    assert admin_login(client, "right-password-1").status_code == 429
    # Another address is not locked out by someone guessing elsewhere.
    elsewhere = admin_login(Client(), "right-password-1", address="198.51.100.9")
    assert elsewhere.status_code == 302 and elsewhere["Location"] == "/admin/"
