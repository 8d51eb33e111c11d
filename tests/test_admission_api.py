"""Admission on POST /api/audits, and GET /api/queue, against the real test Redis."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from audits import admission
from audits.admission import admission_counts
from audits.models import Audit, LinkCheck, Page
from reaudit.services import fan_out, fire_placement
from reaudit.tasks import NIGHT_TASKS
from tests.submitting import post_audit

pytestmark = pytest.mark.django_db

QUEUE_FIELDS = {
    "backlog", "waiting", "retrying", "running", "scheduled", "max_depth",
    "deferred_beyond_horizon",
}  # fmt: skip


@pytest.fixture
def api():
    return APIClient()


def submit_and_enqueue(api, django_capture_on_commit_callbacks, url: str, **extra):
    with django_capture_on_commit_callbacks(execute=True):
        response = post_audit(api, url, **extra)
    assert response.status_code == 202, response.content
    return response


def test_an_empty_bucket_answers_429_with_retry_after_and_writes_nothing(api, settings):
    settings.AUDIT_SUBMIT_BURST = 2
    settings.AUDIT_SUBMIT_RATE_PER_MINUTE = 2
    assert [post_audit(api, f"https://example.org/{n}").status_code for n in range(2)] == [202, 202]

    response = post_audit(api, "https://example.org/refused")
    assert response.status_code == 429
    assert response.json()["error"] == "throttled"
    # 2 per minute: the next token is 30 s away.
    assert 29 <= int(response["Retry-After"]) <= 30
    assert Audit.objects.count() == 2
    assert not Page.objects.filter(url="https://example.org/refused").exists()


def test_a_full_backlog_answers_503_with_retry_after_and_writes_nothing(
    api, settings, django_capture_on_commit_callbacks
):
    settings.AUDIT_QUEUE_MAX_DEPTH = 2
    settings.AUDIT_CLIENT_MAX_SHARE = 0.5  # one audit each
    for n, address in enumerate(["192.0.2.1", "192.0.2.2"]):
        submit_and_enqueue(
            api, django_capture_on_commit_callbacks, f"https://example.org/{n}",
            REMOTE_ADDR=address,
        )  # fmt: skip

    response = post_audit(api, "https://example.org/refused", REMOTE_ADDR="192.0.2.3")
    assert response.status_code == 503
    body = response.json()
    assert (body["error"], body["backlog"], body["max_depth"]) == ("backlog_full", 2, 2)
    assert 5 <= int(response["Retry-After"]) <= 15
    assert Audit.objects.count() == 2
    assert not Page.objects.filter(url="https://example.org/refused").exists()


def test_a_client_beyond_its_share_answers_429_while_another_client_is_admitted(
    api, settings, django_capture_on_commit_callbacks
):
    settings.AUDIT_QUEUE_MAX_DEPTH = 20
    settings.AUDIT_CLIENT_MAX_SHARE = 0.1  # two audits a client
    for n in range(2):
        submit_and_enqueue(api, django_capture_on_commit_callbacks, f"https://example.org/{n}")

    response = post_audit(api, "https://example.org/refused")
    assert response.status_code == 429
    body = response.json()
    assert (body["error"], body["held"], body["share"]) == ("client_backlog_full", 2, 2)
    assert 5 <= int(response["Retry-After"]) <= 15
    assert not Page.objects.filter(url="https://example.org/refused").exists()
    assert admission_counts()["refused_client"] == 1
    # Another address is admitted; an IPv6 client is one client per /64.
    assert post_audit(api, "https://example.org/other", REMOTE_ADDR="192.0.2.9").status_code == 202
    for n, address in enumerate(["2001:db8::1", "2001:db8::2"]):
        submit_and_enqueue(
            api, django_capture_on_commit_callbacks, f"https://example.org/v6/{n}",
            REMOTE_ADDR=address,
        )  # fmt: skip
    assert post_audit(api, "https://example.org/v6/3", REMOTE_ADDR="2001:db8::3").status_code == 429
    # Once the client's audits finish, it holds nothing and is admitted again.
    Audit.objects.filter(client="ip:127.0.0.1").update(status=Audit.Status.SUCCEEDED)
    assert post_audit(api, "https://example.org/again").status_code == 202


def test_a_client_holding_its_share_is_told_so_when_the_backlog_is_full_too(
    api, settings, django_capture_on_commit_callbacks, redis_client
):
    settings.AUDIT_QUEUE_MAX_DEPTH = 20
    settings.AUDIT_CLIENT_MAX_SHARE = 0.1  # two audits a client
    for n in range(2):
        submit_and_enqueue(api, django_capture_on_commit_callbacks, f"https://example.org/{n}")
    redis_client.lpush("audits", *range(18))  # the backlog at its cap: 20

    response = post_audit(api, "https://example.org/refused")
    assert response.status_code == 429
    assert (response.json()["error"], response.json()["held"]) == ("client_backlog_full", 2)
    other = post_audit(api, "https://example.org/other", REMOTE_ADDR="192.0.2.9")
    assert (other.status_code, other.json()["error"]) == (503, "backlog_full")
    counts = admission_counts()
    assert (counts["refused_client"], counts["refused_backlog"]) == (1, 1)
    assert Audit.objects.count() == 2


def test_a_client_is_its_user_when_authenticated_whatever_its_address(
    api, settings, django_user_model
):
    settings.AUDIT_QUEUE_MAX_DEPTH = 10
    settings.AUDIT_CLIENT_MAX_SHARE = 0.1  # one audit a client
    staff = django_user_model.objects.create_user("ops", password="x", is_staff=True)
    api.force_authenticate(staff)
    assert post_audit(api, "https://example.org/1", REMOTE_ADDR="192.0.2.1").status_code == 202
    assert Audit.objects.get().client == f"user:{staff.pk}"
    assert post_audit(api, "https://example.org/2", REMOTE_ADDR="192.0.2.2").status_code == 429
    api.force_authenticate(None)
    assert post_audit(api, "https://example.org/3", REMOTE_ADDR="192.0.2.2").status_code == 202


def test_a_token_counts_as_its_user_from_any_address(api, settings, django_user_model):
    settings.API_TOKENS = {"ci": "secret-token"}
    settings.AUDIT_QUEUE_MAX_DEPTH = 10
    settings.AUDIT_CLIENT_MAX_SHARE = 0.1  # one audit a client
    token = {"HTTP_AUTHORIZATION": "Bearer secret-token"}
    response = post_audit(api, "https://example.org/1", REMOTE_ADDR="192.0.2.1", **token)
    assert response.status_code == 202, response.content
    ci = django_user_model.objects.get(username="ci")
    assert Audit.objects.get().client == f"user:{ci.pk}"
    # The same token from another address is the same client, past its share.
    assert (
        post_audit(api, "https://example.org/2", REMOTE_ADDR="192.0.2.2", **token).status_code
        == 429
    )


# The holding's statement has a text per database (audits.admission.CLIENT_HOLDING_SQL).
@pytest.mark.both_databases
def test_an_audit_checking_links_holds_one_entry_per_check_it_waits_on(api, settings):
    settings.AUDIT_QUEUE_MAX_DEPTH = 50
    settings.AUDIT_CLIENT_MAX_SHARE = 0.1  # five entries a client
    page = Page.objects.create(url="https://example.org/", domain="example.org")
    audit = Audit.objects.create(
        page=page, client="ip:127.0.0.1", status=Audit.Status.CHECKING_LINKS
    )
    LinkCheck.objects.bulk_create(
        [LinkCheck(audit=audit, url=f"https://example.net/{n}") for n in range(4)]
        + [LinkCheck(audit=audit, url="https://example.net/done", status=LinkCheck.Status.OK)]
    )
    assert admission.client_holding("ip:127.0.0.1") == 4
    assert post_audit(api, "https://example.org/a").status_code == 202  # 4 + this one = 5
    response = post_audit(api, "https://example.org/b")
    assert response.status_code == 429 and response.json()["held"] == 5


@pytest.mark.both_databases
def test_a_client_far_past_its_share_reads_as_its_share(api, settings):
    # Its audits' link checks took it there (the share refuses submissions, not checks);
    # the count stops at the share, and the refusal says the client holds it.
    settings.AUDIT_QUEUE_MAX_DEPTH = 50
    settings.AUDIT_CLIENT_MAX_SHARE = 0.1  # five entries a client
    page = Page.objects.create(url="https://example.org/", domain="example.org")
    Audit.objects.create(page=page, client="ip:127.0.0.1")
    for n in range(3):
        audit = Audit.objects.create(
            page=page, client="ip:127.0.0.1", status=Audit.Status.CHECKING_LINKS
        )
        LinkCheck.objects.bulk_create(
            LinkCheck(audit=audit, url=f"https://example.net/{n}/{m}") for m in range(20)
        )
    assert admission.client_holding("ip:127.0.0.1") == 5
    response = post_audit(api, "https://example.org/a")
    assert response.status_code == 429
    assert (response.json()["held"], response.json()["share"]) == (5, 5)
    assert admission.client_holding("ip:127.0.0.2") == 0


def test_nightly_re_audits_count_against_no_client(api, settings):
    settings.AUDIT_QUEUE_MAX_DEPTH = 10
    settings.AUDIT_CLIENT_MAX_SHARE = 0.1
    page = Page.objects.create(url="https://example.org/", domain="example.org")
    Page.objects.filter(id=page.id).update(reaudit_nightly=True)
    assert fire_placement(page.id, timezone.now().date()).client == ""
    assert admission.client_holding("") == 0
    assert post_audit(api, "https://example.org/mine").status_code == 202


def test_an_invalid_submission_is_not_counted_as_a_decision(api):
    response = api.post("/api/audits", data="{}", content_type="application/json")
    assert response.status_code == 400
    assert sum(admission_counts().values()) == 0


def test_with_no_trusted_proxy_x_forwarded_for_does_not_pick_the_bucket(api, settings):
    settings.AUDIT_SUBMIT_BURST = 1
    assert (
        post_audit(api, "https://example.org/", HTTP_X_FORWARDED_FOR="1.1.1.1").status_code == 202
    )
    assert (
        post_audit(api, "https://example.org/", HTTP_X_FORWARDED_FOR="2.2.2.2").status_code == 429
    )


def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_bucket(api, settings):
    settings.AUDIT_SUBMIT_BURST = 1
    settings.TRUSTED_PROXY_COUNT = 1
    assert (
        post_audit(api, "https://example.org/", HTTP_X_FORWARDED_FOR="1.1.1.1").status_code == 202
    )
    assert (
        post_audit(api, "https://example.org/", HTTP_X_FORWARDED_FOR="2.2.2.2").status_code == 202
    )
    # A client's own X-Forwarded-For entry left of the proxy's does not help it.
    assert (
        post_audit(api, "https://example.org/", HTTP_X_FORWARDED_FOR="9.9.9.9, 1.1.1.1").status_code
        == 429
    )


def test_when_redis_is_down_a_submission_answers_503_and_writes_nothing(api, settings):
    settings.REDIS_URL = "redis://127.0.0.1:9/0"
    response = post_audit(api, "https://example.org/")
    assert response.status_code == 503
    body = response.json()
    assert body["error"] == "admission_unavailable"
    assert "nothing was written" in body["message"]
    assert response["Retry-After"]
    assert not Audit.objects.exists() and not Page.objects.exists()


def test_the_queue_endpoint_reports_the_backlog(
    api, settings, redis_client, django_capture_on_commit_callbacks
):
    settings.AUDIT_QUEUE_MAX_DEPTH = 50
    submit_and_enqueue(api, django_capture_on_commit_callbacks, "https://example.org/1")
    redis_client.hset("unacked:audits", "tag", "a retry held until its ETA")
    # An anonymous submission does not enrol its page in the nightly re-audit; its owner does.
    Page.objects.update(reaudit_nightly=True)
    # Tonight's fan-out places that page hours ahead: scheduled, not backlog.
    fan_out(window_seconds=6 * 3600, night_tasks=NIGHT_TASKS)

    response = api.get("/api/queue")
    assert response.status_code == 200
    assert response.json() == {
        "backlog": 2,
        "waiting": 1,
        "retrying": 1,
        "running": 0,
        "scheduled": 1,
        "max_depth": 50,
        "deferred_beyond_horizon": 0,
    }


def test_queue_depth_prints_what_the_endpoint_reports(api, redis_client):
    redis_client.lpush("audits", "waiting")
    out = StringIO()
    call_command("queue_depth", stdout=out)
    printed = json.loads(out.getvalue())
    assert set(printed) == QUEUE_FIELDS
    assert printed == api.get("/api/queue").json()

    out = StringIO()
    call_command("queue_depth", "--admission", stdout=out)
    assert json.loads(out.getvalue())["admission"]["refused_backlog"] == 0


def test_the_queue_endpoint_answers_503_when_redis_is_down(api, settings):
    settings.REDIS_URL = "redis://127.0.0.1:9/0"
    response = api.get("/api/queue")
    assert response.status_code == 503
    assert response.json()["error"] == "queue_unavailable"
