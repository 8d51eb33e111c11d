"""A submission may carry a callback; a finished audit with one gets exactly one delivery."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from rest_framework.test import APIClient

from audits.models import Audit
from tests.submitting import post_audit
from tests.webhook_helpers import SECRET, finished_audit_with_callback
from tests.workers import ROOT
from webhooks.models import Delivery


@pytest.mark.django_db
def test_a_callback_is_accepted_and_its_secret_never_returned(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks():
        response = post_audit(
            APIClient(),
            {
                "url": "https://example.org/",
                "callback_url": "HTTPS://Hooks.Example.org/plumb",
                "callback_secret": SECRET,
            },
        )
    assert response.status_code == 202, response.content
    assert response.json()["callback_url"] == "https://hooks.example.org/plumb"
    assert SECRET not in response.content.decode()
    audit = Audit.objects.get(id=response.json()["id"])
    assert audit.callback_secret == SECRET
    listed = APIClient().get("/api/audits").content.decode()
    detail = APIClient().get(f"/api/audits/{audit.id}").content.decode()
    assert SECRET not in listed and SECRET not in detail


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"callback_url": "ftp://hooks.example.org/", "callback_secret": SECRET}, "callback_url"),
        ({"callback_url": "https://hooks.example.org/"}, "callback_secret"),
        ({"callback_secret": SECRET}, "callback_url"),
        (
            {"callback_url": "https://h.example.org/", "callback_secret": "hunter2"},
            "callback_secret",
        ),
        ({"callback": "https://hooks.example.org/"}, "callback"),  # still strict about unknowns
    ],
)
def test_a_bad_callback_is_refused_naming_the_field(extra, field):
    response = post_audit(APIClient(), {"url": "https://example.org/", **extra})
    assert response.status_code == 400
    body = response.json()
    assert field in body["fields"]
    assert "hunter2" not in response.content.decode()  # a refused secret is not echoed


@pytest.mark.django_db
def test_finishing_an_audit_with_a_callback_creates_one_delivery_published_on_commit(
    django_capture_on_commit_callbacks,
):
    audit = finished_audit_with_callback("https://hooks.example.org/plumb")
    Audit.objects.filter(id=audit.id).update(status=Audit.Status.RUNNING, finished_at=None)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert Audit.objects.finish(str(audit.id), status=Audit.Status.FAILED, error="boom")
        # The row is written with the finish (tests/test_webhook_outbox.py); its message
        # waits for the commit.
        assert Delivery.objects.filter(audit=audit).count() == 1
        assert not Audit.objects.finish(str(audit.id), status=Audit.Status.SUCCEEDED)
    assert len(callbacks) == 1  # the publish
    row = Delivery.objects.get(audit=audit)
    assert row.url == "https://hooks.example.org/plumb" and row.status == "pending"
    assert row.task_id


@pytest.mark.django_db
def test_an_audit_without_a_callback_gets_no_delivery(django_capture_on_commit_callbacks):
    audit = finished_audit_with_callback("")
    Audit.objects.filter(id=audit.id).update(status=Audit.Status.RUNNING)
    with django_capture_on_commit_callbacks(execute=True):
        Audit.objects.finish(str(audit.id), status=Audit.Status.SUCCEEDED)
    assert not Delivery.objects.exists()


def settings_in_a_fresh_process(**env) -> dict:
    code = (
        "import json, django; from django.conf import settings; django.setup();"
        "db = settings.DATABASES['default'];"
        "print(json.dumps({'pool': db.get('OPTIONS', {}).get('pool'), 'age': db['CONN_MAX_AGE']}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "DEBUG": "true", "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_database_pool_is_a_setting():
    postgres = "postgres://u@127.0.0.1:5432/plumb"
    off = settings_in_a_fresh_process(DATABASE_URL=postgres, DB_CONN_MAX_AGE="60")
    assert off == {"pool": None, "age": 60}
    on = settings_in_a_fresh_process(
        DATABASE_URL=postgres, DB_POOL_MAX_SIZE="8", DB_POOL_TIMEOUT_SECONDS="2.5"
    )
    assert on == {"pool": {"min_size": 1, "max_size": 8, "timeout": 2.5}, "age": 0}


def test_a_webhooks_worker_refuses_a_concurrency_other_than_its_cap():
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "webhooks",
         "-P", "threads", "--concurrency", "50"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DEBUG": "true", "WEBHOOK_MAX_CONCURRENCY": "4"},
    )  # fmt: skip
    assert result.returncode != 0
    assert "WEBHOOK_MAX_CONCURRENCY (4)" in result.stdout + result.stderr
