"""Pages in the API: listing, history, settings, removal, and who may call them."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from audits.models import Audit, Page
from reaudit import services as reaudit
from reaudit.models import Placement
from reaudit.tasks import NIGHT_TASKS
from tests.reaudit_factories import DAY
from tests.webhook_helpers import SECRET

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_api(django_user_model):
    client = APIClient()
    client.force_login(django_user_model.objects.create_user("ops", password="x", is_staff=True))
    return client


def make_page(url: str, *, domain: str = "example.org", **fields) -> Page:
    """A page enrolled in the nightly re-audit unless told otherwise (as staff would make it)."""
    fields.setdefault("reaudit_nightly", True)
    return Page.objects.create(url=url, domain=domain, **fields)


def make_audit(page: Page, *, minutes_ago: int = 0, **fields) -> Audit:
    audit = Audit.objects.create(page=page, task_id="t", **fields)
    created = timezone.now() - timedelta(minutes=minutes_ago)
    Audit.objects.filter(id=audit.id).update(created_at=created)
    return Audit.objects.get(id=audit.id)


def patch(api, page: Page, body, **extra):
    return api.patch(
        f"/api/pages/{page.public_id}",
        data=json.dumps(body),
        content_type="application/json",
        **extra,
    )


def test_a_page_shows_its_settings_latest_audit_and_last_change(staff_api):
    page = make_page("https://example.org/", reaudit_nightly=True)
    make_audit(page, minutes_ago=10, status=Audit.Status.SUCCEEDED, changes=None)
    changes = [{"field": "title", "before": "A", "after": "B"}]
    latest = make_audit(
        page, minutes_ago=1, status=Audit.Status.SUCCEEDED, changes=changes, trigger="reaudit"
    )
    Page.objects.filter(id=page.id).update(last_changed_at=timezone.now())

    body = staff_api.get("/api/pages").json()
    assert body["count"] == 1
    (listed,) = body["results"]
    assert listed["id"] == str(page.public_id) and listed["url"] == "https://example.org/"
    assert listed["domain"] == "example.org" and listed["reaudit_nightly"] is True
    assert listed["callback_url"] is None
    assert listed["latest_audit"]["id"] == str(latest.id)
    assert listed["latest_audit"]["status"] == "succeeded"
    assert listed["latest_audit"]["changes"] == changes
    assert listed["last_changed_at"] is not None
    assert listed["links"]["self"].endswith(f"/api/pages/{page.public_id}")
    assert set(listed) == {
        "id", "url", "domain", "reaudit_nightly", "callback_url", "latest_audit",
        "last_changed_at", "created_at", "links",
    }  # fmt: skip


def test_pages_are_paginated_and_filtered_by_domain_reaudit_and_last_change(staff_api):
    for n in range(3):
        make_page(f"https://a.example/{n}", domain="a.example")
    quiet = make_page("https://b.example/", domain="b.example", reaudit_nightly=False)
    changed = make_page("https://c.example/", domain="c.example", last_changed_at=timezone.now())

    first = staff_api.get("/api/pages?page_size=2").json()
    assert first["count"] == 5 and len(first["results"]) == 2
    assert "page=2" in first["next"] and first["previous"] is None
    assert staff_api.get("/api/pages?page=3&page_size=2").json()["results"][0]["url"] == (
        "https://c.example/"
    )

    by_domain = staff_api.get("/api/pages?domain=A.example").json()
    assert [p["url"] for p in by_domain["results"]] == [f"https://a.example/{n}" for n in range(3)]
    # A host is one domain however it is spelled: its case, its root's trailing dot.
    assert staff_api.get("/api/pages?domain=A.EXAMPLE.").json()["results"] == by_domain["results"]
    not_nightly = staff_api.get("/api/pages?reaudit_nightly=false").json()["results"]
    assert [p["id"] for p in not_nightly] == [str(quiet.public_id)]
    assert staff_api.get("/api/pages?reaudit_nightly=true").json()["count"] == 4
    since = (timezone.now() - timedelta(hours=1)).isoformat()
    recent = staff_api.get("/api/pages", {"changed_since": since}).json()["results"]
    assert [p["id"] for p in recent] == [str(changed.public_id)]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("reaudit_nightly=yes", "reaudit_nightly"),
        ("page_size=0", "page_size"),
        ("page=-1", "page"),
        ("changed_since=yesterday", "changed_since"),
        ("colour=red", "colour"),
    ],
)
def test_a_bad_filter_is_a_400_naming_it(staff_api, query, field):
    response = staff_api.get(f"/api/pages?{query}")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"
    assert field in response.json()["fields"]


def test_a_page_lists_its_audits_newest_first_paginated(staff_api):
    page = make_page("https://example.org/")
    audits = [make_audit(page, minutes_ago=10 - n) for n in range(3)]
    make_audit(make_page("https://example.org/other"))

    body = staff_api.get(f"/api/pages/{page.public_id}?page_size=2").json()
    assert body["id"] == str(page.public_id)
    assert body["latest_audit"]["id"] == str(audits[2].id)
    history = body["audits"]
    assert history["count"] == 3
    assert [a["id"] for a in history["results"]] == [str(audits[2].id), str(audits[1].id)]
    assert history["results"][0]["page"] == str(page.public_id)
    older = staff_api.get(history["next"]).json()["audits"]
    assert [a["id"] for a in older["results"]] == [str(audits[0].id)]


@pytest.mark.parametrize(
    "page_id",
    [
        "424242",
        "nope",
        "-1",
        "0",
        "99999999999999999999999",
        "0b6f4a4e-8d1c-4c39-9b5e-2f1f3c1d9a77",
    ],
)
def test_an_unknown_page_is_a_json_404(staff_api, page_id):
    for response in (
        staff_api.get(f"/api/pages/{page_id}"),
        staff_api.patch(f"/api/pages/{page_id}", data="{}", content_type="application/json"),
        staff_api.delete(f"/api/pages/{page_id}"),
    ):
        assert response.status_code == 404
        assert response.json() == {"error": "not_found", "message": "No page with that id."}


def test_pages_need_a_token_or_a_staff_login(django_user_model, settings):
    page = make_page("https://example.org/")
    anonymous = APIClient()
    for response in (
        anonymous.get("/api/pages"),
        anonymous.get(f"/api/pages/{page.public_id}"),
        patch(anonymous, page, {"reaudit_nightly": False}),
        anonymous.delete(f"/api/pages/{page.public_id}"),
    ):
        assert response.status_code == 401
        assert response.json()["error"] == "not_authenticated"
        assert response["WWW-Authenticate"] == 'Bearer realm="plumb"'

    member = APIClient()
    member.force_login(django_user_model.objects.create_user("member", password="x"))
    response = member.get("/api/pages")
    assert response.status_code == 403
    assert response.json() == {
        "error": "permission_denied",
        "message": "This needs an API token or a staff login.",
    }

    settings.API_TOKENS = {"ci": "s3cret-token"}
    token = APIClient()
    token.credentials(HTTP_AUTHORIZATION="Bearer s3cret-token")
    # An anonymous submission's page is staff's to manage, not any token's.
    assert token.get("/api/pages").json()["count"] == 0
    assert patch(token, page, {"reaudit_nightly": False}).status_code == 404
    Page.objects.filter(id=page.id).update(owner=django_user_model.objects.get(username="ci"))
    assert token.get("/api/pages").json()["count"] == 1
    assert patch(token, page, {"reaudit_nightly": False}).status_code == 200
    assert Page.objects.get().reaudit_nightly is False


def test_a_page_callback_is_set_shown_without_its_secret_and_removed(staff_api, admin_client):
    page = make_page("https://example.org/")
    response = patch(
        staff_api,
        page,
        {"callback_url": "HTTPS://Hooks.Example.org/changed", "callback_secret": SECRET},
    )
    assert response.status_code == 200, response.content
    assert response.json()["callback_url"] == "https://hooks.example.org/changed"
    stored = Page.objects.get()
    assert (stored.callback_url, stored.callback_secret) == (
        "https://hooks.example.org/changed",
        SECRET,
    )
    admin_page = admin_client.get(f"/admin/audits/page/{page.id}/change/")
    assert "https://hooks.example.org/changed" in admin_page.content.decode()
    for shown in (
        response,
        staff_api.get("/api/pages"),
        staff_api.get(f"/api/pages/{page.public_id}"),
        admin_page,
        admin_client.get("/admin/audits/page/"),
    ):
        assert shown.status_code == 200
        assert SECRET not in shown.content.decode()

    response = patch(staff_api, page, {"callback_url": None, "callback_secret": None})
    assert response.status_code == 200 and response.json()["callback_url"] is None
    assert (Page.objects.get().callback_url, Page.objects.get().callback_secret) == ("", "")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"reaudit_nightly": "false"}, "reaudit_nightly"),
        ({"reaudit_nightly": 0}, "reaudit_nightly"),
        ({"reaudit_nightly": None}, "reaudit_nightly"),
        ({"callback_url": "ftp://hooks.example.org/", "callback_secret": SECRET}, "callback_url"),
        ({"callback_url": "https://hooks.example.org/"}, "callback_secret"),
        ({"callback_secret": SECRET}, "callback_url"),
        ({"callback_url": "https://h.example.org/", "callback_secret": "hunter2"}, "callback_secret"),
        ({"callback_url": "https://h.example.org/", "callback_secret": None}, "callback_secret"),
        ({"callback_url": None, "callback_secret": SECRET}, "callback_url"),
        ({"reaudit_nightly": False, "url": "https://elsewhere.example/"}, "url"),
        (["reaudit_nightly"], "non_field_errors"),
    ],
)  # fmt: skip
def test_a_bad_update_names_the_field_and_changes_nothing(staff_api, body, field):
    page = make_page("https://example.org/", reaudit_nightly=True)
    response = patch(staff_api, page, body)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"
    assert field in response.json()["fields"]
    assert "hunter2" not in response.content.decode()  # a refused secret is not echoed
    stored = Page.objects.get()
    assert (stored.reaudit_nightly, stored.callback_url, stored.callback_secret) == (True, "", "")


def test_a_malformed_or_oversized_update_is_refused_as_json(staff_api, settings):
    page = make_page("https://example.org/")
    response = staff_api.patch(
        f"/api/pages/{page.public_id}", data="{", content_type="application/json"
    )
    assert response.status_code == 400 and response.json()["error"] == "malformed_json"
    response = staff_api.patch(
        f"/api/pages/{page.public_id}", data="x=1", content_type="text/plain"
    )
    assert response.status_code == 415 and response.json()["error"] == "unsupported_media_type"
    big = {"reaudit_nightly": False, "pad": "x" * settings.API_MAX_BODY_BYTES}
    assert patch(staff_api, page, big).status_code == 413
    assert Page.objects.get().reaudit_nightly is True


def test_deleting_a_page_stops_its_reaudits_and_keeps_its_history(staff_api, redis_client):
    page = make_page(
        "https://example.org/", callback_url="https://h.example/", callback_secret=SECRET
    )
    kept = make_page("https://example.org/kept")
    audit = make_audit(page, status=Audit.Status.SUCCEEDED)

    response = staff_api.delete(f"/api/pages/{page.public_id}")
    assert response.status_code == 204 and response.content == b""
    assert staff_api.get(f"/api/pages/{page.public_id}").status_code == 404
    assert staff_api.delete(f"/api/pages/{page.public_id}").status_code == 404
    assert [p["id"] for p in staff_api.get("/api/pages").json()["results"]] == [str(kept.public_id)]
    # Its audits stay readable by id, and the page callback is gone.
    assert staff_api.get(f"/api/audits/{audit.id}").json()["page"] == str(page.public_id)
    removed = Page.objects.get(id=page.id)
    assert (removed.reaudit_nightly, removed.callback_url, removed.callback_secret) == (
        False,
        "",
        "",
    )

    # Tonight's fan-out places only the page that is left.
    reaudit.fan_out(DAY, night_tasks=NIGHT_TASKS, window_seconds=600, slice_seconds=600)
    assert list(Placement.objects.values_list("page_id", flat=True)) == [kept.id]


def test_a_placement_made_before_the_delete_creates_no_audit(staff_api, redis_client):
    page = make_page("https://example.org/")
    reaudit.fan_out(DAY, night_tasks=NIGHT_TASKS, window_seconds=600, slice_seconds=600)
    staff_api.delete(f"/api/pages/{page.public_id}")
    assert reaudit.fire_placement(page.id, DAY) is None
    assert not Audit.objects.exists()


def test_a_removed_page_submitted_again_comes_back_with_its_history(staff_api, settings):
    settings.REAUDIT_NEW_PAGES = True
    page = make_page("https://example.org/")
    old = make_audit(page)
    staff_api.delete(f"/api/pages/{page.public_id}")
    response = staff_api.post(
        "/api/audits",
        data=json.dumps({"url": "https://example.org/"}),
        content_type="application/json",
    )
    assert response.status_code == 202 and response.json()["page"] == str(page.public_id)
    body = staff_api.get(f"/api/pages/{page.public_id}").json()
    assert body["reaudit_nightly"] is True
    assert str(old.id) in [a["id"] for a in body["audits"]["results"]]
