"""`audit.changed`: a page callback hears of every audit of its page that found a change."""

from __future__ import annotations

import base64

import pytest
from standardwebhooks.webhooks import Webhook

from audits import pages, submission
from audits.models import Audit, Page
from outbound.urls import normalize_url
from tests.changing_page import ChangingPage
from tests.receiver import Receiver
from tests.webhook_helpers import SECRET, start_webhooks_worker
from tests.workers import wait_for
from webhooks import deliver, tasks
from webhooks.models import Delivery

PAGE_SECRET = "whsec_" + base64.b64encode(b"plumb-page-secret-0123456789abcd").decode()


@pytest.fixture
def changing_page(http_server):
    return http_server(ChangingPage())


@pytest.fixture
def receiver(http_server):
    return lambda: http_server(Receiver())


def reaudit(page: Page) -> Audit:
    """A nightly re-audit of the page, as a placement creates it, run by the worker."""
    audit, _ = submission.create_and_enqueue_audit(page, trigger=Audit.Trigger.REAUDIT)
    return audit


def finished(audit: Audit) -> Audit:
    wait_for(lambda: Audit.objects.get(id=audit.id).is_finished, timeout=30, message="the audit")
    return Audit.objects.get(id=audit.id)


@pytest.mark.slow
def test_a_nightly_reaudit_that_found_a_change_is_posted_to_the_page_callback_signed(
    changing_page, receiver, start_worker
):
    page_hook, submission_hook = receiver(), receiver()
    start_worker("audits")
    start_webhooks_worker(start_worker)
    page = submission.get_or_create_page(normalize_url(changing_page.url))
    pages.update(page, callback_url=page_hook.url, callback_secret=PAGE_SECRET)

    first = finished(reaudit(page))
    unchanged = finished(reaudit(page))
    assert (first.changes, unchanged.changes) == (None, [])
    changing_page.state.title = "Home, renamed"
    changed = finished(reaudit(page))
    assert changed.status == "succeeded" and changed.changes

    wait_for(lambda: page_hook.count(200) == 1, timeout=30, message="audit.changed")
    (request,) = page_hook.requests
    payload = Webhook(PAGE_SECRET).verify(request.body, request.headers)
    assert payload["type"] == "audit.changed"
    assert payload["data"]["id"] == str(changed.id)
    assert payload["data"]["trigger"] == "reaudit"
    assert payload["data"]["page"] == str(page.public_id)
    assert payload["data"]["changes"] == [
        {"field": "title", "before": "Home", "after": "Home, renamed"}
    ]
    assert PAGE_SECRET not in request.body.decode()
    # Nothing for the first audit (nothing to compare) nor the unchanged one: the worker ran
    # them, and their signals, before the changed one.
    assert list(Delivery.objects.values_list("audit_id", "event")) == [
        (changed.id, "audit.changed")
    ]

    # A submission with its own callback: audit.finished there, audit.changed to the page's.
    changing_page.state.noindex = True
    submitted = submission.submit_audit(
        normalize_url(changing_page.url),
        callback_url=submission_hook.url,
        callback_secret=SECRET,
    )
    wait_for(lambda: submission_hook.count(200) == 1, timeout=30, message="audit.finished")
    wait_for(lambda: page_hook.count(200) == 2, timeout=30, message="the second audit.changed")
    finished_payload = Webhook(SECRET).verify(
        submission_hook.requests[0].body, submission_hook.requests[0].headers
    )
    assert finished_payload["type"] == "audit.finished"
    assert finished_payload["data"]["id"] == str(submitted.id)
    assert finished_payload["data"]["changes"][0]["field"] == "noindex"
    changed_payload = Webhook(PAGE_SECRET).verify(
        page_hook.requests[1].body, page_hook.requests[1].headers
    )
    assert changed_payload["type"] == "audit.changed"
    assert changed_payload["data"]["id"] == str(submitted.id)
    # The submitter's callback URL is theirs: the page's owner does not hear of it.
    assert submission_hook.url not in page_hook.requests[1].body.decode()
    assert changed_payload["data"]["got_worse"] is True
    assert page_hook.requests[1].webhook_id != submission_hook.requests[0].webhook_id


