"""A submission's rows (audits.submission.submit_audit): its page created, kept or brought
back, its audit queued, and its message published only once the row is committed.

The same tests run on either database (DATABASE_URL): PostgreSQL writes both rows in one
statement, SQLite in two within one transaction."""

from __future__ import annotations

import threading

import pytest
import redis
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audits import submission
from audits.models import Audit, Page
from audits.tasks import run_audit
from outbound.urls import normalize_url

pytestmark = pytest.mark.both_databases

URL = "https://example.org/page"


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password="x")


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob", password="x")


@pytest.fixture(autouse=True)
def _new_pages_reaudited(settings):
    settings.REAUDIT_NEW_PAGES = True


def submit(url: str = URL, **options) -> Audit:
    return submission.submit_audit(normalize_url(url), **options)


def as_stored(page: Page) -> list:
    return [getattr(page, field.attname) for field in submission.PAGE_FIELDS]


def seen_from_another_connection(audit_id) -> bool:
    """Whether a worker, on its own connection, would find the audit's row."""
    seen = []

    def look() -> None:
        try:
            seen.append(Audit.objects.filter(id=audit_id).exists())
        finally:
            connection.close()

    thread = threading.Thread(target=look)
    thread.start()
    thread.join()
    return seen == [True]


@pytest.mark.django_db
def test_a_new_page_and_its_audit_are_stored_as_returned(alice):
    audit = submit(
        trusted=True,
        submitter=alice,
        client=f"user:{alice.pk}",
        callback_url="https://hooks.example/done",
        callback_secret="s3cret",
    )
    stored = Audit.objects.select_related("page").get()
    assert stored.id == audit.id and stored.task_id == audit.task_id
    assert (stored.status, stored.trigger) == (Audit.Status.QUEUED, Audit.Trigger.SUBMITTED)
    assert (stored.client, stored.submitter) == (f"user:{alice.pk}", alice)
    assert (stored.callback_url, stored.callback_secret) == ("https://hooks.example/done", "s3cret")
    assert stored.created_at == audit.created_at
    assert as_stored(audit.page) == as_stored(stored.page)
    assert (stored.page.url, stored.page.domain) == (URL, "example.org")
    assert stored.page.owner == alice and stored.page.reaudit_nightly is True


@pytest.mark.django_db
def test_an_existing_page_keeps_its_choice_and_its_owner(alice, bob):
    first = submit(trusted=True, submitter=alice)
    anonymous = submit()
    trusted_other = submit(trusted=True, submitter=bob)
    page = Page.objects.get()
    for audit in (first, anonymous, trusted_other):
        assert as_stored(audit.page) == as_stored(page)
    assert page.owner == alice and page.reaudit_nightly is True
    assert Audit.objects.filter(page=page).count() == 3
    # And the other way round: an anonymous page stays anonymous and off the night.
    anonymous_first = submit("https://example.org/other")
    submit("https://example.org/other", trusted=True, submitter=bob)
    kept = Page.objects.get(id=anonymous_first.page.id)
    assert kept.owner is None and kept.reaudit_nightly is False


@pytest.mark.django_db
def test_a_removed_page_comes_back_with_its_history_as_its_new_submitter_chose(alice, bob):
    first = submit(trusted=True, submitter=alice)
    Page.objects.filter(id=first.page.id).update(removed_at=timezone.now())
    again = submit(submitter=bob)
    page = Page.objects.get()
    assert page.id == first.page.id and page.public_id == first.page.public_id
    assert page.removed_at is None and page.owner == bob and page.reaudit_nightly is False
    assert as_stored(again.page) == as_stored(page)
    assert set(Audit.objects.filter(page=page).values_list("id", flat=True)) == {
        first.id,
        again.id,
    }
    # The page alone (a test's or a script's way in) brings it back the same way.
    Page.objects.filter(id=page.id).update(removed_at=timezone.now())
    back = submission.get_or_create_page(normalize_url(URL), reaudit_nightly=True, owner=alice)
    page.refresh_from_db()
    assert as_stored(back) == as_stored(page)
    assert page.removed_at is None and page.owner == alice and page.reaudit_nightly is True


@pytest.mark.django_db
def test_a_submission_writes_its_rows_in_one_statement_on_postgresql_three_on_sqlite():
    # Its client's holding, its page and its audit.
    submit("https://example.org/known", client="ip:192.0.2.1")
    for url in (URL, "https://example.org/known"):
        with CaptureQueriesContext(connection) as queries:
            submit(url, client="ip:192.0.2.1")
        # The test's own transaction makes SQLite's a savepoint.
        statements = [
            query["sql"]
            for query in queries.captured_queries
            if not query["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))
        ]
        assert len(statements) == (1 if connection.vendor == "postgresql" else 3), statements


@pytest.mark.django_db
def test_a_client_holding_its_share_gets_nothing_written(settings):
    settings.AUDIT_QUEUE_MAX_DEPTH, settings.AUDIT_CLIENT_MAX_SHARE = 20, 0.1  # two each
    for n in range(2):
        submit(f"https://example.org/{n}", client="ip:192.0.2.1")
    with pytest.raises(submission.ClientShareHeld) as refused:
        submit("https://example.org/refused", client="ip:192.0.2.1")
    assert refused.value.held == 2
    assert not Page.objects.filter(url="https://example.org/refused").exists()
    assert Audit.objects.count() == 2
    # Another client has its own share; the system's own work ("") holds none.
    submit("https://example.org/other", client="ip:192.0.2.2")
    for n in range(3):
        submit(f"https://example.org/night/{n}")
    # Once its audits finish, the client holds nothing.
    Audit.objects.filter(client="ip:192.0.2.1").update(status=Audit.Status.SUCCEEDED)
    submit("https://example.org/refused", client="ip:192.0.2.1")


@pytest.mark.django_db(transaction=True)
def test_the_message_goes_out_only_once_a_worker_can_see_its_row(monkeypatch):
    published = []
    monkeypatch.setattr(
        submission,
        "enqueue_audit",
        lambda audit: published.append(seen_from_another_connection(audit.id)),
    )
    submit()
    assert published == [True]
    # Inside a caller's transaction: not before that commits.
    with transaction.atomic():
        submit("https://example.org/in-a-transaction")
        assert published == [True]
    assert published == [True, True]


@pytest.mark.django_db(transaction=True)
def test_a_publish_that_fails_leaves_the_audit_queued_for_the_reconciler(monkeypatch):
    def broker_away(*args, **kwargs):
        raise redis.ConnectionError("the broker is away")

    monkeypatch.setattr(run_audit, "apply_async", broker_away)
    audit = submit()
    stored = Audit.objects.get()
    assert stored.id == audit.id and stored.status == Audit.Status.QUEUED
    assert stored.task_id == audit.task_id


@pytest.mark.django_db(transaction=True)
def test_racing_submissions_of_one_new_page_make_one_page_and_an_audit_each():
    racers = 8
    start = threading.Barrier(racers)
    pages = []

    def race() -> None:
        try:
            start.wait()
            pages.append(submit().page.id)
        finally:
            connection.close()

    threads = [threading.Thread(target=race) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    page = Page.objects.get()
    assert pages == [page.id] * racers
    assert Audit.objects.filter(page=page).count() == racers
