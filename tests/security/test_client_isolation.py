"""Nothing of one client reaches another (issue 31, point 4): callback URLs are shown to
their submitter only, a page is its owner's (and staff's), tokens act as users, and page
ids say nothing of other pages."""

from __future__ import annotations

import json
import re
import uuid
from io import StringIO

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from rest_framework.test import APIClient

from audits.api.auth import issue_token
from audits.models import ApiToken, Audit, Page
from config.env import env_named_secrets
from devstack.demo_site import DEMO_PATHS
from tests.submitting import post_audit
from tests.webhook_helpers import SECRET
from webhooks import deliver
from webhooks.models import Delivery

pytestmark = pytest.mark.django_db

ALICE, BOB = "alice-token-0123456789", "bob-token-9876543210"
# Credentials and a token in a callback URL: what the review submitted.
CALLBACK = "http://hookuser:hookpass@hooks.example.org/hook?token=hooktoken"
SHOWN_TO_SUBMITTER = "http://hookuser:***@hooks.example.org/hook?token=hooktoken"


@pytest.fixture
def tokens(settings):
    settings.API_TOKENS = {"alice": ALICE, "bob": BOB}


def client(token: str | None = None) -> APIClient:
    api = APIClient()
    if token:
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return api


@pytest.fixture
def staff(django_user_model) -> APIClient:
    api = APIClient()
    api.force_login(django_user_model.objects.create_user("ops", password="x", is_staff=True))
    return api


def submit(api: APIClient, url: str, callback: str | None = CALLBACK) -> dict:
    body = {"url": url}
    if callback:
        body |= {"callback_url": callback, "callback_secret": SECRET}
    return post_audit(api, body, expect=202).json()


def patch(api: APIClient, page_id: str, body: dict):
    return api.patch(
        f"/api/pages/{page_id}", data=json.dumps(body), content_type="application/json"
    )


def leaks(response) -> bool:
    text = response.content.decode()
    return any(part in text for part in ("hookpass", "hooktoken", "hooks.example.org"))


def test_an_anonymous_submitters_callback_url_reaches_no_one_else(staff, settings):
    # An admin watches a page; an anonymous client (no API_TOKENS: anyone submits) audits
    # it with credentials in its callback URL.
    page_id = submit(staff, "https://watched.example/", callback=None)["page"]
    watched = {"callback_url": "https://admin.example/changed", "callback_secret": SECRET}
    assert patch(staff, page_id, watched).status_code == 200
    submitted = submit(client(), "https://watched.example/")
    assert submitted["callback_url"] == SHOWN_TO_SUBMITTER  # its own answer, password hidden
    audit_id = submitted["id"]

    # The page owner's audit.changed carries the audit's id, never the submitter's URL...
    Audit.objects.filter(id=audit_id).update(
        status=Audit.Status.SUCCEEDED, changes=[{"field": "title", "before": "A", "after": "B"}]
    )
    audit = Audit.objects.select_related("page").get(id=audit_id)
    payload = deliver.payload_for(audit, Delivery.Event.CHANGED)
    assert payload["data"]["id"] == audit_id and "callback_url" not in payload["data"]
    assert "hooks.example.org" not in json.dumps(payload)
    # ... and following that id shows it to no one: anonymous, staff, another token.
    anonymous = client().get(f"/api/audits/{audit_id}")
    assert anonymous.status_code == 200 and anonymous.json()["callback_url"] is None
    assert not leaks(anonymous)
    for response in (
        staff.get(f"/api/audits/{audit_id}"),
        staff.get("/api/audits"),
        staff.get(f"/api/pages/{page_id}"),
        staff.get("/api/pages"),
    ):
        assert response.status_code == 200 and not leaks(response)
    settings.API_TOKENS = {"alice": ALICE}
    for response in (
        client(ALICE).get(f"/api/audits/{audit_id}"),
        client(ALICE).get("/api/audits"),
    ):
        assert response.status_code == 200 and not leaks(response)