@pytest.mark.django_db
def test_a_change_found_after_the_page_callback_moved_is_not_sent_to_the_old_address(
    receiver, redis_client
):
    hook = receiver()
    page = Page.objects.create(url="https://example.org/", domain="example.org")
    pages.update(page, callback_url=hook.url, callback_secret=PAGE_SECRET)
    audit = Audit.objects.create(
        page=page,
        status=Audit.Status.SUCCEEDED,
        changes=[{"field": "h1_count", "before": 1, "after": 2}],
    )
    delivery, created = deliver.create_change_delivery(audit.id)
    assert created and delivery.url == hook.url and delivery.event == "audit.changed"
    assert deliver.create_change_delivery(audit.id) == (delivery, False)  # one per audit

    pages.update(page, callback_url=None, callback_secret=None)
    assert deliver.run_delivery(str(delivery.id)) == deliver.Outcome.GONE
    assert hook.count() == 0
    delivery.refresh_from_db()
    assert delivery.status == "failed" and "page callback" in delivery.last_error


@pytest.mark.django_db
def test_no_change_delivery_without_changes_or_without_a_page_callback(
    django_capture_on_commit_callbacks,
):
    page = Page.objects.create(url="https://example.org/", domain="example.org")
    unchanged = Audit.objects.create(page=page, status=Audit.Status.SUCCEEDED, changes=[])
    first = Audit.objects.create(page=page, status=Audit.Status.SUCCEEDED, changes=None)
    with django_capture_on_commit_callbacks(execute=True):
        for audit in (unchanged, first):
            assert tasks.schedule_change_delivery(audit_id=audit.id) is None
    pages.update(page, callback_url="https://hooks.example.org/", callback_secret=PAGE_SECRET)
    with django_capture_on_commit_callbacks(execute=False):
        for audit in (unchanged, first):
            assert tasks.schedule_change_delivery(audit_id=audit.id) is None
    changed = Audit.objects.create(
        page=page, status=Audit.Status.SUCCEEDED, changes=[{"field": "title"}]
    )
    pages.remove(page)  # a removed page has no callback any more
    assert tasks.schedule_change_delivery(audit_id=changed.id) is None
    assert not Delivery.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("event", ["audit.finished", "audit.changed"])
def test_no_payload_carries_a_callback_url(event):
    """An anonymous submitter's callback URL (with its user, password and token) once
    travelled in `data` of the `audit.changed` sent to the page's owner."""
    page = Page.objects.create(url="https://example.org/", domain="example.org")
    pages.update(page, callback_url="https://owner.example/hook", callback_secret=PAGE_SECRET)
    secret_url = "https://someone:hunter2@hooks.example.net/plumb?token=t0ken"
    audit = Audit.objects.create(
        page=page, status=Audit.Status.SUCCEEDED,
        changes=[{"field": "title", "before": "a", "after": "b"}],
        callback_url=secret_url, callback_secret=SECRET,
    )  # fmt: skip
    payload = deliver.payload_for(audit, event)
    assert "callback_url" not in payload["data"]
    text = str(payload)
    assert "hooks.example.net" not in text and "hunter2" not in text and "t0ken" not in text
    assert payload["data"]["id"] == str(audit.id)


@pytest.mark.django_db
def test_the_payload_carries_the_findings():
    from audits.findings import CHECK_IDS, finding

    page = Page.objects.create(url="https://example.org/", domain="example.org")
    findings = [finding(check, "pass") for check in CHECK_IDS]
    audit = Audit.objects.create(
        page=page, status=Audit.Status.SUCCEEDED, result={"status_code": 200, "findings": findings},
        changes=[{"field": "failing_checks", "before": [], "after": ["viewport"],
                  "added": ["viewport"], "removed": []}],
    )  # fmt: skip
    payload = deliver.payload_for(audit, "audit.changed")
    assert payload["data"]["result"]["findings"] == findings
    assert payload["data"]["changes"][0]["added"] == ["viewport"]
