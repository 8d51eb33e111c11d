"""Every succeeded audit stores what changed since the page's previous one, once, as it finishes."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audits import linkcheck, services, submission
from audits.changes import failing_checks
from audits.models import NO_PREVIOUS_SUCCESS, Audit, Page
from jobs.errors import Transient
from outbound.urls import normalize_url
from tests.changing_page import SECURITY_HEADERS, ChangingPage
from webhooks.models import Delivery

pytestmark = pytest.mark.django_db


@pytest.fixture
def changing_page(http_server):
    return http_server(ChangingPage())


def audit_now(url: str, *, trigger: str = Audit.Trigger.SUBMITTED, callback_url: str = "") -> Audit:
    """Run an audit of `url` to the end here: the page fetch, then each link check."""
    page = submission.get_or_create_page(normalize_url(url))
    audit = Audit.objects.create(page=page, task_id="t", trigger=trigger,
                                 callback_url=callback_url, callback_secret="")  # fmt: skip
    for queued in services.execute_audit(str(audit.id)):
        audit.refresh_from_db()
        assert audit.status == Audit.Status.CHECKING_LINKS
        assert audit.changes is None  # not before the link checks have said what is broken
        try:
            linkcheck.run_shared_check(queued.shared_link_id, queued.task_id)
        except Transient:  # a broken answer is checked once more before it is recorded
            linkcheck.run_shared_check(queued.shared_link_id, queued.task_id)
    audit.refresh_from_db()
    assert audit.status == Audit.Status.SUCCEEDED
    return audit


def fields(audit: Audit) -> dict:
    return {change["field"]: change for change in audit.changes}


def test_first_audit_has_null_then_unchanged_is_empty_then_each_change_is_listed(
    changing_page, site, redis_client
):
    changing_page.state.links = [f"{site.base_url}/"]
    first = audit_now(changing_page.url)
    assert first.changes is None and first.got_worse is False

    second = audit_now(changing_page.url)
    assert second.changes == []  # timings differ every time; they are not changes
    assert second.result["total_ms"] is not None
    assert Page.objects.get().last_changed_at is None

    changing_page.state.title = "Home, renamed"
    changing_page.state.noindex = True
    changing_page.state.headers.pop("Referrer-Policy")
    changing_page.state.links = [f"{site.base_url}/", f"{site.base_url}/missing"]
    third = audit_now(changing_page.url)
    changed = fields(third)
    assert set(changed) == {
        "title", "noindex", "missing_security_headers", "broken_links", "failing_checks",
    }  # fmt: skip
    # noindex in every robots meta: the page is no longer crawlable (result.findings).
    assert changed["failing_checks"]["added"] == ["is-crawlable"]
    assert "is-crawlable" in Page.objects.get().failing_checks
    assert changed["title"] == {"field": "title", "before": "Home", "after": "Home, renamed"}
    assert changed["noindex"]["after"] is True
    assert changed["missing_security_headers"]["added"] == ["referrer-policy"]
    assert changed["broken_links"]["added"] == [f"{site.base_url}/missing"]
    assert third.got_worse is True
    assert Page.objects.get().last_changed_at == third.finished_at

    # Fixed again: the header is back and the broken link gone; a recovery is not worse.
    changing_page.state.headers = dict(SECURITY_HEADERS)
    changing_page.state.links = [f"{site.base_url}/"]
    fourth = audit_now(changing_page.url)
    assert fields(fourth)["broken_links"]["removed"] == [f"{site.base_url}/missing"]
    assert fields(fourth)["missing_security_headers"]["removed"] == ["referrer-policy"]
    assert fourth.got_worse is False


@pytest.mark.both_databases
def test_a_page_s_first_success_writes_its_page_s_failing_checks_in_its_finish_s_one_query(
    changing_page, redis_client
):
    changing_page.state.noindex = True
    with CaptureQueriesContext(connection) as queries:
        first = audit_now(changing_page.url)
    assert first.changes is None and first.got_worse is False
    assert "is-crawlable" in failing_checks(first.result)
    assert Page.objects.get().failing_checks == sorted(failing_checks(first.result))
    if connection.vendor == "postgresql":
        # The claim read that the page had no success: nothing reads it again, and the
        # finish is the page's lock and then one statement, its page's update alongside
        # (sent together: jobs.sql.pipelines).
        sql = [q["sql"] for q in queries]
        assert not [q for q in sql if q.startswith('SELECT "audits_audit"."result"')]
        (finish,) = [n for n, q in enumerate(sql) if 'UPDATE "audits_page"' in q]
        assert sql[finish].startswith('WITH finished AS (UPDATE "audits_audit"')
        assert sql[finish - 1].startswith('SELECT 1 FROM "audits_page"')
        assert sql[finish - 1].endswith("FOR UPDATE")


@pytest.mark.both_databases
def test_a_success_owing_its_callback_is_finished_in_its_transaction_at_once(
    changing_page, redis_client
):
    with CaptureQueriesContext(connection) as queries:
        audit = audit_now(changing_page.url, callback_url="https://receiver.example/hook")
    assert Delivery.objects.get(audit=audit).event == "audit.finished"
    # Its claim read the callback URL: the finish does not first send the page's lock and
    # the one-round-trip UPDATE (whose condition, no callback, would refuse it).
    sql = [q["sql"] for q in queries]
    assert not [q for q in sql if q.startswith('SELECT 1 FROM "audits_page"')]
    assert not [q for q in sql if q.startswith('WITH finished AS (UPDATE "audits_audit"')]


@pytest.mark.both_databases
def test_a_success_finished_since_a_first_audit_s_claim_is_the_one_it_compares_with(
    changing_page, redis_client
):
    page = submission.get_or_create_page(normalize_url(changing_page.url))
    audit = Audit.objects.create(page=page, task_id="a")
    claimed = services.claim_audit(str(audit.id))
    assert claimed.previous == NO_PREVIOUS_SUCCESS

    # While it runs, another audit of the page, retitled, succeeds: the page's first.
    changing_page.state.title = "Between"
    between = audit_now(changing_page.url)
    assert between.changes is None

    assert Audit.objects.finish(
        str(audit.id),
        status=Audit.Status.SUCCEEDED,
        result={**between.result, "title": "Home"},
        previous=claimed.previous,
    )
    audit.refresh_from_db()
    # Compared with the success that finished since its claim, not as the page's first.
    assert audit.changes == [{"field": "title", "before": "Between", "after": "Home"}]
    assert Page.objects.get().last_changed_at == audit.finished_at


def test_a_2xx_that_becomes_an_error_is_worse_and_failed_audits_are_skipped(
    changing_page, redis_client
):
    first = audit_now(changing_page.url)
    # A failed audit in between is neither compared nor compared with.
    failed = Audit.objects.create(page=first.page, task_id="f", status=Audit.Status.RUNNING)
    Audit.objects.finish(str(failed.id), status=Audit.Status.FAILED, error="gave up")
    failed.refresh_from_db()
    assert failed.changes is None

    # A 5xx would be retried: a 404 is the page's answer, and an error.
    changing_page.state.status = 404
    later = audit_now(changing_page.url, trigger=Audit.Trigger.REAUDIT)
    assert fields(later)["status_code"] == {"field": "status_code", "before": 200, "after": 404}
    assert later.got_worse is True


def test_the_changes_are_computed_once_a_second_finish_changes_nothing(changing_page):
    first = audit_now(changing_page.url)
    assert not Audit.objects.finish(
        str(first.id), status=Audit.Status.SUCCEEDED, result={**first.result, "title": "x"}
    )
    first.refresh_from_db()
    assert first.changes is None and first.result["title"] == "Home"
    assert first.finished_at <= timezone.now()


def test_the_admin_shows_the_changes_of_an_audit(client, django_user_model):
    page = Page.objects.create(url="https://example.org/", domain="example.org")
    audit = Audit.objects.create(
        page=page,
        status=Audit.Status.SUCCEEDED,
        changes=[
            {"field": "noindex", "before": False, "after": True},
            {
                "field": "broken_links",
                "before": [],
                "after": ["https://a.example/"],
                "added": ["https://a.example/"],
                "removed": [],
            },
        ],  # fmt: skip
        got_worse=True,
    )
    client.force_login(django_user_model.objects.create_superuser("ops", password="x"))
    html = client.get(f"/admin/audits/audit/{audit.id}/change/").content.decode()
    assert "<th>noindex</th><td>false</td><td>true</td>" in html
    assert "<th>broken_links</th><td>(none)</td><td>https://a.example/</td>" in html
    listed = client.get("/admin/audits/audit/?got_worse__exact=1").content.decode()
    assert str(audit.id) in listed


def test_the_admin_shows_an_audit_s_findings_failing_first(client, django_user_model):
    from audits.findings import CHECK_IDS, finding

    page = Page.objects.create(url="https://example.org/", domain="example.org")
    findings = [finding(check, "pass") for check in CHECK_IDS]
    findings[8] = finding(
        "link-text", "fail", {"count": 1, "items": [{"href": "/a", "text": "here"}]}
    )
    audit = Audit.objects.create(
        page=page, status=Audit.Status.SUCCEEDED, result={"findings": findings}
    )
    client.force_login(django_user_model.objects.create_superuser("ops", password="x"))
    html = client.get(f"/admin/audits/audit/{audit.id}/change/").content.decode()
    table = html[html.index("<th>check</th>") :]
    assert table.index('<th>link-text</th><td class="finding-fail">fail</td><td>low</td>') < (
        table.index("<th>is-crawlable</th>")
    )
    assert "here" in table
