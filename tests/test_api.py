"""The HTTP API: what a client sends and what it gets back."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from audits.models import Audit, Page
from tests.submitting import post_audit

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return APIClient()


@pytest.fixture
def staff_api(django_user_model):
    client = APIClient()
    client.force_login(django_user_model.objects.create_user("ops", password="x", is_staff=True))
    return client


def test_a_submission_is_accepted_and_queued(api, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        response = post_audit(api, {"url": "https://Example.org"})
    assert response.status_code == 202
    body = response.json()
    assert body["url"] == "https://example.org/"
    assert body["status"] == "queued"
    assert body["trigger"] == "submitted"
    assert body["links"]["self"].endswith(f"/api/audits/{body['id']}")
    assert response["Location"] == body["links"]["self"]
    assert set(body) == {
        "id", "url", "page", "status", "trigger", "attempts", "created_at", "started_at",
        "finished_at", "result", "changes", "got_worse", "error", "callback_url", "links",
    }  # fmt: skip
    assert body["page"] == str(Page.objects.get().public_id)
    assert body["changes"] is None and body["got_worse"] is False
    assert len(callbacks) == 1  # the enqueue waits for the commit
    # Anyone may submit: an anonymous submission's cost ends with its audit.
    assert Page.objects.get().reaudit_nightly is False


def test_only_a_trusted_caller_enrols_a_new_page_in_the_nightly_reaudit(api, staff_api, settings):
    settings.REAUDIT_NEW_PAGES = True
    # Without API_TOKENS anyone submits; with them a submission needs a token.
    settings.API_TOKENS = {}
    assert post_audit(api, {"url": "https://anonymous.example/"}).status_code == 202
    assert post_audit(staff_api, {"url": "https://staff.example/"}).status_code == 202
    settings.API_TOKENS = {"ci": "t0ken"}
    token = post_audit(api, {"url": "https://token.example/"}, HTTP_AUTHORIZATION="Bearer t0ken")
    assert token.status_code == 202
    enrolled = dict(Page.objects.values_list("domain", "reaudit_nightly"))
    assert enrolled == {"anonymous.example": False, "staff.example": True, "token.example": True}
    # An anonymous submission of an enrolled page changes nothing.
    settings.API_TOKENS = {}
    assert post_audit(api, {"url": "https://staff.example/"}).status_code == 202
    assert Page.objects.get(domain="staff.example").reaudit_nightly is True


def test_reaudit_new_pages_off_enrols_no_page(staff_api, settings):
    settings.REAUDIT_NEW_PAGES = False
    assert post_audit(staff_api, {"url": "https://staff.example/"}).status_code == 202
    assert Page.objects.get().reaudit_nightly is False


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "url"),
        ({"url": "ftp://example.org/"}, "url"),
        ({"url": "not a url"}, "url"),
        ({"url": 42}, "url"),
        ({"url": "https://example.org/", "colour": "red"}, "colour"),
        ({"url": "https://example.org/" + "a" * 5000}, "url"),
        ({"url": ""}, "url"),
        ({"url": " https://example.org/"}, "url"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(api, body, field):
    response = post_audit(api, body)
    assert response.status_code == 400
    payload = response.json()
    assert payload["error"] == "invalid_request"
    assert field in payload["fields"]
    assert not Audit.objects.exists() and not Page.objects.exists()


def test_malformed_json_is_a_json_400(api):
    response = api.post("/api/audits", data="{nope", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == "malformed_json"


def test_non_utf8_is_a_json_400(api):
    response = api.post("/api/audits", data=b'{"url": "\xff\xfe"}', content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == "malformed_json"


def test_a_body_over_the_limit_is_refused(api, settings):
    body = {"url": "https://example.org/", "pad": "x" * (settings.API_MAX_BODY_BYTES + 10)}
    response = post_audit(api, body)
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"
    assert not Audit.objects.exists()


def test_deep_json_is_refused(api):
    response = api.post(
        "/api/audits", data="[" * 100_000 + "]" * 100_000, content_type="application/json"
    )
    assert response.status_code in (400, 413)
    assert "error" in response.json()


def test_an_audit_is_read_by_its_id(api):
    created = post_audit(api, {"url": "https://example.org/a"}).json()
    response = api.get(f"/api/audits/{created['id']}")
    assert response.status_code == 200
    assert response.json() == created


@pytest.mark.parametrize("audit_id", ["6f1f5b8e-0000-4000-8000-000000000000", "nope"])
def test_an_unknown_audit_is_a_json_404(api, audit_id):
    response = api.get(f"/api/audits/{audit_id}")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


def test_the_list_is_newest_first_filtered_and_paginated(api, staff_api):
    ids = [post_audit(api, {"url": f"https://example.org/{n}"}).json()["id"] for n in range(5)]
    Audit.objects.filter(id=ids[0]).update(status=Audit.Status.FAILED)
    api = staff_api

    page_one = api.get("/api/audits?page_size=2").json()
    assert page_one["count"] == 5
    assert [a["id"] for a in page_one["results"]] == [ids[4], ids[3]]
    assert page_one["previous"] is None and "page=2" in page_one["next"]

    failed = api.get("/api/audits?status=failed").json()
    assert [a["id"] for a in failed["results"]] == [ids[0]]
    assert api.get("/api/audits?trigger=reaudit").json()["count"] == 0


def test_a_bad_filter_names_the_field(staff_api):
    response = staff_api.get("/api/audits?status=exploded")
    assert response.status_code == 400
    assert "status" in response.json()["fields"]


def test_the_schema_is_served(api):
    response = api.get("/api/schema", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert "/api/audits" in response.content.decode()


def test_healthz_reports_database_and_redis(api):
    response = api.get("/healthz")
    assert response.status_code == 200
    assert response.json()["checks"] == {"database": "ok", "redis": "ok"}


def test_healthz_is_503_when_redis_is_down(api, settings):
    settings.REDIS_URL = "redis://127.0.0.1:9/0"
    response = api.get("/healthz")
    assert response.status_code == 503
    assert response.json()["checks"]["redis"].startswith("error")


def test_listing_audits_needs_a_staff_login_or_a_token(api):
    post_audit(api, {"url": "https://example.org/"})
    response = api.get("/api/audits")
    assert response.status_code == 401
    assert response.json()["error"] == "not_authenticated"


def test_with_api_tokens_set_every_audit_call_needs_one(api, settings):
    settings.API_TOKENS = {"ci": "s3cret-token"}
    assert post_audit(api, {"url": "https://example.org/"}).status_code == 401
    assert (
        post_audit(
            api, {"url": "https://example.org/"}, HTTP_AUTHORIZATION="Bearer wrong"
        ).status_code
        == 401
    )
    created = post_audit(
        api, {"url": "https://example.org/"}, HTTP_AUTHORIZATION="Bearer s3cret-token"
    )
    assert created.status_code == 202
    assert api.get(f"/api/audits/{created.json()['id']}").status_code == 401
    api.credentials(HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert api.get(f"/api/audits/{created.json()['id']}").status_code == 200
    assert api.get("/api/audits").json()["count"] == 1
    assert Audit.objects.count() == 1


def test_an_audit_shows_what_changed_since_the_pages_previous_audit(api):
    page = Page.objects.create(url="https://example.org/", domain="example.org")
    changes = [{"field": "noindex", "before": False, "after": True}]
    audit = Audit.objects.create(
        page=page, status=Audit.Status.SUCCEEDED, changes=changes, got_worse=True
    )
    body = api.get(f"/api/audits/{audit.id}").json()
    assert body["changes"] == changes and body["got_worse"] is True
    assert body["page"] == str(page.public_id)