def test_another_clients_audit_of_my_page_shows_me_nothing_of_its_callback(tokens):
    alice, bob = client(ALICE), client(BOB)
    page_id = submit(alice, "https://shared.example/", callback=None)["page"]
    changed_hook = {"callback_url": "https://alice.example/changed", "callback_secret": SECRET}
    assert patch(alice, page_id, changed_hook).status_code == 200
    theirs = submit(bob, "https://shared.example/")
    assert theirs["page"] == page_id  # one page per URL; it stays Alice's
    assert theirs["callback_url"] == SHOWN_TO_SUBMITTER
    assert bob.get(f"/api/pages/{page_id}").status_code == 404
    (bobs,) = bob.get("/api/audits").json()["results"]
    assert bobs["id"] == theirs["id"] and bobs["callback_url"] == SHOWN_TO_SUBMITTER

    Audit.objects.filter(id=theirs["id"]).update(
        status=Audit.Status.SUCCEEDED, changes=[{"field": "title", "before": "A", "after": "B"}]
    )
    audit = Audit.objects.select_related("page").get(id=theirs["id"])
    payload = deliver.payload_for(audit, Delivery.Event.CHANGED)
    assert "hooks.example.org" not in json.dumps(payload)
    # Alice follows the payload's id, lists her page's audits and its history: no callback.
    read = alice.get(f"/api/audits/{payload['data']['id']}")
    assert read.status_code == 200 and read.json()["callback_url"] is None and not leaks(read)
    listed = alice.get("/api/audits")
    assert listed.json()["count"] == 2 and not leaks(listed)
    history = alice.get(f"/api/pages/{page_id}")
    assert history.json()["audits"]["count"] == 2 and not leaks(history)


def test_a_token_cannot_read_change_or_remove_another_tokens_page(tokens, django_user_model):
    alice, bob = client(ALICE), client(BOB)
    mine = submit(alice, "https://alice.example/")
    page_id = mine["page"]
    assert (
        patch(alice, page_id, {"callback_url": CALLBACK, "callback_secret": SECRET}).status_code
        == 200
    )
    page = Page.objects.get(public_id=page_id)
    assert page.owner == django_user_model.objects.get(username="alice")

    not_found = {"error": "not_found", "message": "No page with that id."}
    for response in (
        bob.get(f"/api/pages/{page_id}"),
        patch(bob, page_id, {"callback_url": "https://bob.example/", "callback_secret": SECRET}),
        patch(bob, page_id, {"reaudit_nightly": False}),
        bob.delete(f"/api/pages/{page_id}"),
    ):
        assert (response.status_code, response.json()) == (404, not_found)
    assert bob.get("/api/pages").json()["count"] == 0
    assert bob.get("/api/audits").json()["count"] == 0
    read = bob.get(f"/api/audits/{mine['id']}")
    assert read.status_code == 200 and read.json()["callback_url"] is None and not leaks(read)
    page.refresh_from_db()
    assert (page.callback_url, page.removed_at) == (CALLBACK, None)

    # Alice sees her own, password hidden.
    assert alice.get(f"/api/audits/{mine['id']}").json()["callback_url"] == SHOWN_TO_SUBMITTER
    (listed,) = alice.get("/api/audits").json()["results"]
    assert listed["callback_url"] == SHOWN_TO_SUBMITTER
    assert alice.get(f"/api/pages/{page_id}").json()["callback_url"] == SHOWN_TO_SUBMITTER
    assert alice.get("/api/pages").json()["count"] == 1
    assert alice.delete(f"/api/pages/{page_id}").status_code == 204


def test_staff_manage_every_page_but_see_only_their_own_callbacks(staff, tokens):
    alice = client(ALICE)
    page_id = submit(alice, "https://alice.example/", callback=None)["page"]
    patch(alice, page_id, {"callback_url": CALLBACK, "callback_secret": SECRET})
    # A page an anonymous submission created (before API_TOKENS was set): no owner.
    anonymous_page = Page.objects.create(
        url="https://anonymous.example/", domain="anonymous.example"
    )
    assert staff.get("/api/pages").json()["count"] == 2
    shown = staff.get(f"/api/pages/{page_id}")
    assert shown.status_code == 200 and shown.json()["callback_url"] is None and not leaks(shown)
    # An anonymous submission's page is staff's: their callback is theirs to see.
    response = patch(
        staff, str(anonymous_page.public_id), {"callback_url": CALLBACK, "callback_secret": SECRET}
    )
    assert response.json()["callback_url"] == SHOWN_TO_SUBMITTER
    assert patch(staff, page_id, {"reaudit_nightly": False}).status_code == 200


def test_page_ids_are_random_not_sequential(tokens):
    alice = client(ALICE)
    ids = [submit(alice, f"https://example.org/{n}", callback=None)["page"] for n in range(3)]
    for page_id in ids:
        assert str(uuid.UUID(page_id)) == page_id and uuid.UUID(page_id).version == 4
        assert not page_id.isdigit()
    assert len(set(ids)) == 3
    # The internal primary key is not an address.
    internal = Page.objects.get(public_id=ids[0]).id
    assert alice.get(f"/api/pages/{internal}").status_code == 404
    listed = alice.get("/api/pages").json()["results"]
    assert sorted(p["id"] for p in listed) == sorted(ids)
    assert all(p["links"]["self"].endswith(f"/api/pages/{p['id']}") for p in listed)


def test_a_token_acts_as_its_user_and_an_admin_token_is_stored_hashed(settings, django_user_model):
    settings.API_TOKENS = {"ci": "ci-secret-0123456789"}
    submit(client("ci-secret-0123456789"), "https://ci.example/", callback=None)
    ci = django_user_model.objects.get(username="ci")
    assert Page.objects.get().owner == ci and not ci.has_usable_password()

    carol = django_user_model.objects.create_user("carol")
    row, token = issue_token(carol, "deploy")
    assert token.startswith("plumb_") and len(token) > 40
    stored = ApiToken.objects.filter(id=row.id).values_list("key_hash", "prefix").get()
    assert token not in stored[0] and stored[1] == token[: len(stored[1])]
    audit = submit(client(token), "https://carol.example/", callback=None)
    assert Page.objects.get(public_id=audit["page"]).owner == carol
    assert client(token).get("/api/pages").json()["count"] == 1

    carol.is_active = False
    carol.save()
    refused = client(token).get("/api/pages")
    assert refused.status_code == 401 and refused.json()["error"] == "authentication_failed"
    row.delete()
    carol.is_active = True
    carol.save()
    assert client(token).get("/api/pages").status_code == 401


def test_a_bare_token_in_api_tokens_is_a_clear_start_up_error(monkeypatch):
    monkeypatch.setenv("API_TOKENS", "ci:fine-secret,bare-secret-value")
    with pytest.raises(ImproperlyConfigured) as refused:
        env_named_secrets("API_TOKENS")
    assert "API_TOKENS: entry 2 is not name:secret" in str(refused.value)
    assert "bare-secret-value" not in str(refused.value)
    monkeypatch.setenv("API_TOKENS", "ci:one,ci:two")
    with pytest.raises(ImproperlyConfigured, match="appears twice"):
        env_named_secrets("API_TOKENS")
    monkeypatch.setenv("API_TOKENS", " ci : sec:ret ")
    assert env_named_secrets("API_TOKENS") == {"ci": "sec:ret"}


def test_admin_tokens_alone_can_require_a_token(settings, django_user_model):
    settings.API_TOKENS = {}
    settings.API_REQUIRE_TOKEN = True
    assert (
        client()
        .post(
            "/api/audits",
            data=json.dumps({"url": "https://x.example/"}),
            content_type="application/json",
        )
        .status_code
        == 401
    )
    _, token = issue_token(django_user_model.objects.create_user("dave"), "x")
    submit(client(token), "https://x.example/", callback=None)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("configured", "owner"), [({"ci": "ci-demo-secret-012345"}, "ci"), ({}, "demo")]
)
def test_make_demo_submits_with_a_token_when_one_is_required(
    configured, owner, live_server, site, settings, redis_client
):
    settings.API_TOKENS = configured
    settings.API_REQUIRE_TOKEN = True
    call_command("demo_submit", api=live_server.url, site=site.base_url, wait=10, stdout=StringIO())
    assert Audit.objects.count() == len(DEMO_PATHS)
    assert set(Page.objects.values_list("owner__username", flat=True)) == {owner}


def test_a_token_added_in_the_admin_is_shown_once_and_kept_hashed(admin_client, django_user_model):
    erin = django_user_model.objects.create_user("erin")
    response = admin_client.post(
        "/admin/audits/apitoken/add/", {"user": erin.pk, "name": "deploy"}, follow=True
    )
    assert response.status_code == 200
    (token,) = re.findall(r"plumb_[A-Za-z0-9_-]{40,}", response.content.decode())
    row = ApiToken.objects.get()
    assert (row.user, row.name) == (erin, "deploy") and token not in row.key_hash
    # Not shown again.
    assert (
        token not in admin_client.get(f"/admin/audits/apitoken/{row.pk}/change/").content.decode()
    )
    assert token not in admin_client.get("/admin/audits/apitoken/").content.decode()
    submit(client(token), "https://erin.example/", callback=None)
    assert Page.objects.get().owner == erin


def test_the_admin_shows_no_callback_password(admin_client):
    page = Page.objects.create(
        url="https://example.org/", domain="example.org", callback_url=CALLBACK,
        callback_secret=SECRET,
    )  # fmt: skip
    audit = Audit.objects.create(page=page, task_id="t", callback_url=CALLBACK)
    delivery = Delivery.objects.create(audit=audit, url=CALLBACK, task_id="t")
    for path in (
        "/admin/audits/page/",
        f"/admin/audits/page/{page.pk}/change/",
        f"/admin/audits/audit/{audit.pk}/change/",
        "/admin/webhooks/delivery/",
        f"/admin/webhooks/delivery/{delivery.pk}/change/",
    ):
        shown = admin_client.get(path)
        assert shown.status_code == 200
        text = shown.content.decode()
        assert "hookpass" not in text and "hookuser:***@hooks.example.org" in text
