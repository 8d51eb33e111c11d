"""A nightly re-audit asks whether the page changed (ETag, Last-Modified): a 304 carries the
previous result forward instead of downloading and parsing the page again."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, connections
from django.test.utils import CaptureQueriesContext

from audits import services
from audits.models import Audit, Page
from tests.changing_page import SECURITY_HEADERS, ChangingPage
from tests.test_audit_changes import audit_now
from tests.workers import wait_for
from webhooks.models import Delivery

pytestmark = pytest.mark.django_db

REAUDIT = Audit.Trigger.REAUDIT


@pytest.fixture
def page():
    server = ChangingPage().start()
    server.state.etag = '"v1"'
    server.state.last_modified = "Sat, 05 Dec 2026 10:00:00 GMT"
    yield server
    server.stop()


def conditional_headers(request: dict) -> dict:
    lowered = {name.lower(): value for name, value in request.items()}
    return {
        name: lowered[name] for name in ("if-none-match", "if-modified-since") if name in lowered
    }


def test_a_reaudit_of_an_unchanged_page_sends_the_validators_and_carries_the_result_forward(
    page, redis_client
):
    page.state.title = "Unchanged"
    first = audit_now(page.url)
    assert first.result["validators"]["etag"] == '"v1"'
    assert "not_modified" not in first.result

    again = audit_now(page.url, trigger=REAUDIT)
    assert conditional_headers(page.requests[-1]) == {
        "if-none-match": '"v1"',
        "if-modified-since": "Sat, 05 Dec 2026 10:00:00 GMT",
    }
    assert again.result["not_modified"] is True
    assert again.result["revalidated_status_code"] == 304
    assert again.result["status_code"] == 200  # the page's status: the 304 confirms it
    assert again.result["title"] == "Unchanged"
    assert again.result["missing_security_headers"] == []
    assert again.changes == []

    # The next night revalidates with what the carried-forward result kept.
    third = audit_now(page.url, trigger=REAUDIT)
    assert third.result["not_modified"] is True
    assert conditional_headers(page.requests[-1])["if-none-match"] == '"v1"'


def test_a_changed_page_is_fetched_and_read_in_full(page, redis_client):
    audit_now(page.url)
    page.state.etag = '"v2"'
    page.state.title = "Changed"
    again = audit_now(page.url, trigger=REAUDIT)
    assert conditional_headers(page.requests[-1])["if-none-match"] == '"v1"'
    assert "not_modified" not in again.result
    assert again.result["title"] == "Changed"
    assert again.result["validators"]["etag"] == '"v2"'
    assert [change["field"] for change in again.changes] == ["title"]


def test_last_modified_alone_is_enough(page, redis_client):
    page.state.etag = ""
    audit_now(page.url)
    again = audit_now(page.url, trigger=REAUDIT)
    assert conditional_headers(page.requests[-1]) == {
        "if-modified-since": "Sat, 05 Dec 2026 10:00:00 GMT"
    }
    assert again.result["not_modified"] is True


def test_a_304_never_reports_a_security_header_missing_because_it_left_it_out(page, redis_client):
    # The 200 sent every security header; the 304 sends only its validators.
    page.state.headers = dict(SECURITY_HEADERS)
    audit_now(page.url)
    again = audit_now(page.url, trigger=REAUDIT)
    assert again.result["not_modified"] is True
    assert again.result["missing_security_headers"] == []
    assert again.changes == [] and again.got_worse is False


def test_a_security_header_the_304_sends_is_read_from_it(page, redis_client):
    page.state.headers = {}
    first = audit_now(page.url)
    assert "content-security-policy" in first.result["missing_security_headers"]
    page.state.not_modified_headers = {"Content-Security-Policy": "default-src 'self'"}
    again = audit_now(page.url, trigger=REAUDIT)
    assert again.result["not_modified"] is True
    assert "content-security-policy" not in again.result["missing_security_headers"]
    assert "referrer-policy" in again.result["missing_security_headers"]  # not sent: as before
    (change,) = again.changes
    assert change["field"] == "missing_security_headers"
    assert change["removed"] == ["content-security-policy"]


def finding(audit: Audit, check: str) -> dict:
    return next(item for item in audit.result["findings"] if item["id"] == check)


def test_an_x_robots_tag_the_304_sends_is_read_from_it(page, redis_client):
    first = audit_now(page.url)
    assert first.result["noindex"] is False
    assert finding(first, "is-crawlable")["outcome"] == "pass"

    page.state.not_modified_headers = {"X-Robots-Tag": "noindex"}
    again = audit_now(page.url, trigger=REAUDIT)

    assert again.result["not_modified"] is True
    assert again.result["noindex"] is True
    crawlable = finding(again, "is-crawlable")
    assert crawlable["outcome"] == "fail"
    assert crawlable["details"]["items"] == ["X-Robots-Tag: noindex"]
    changed = {change["field"]: change for change in again.changes}
    assert changed["noindex"]["after"] is True
    assert changed["failing_checks"]["added"] == ["is-crawlable"]
    assert again.got_worse is True


def test_an_x_robots_tag_the_304_leaves_out_is_carried_never_dropped(page, redis_client):
    page.state.headers = {**page.state.headers, "X-Robots-Tag": "noindex"}
    first = audit_now(page.url)
    assert first.result["noindex"] is True
    assert finding(first, "is-crawlable")["outcome"] == "fail"

    again = audit_now(page.url, trigger=REAUDIT)  # the 304 sends its validators only

    assert again.result["not_modified"] is True
    assert again.result["noindex"] is True
    assert finding(again, "is-crawlable") == finding(first, "is-crawlable")
    assert again.changes == []


def test_the_304s_x_robots_tag_replaces_the_pages_and_its_metas_still_count(page, redis_client):
    page.state.headers = {**page.state.headers, "X-Robots-Tag": "noindex"}
    audit_now(page.url)
    page.state.not_modified_headers = {"X-Robots-Tag": "all"}
    lifted = audit_now(page.url, trigger=REAUDIT)
    assert lifted.result["noindex"] is False
    assert finding(lifted, "is-crawlable")["outcome"] == "pass"
    assert [change["field"] for change in lifted.changes] == ["noindex", "failing_checks"]
    assert lifted.got_worse is False

    # A noindex meta in the page is still there whatever the 304 says (the page did not
    # change: its metas are the ones the full audit kept).
    page.state.noindex, page.state.etag = True, '"v2"'
    audit_now(page.url)
    again = audit_now(page.url, trigger=REAUDIT)
    assert again.result["not_modified"] is True
    assert again.result["noindex"] is True
    assert finding(again, "is-crawlable")["details"]["items"] == [
        '<meta name="robots" content="noindex" />'
    ]


def test_an_audit_a_client_submits_always_fetches_in_full(page, redis_client):
    audit_now(page.url)
    again = audit_now(page.url)
    assert conditional_headers(page.requests[-1]) == {}
    assert "not_modified" not in again.result


def test_conditional_reaudits_can_be_turned_off(page, settings, redis_client):
    settings.AUDIT_CONDITIONAL_REAUDITS = False
    audit_now(page.url)
    again = audit_now(page.url, trigger=REAUDIT)
    assert conditional_headers(page.requests[-1]) == {}
    assert "not_modified" not in again.result


def test_a_result_of_another_analysis_format_is_not_carried_forward(
    page, monkeypatch, redis_client
):
    audit_now(page.url)
    monkeypatch.setattr(
        "audits.services.RESULT_FORMAT", services.RESULT_FORMAT + 1
    )  # changed since
    again = audit_now(page.url, trigger=REAUDIT)
    assert conditional_headers(page.requests[-1]) == {}
    assert "not_modified" not in again.result


def test_an_unchanged_page_still_has_its_links_checked(page, site, redis_client):
    page.state.links = [f"{site.base_url}/", f"{site.base_url}/missing"]
    audit_now(page.url)
    again = audit_now(page.url, trigger=REAUDIT)
    assert again.result["not_modified"] is True
    statuses = {link["url"]: link["status"] for link in again.result["links"]}
    assert statuses == {f"{site.base_url}/": "ok", f"{site.base_url}/missing": "broken"}
    assert again.result["link_check"]["total"] == 2


def test_a_reaudit_compares_with_the_previous_success_its_claim_read_without_reading_it_again(
    page, redis_client
):
    first = audit_now(page.url)
    with CaptureQueriesContext(connection) as queries:
        again = audit_now(page.url, trigger=REAUDIT)
    assert again.result["not_modified"] is True
    assert again.changes == [] and again.got_worse is False
    # The claim read the previous success; the finish's UPDATE holds only while it is
    # still the page's latest, and nothing reads it a second time.
    previous_reads = [
        q["sql"] for q in queries if q["sql"].startswith('SELECT "audits_audit"."result"')
    ]
    assert previous_reads == []
    if connection.vendor == "postgresql":
        # Unchanged and owing no callback: its finish is the page's lock and the UPDATE,
        # sent together (jobs.sql.pipelines), and no transaction block of its own.
        sql = [q["sql"] for q in queries]
        (lock,) = [n for n, q in enumerate(sql) if "FOR UPDATE" in q]
        assert sql[lock].startswith('SELECT 1 FROM "audits_page"')
        assert sql[lock + 1].startswith('UPDATE "audits_audit"')
    assert again.result["title"] == first.result["title"]


def test_a_success_finished_since_the_claim_is_the_one_a_reaudit_compares_with(page, redis_client):
    page.state.title = "One"
    first = audit_now(page.url)
    reaudit = Audit.objects.create(page=first.page, task_id="r", trigger=REAUDIT)
    claimed = services.claim_audit(str(reaudit.id))
    assert claimed.previous.id == first.id and claimed.previous.result["title"] == "One"

    # While the re-audit runs, a client's audit of the changed page succeeds.
    page.state.title = "Two"
    between = audit_now(page.url)
    assert [change["field"] for change in between.changes] == ["title"]

    assert Audit.objects.finish(
        str(reaudit.id),
        status=Audit.Status.SUCCEEDED,
        result=claimed.previous.result,
        previous=claimed.previous,
    )
    reaudit.refresh_from_db()
    # Compared with the success that finished since its claim, not the one it read.
    assert reaudit.changes == [{"field": "title", "before": "Two", "after": "One"}]
    assert Page.objects.get().last_changed_at == reaudit.finished_at


def test_an_unchanged_reaudit_that_owes_a_callback_still_owes_it(page, redis_client):
    first = audit_now(page.url)
    reaudit = Audit.objects.create(
        page=first.page, task_id="r", trigger=REAUDIT, callback_url="http://127.0.0.1:9/hook"
    )
    claimed = services.claim_audit(str(reaudit.id))
    assert Audit.objects.finish(
        str(reaudit.id),
        status=Audit.Status.SUCCEEDED,
        result=claimed.previous.result,
        previous=claimed.previous,
    )
    reaudit.refresh_from_db()
    assert reaudit.changes == []
    assert Delivery.objects.filter(audit=reaudit, event=Delivery.Event.FINISHED).count() == 1


def finishes_waiting_on_a_lock() -> int:
    """Sessions of the test database waiting for a lock (the re-audit's finish)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def finishing_unchanged(reaudit: Audit, claimed, *, into: list) -> threading.Thread:
    """A thread (not started) that finishes the re-audit unchanged since what its claim
    read, on a connection of its own, appending what the finish returned to `into`."""

    def finish() -> None:
        try:
            into.append(
                Audit.objects.finish(
                    str(reaudit.id),
                    status=Audit.Status.SUCCEEDED,
                    result=claimed.previous.result,
                    previous=claimed.previous,
                )
            )
        finally:
            connection.close()

    return threading.Thread(target=finish)


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="reads PostgreSQL's lock waits")
def test_an_unchanged_reaudit_that_waited_for_its_page_compares_with_what_finished_meanwhile(
    page, redis_client
):
    # The one-round-trip finish locks the page, then writes on the condition that the claim's
    # previous success is still the latest: the condition must read after the lock is
    # granted, so a success committed while the finish waited is the one compared with.
    page.state.title = "One"
    first = audit_now(page.url)
    reaudit = Audit.objects.create(page=first.page, task_id="r", trigger=REAUDIT)
    claimed = services.claim_audit(str(reaudit.id))
    between = Audit.objects.create(page=first.page, task_id="b", status=Audit.Status.RUNNING)
    finished = []
    locker = connections.create_connection(DEFAULT_DB_ALIAS)
    thread = finishing_unchanged(reaudit, claimed, into=finished)
    try:
        with locker.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("SELECT 1 FROM audits_page WHERE id = %s FOR UPDATE", [first.page_id])
            cursor.execute(
                "UPDATE audits_audit SET status = 'succeeded', finished_at = now(),"
                " result = %s::jsonb WHERE id = %s",
                [json.dumps({**first.result, "title": "Two"}), between.id],
            )
            thread.start()
            wait_for(lambda: finishes_waiting_on_a_lock() == 1, timeout=30, message="the finish")
            cursor.execute("COMMIT")
        thread.join(timeout=30)
    finally:
        locker.close()
    assert finished == [True]
    reaudit.refresh_from_db()
    assert reaudit.changes == [{"field": "title", "before": "Two", "after": "One"}]


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="reads PostgreSQL's lock waits")
def test_a_one_round_trip_finish_holds_its_page_until_its_update_commits(page, redis_client):
    # The page's lock and the UPDATE are sent together (jobs.sql.pipelines) and run in one
    # transaction: while the UPDATE waits, another finish of the page cannot lock it and
    # compare with what this one has not yet written.
    first = audit_now(page.url)
    reaudit = Audit.objects.create(page=first.page, task_id="r", trigger=REAUDIT)
    claimed = services.claim_audit(str(reaudit.id))
    finished = []
    holder = connections.create_connection(DEFAULT_DB_ALIAS)  # holds the audit's row
    other = connections.create_connection(DEFAULT_DB_ALIAS)  # another finish of the page
    thread = finishing_unchanged(reaudit, claimed, into=finished)
    try:
        with holder.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("SELECT 1 FROM audits_audit WHERE id = %s FOR UPDATE", [reaudit.id])
            thread.start()
            wait_for(lambda: finishes_waiting_on_a_lock() == 1, timeout=30, message="the finish")
            with other.cursor() as probe, pytest.raises(OperationalError, match="lock"):
                probe.execute(
                    "SELECT 1 FROM audits_page WHERE id = %s FOR UPDATE NOWAIT", [first.page_id]
                )
            cursor.execute("COMMIT")
        thread.join(timeout=30)
    finally:
        holder.close()
        other.close()
    assert finished == [True]
    reaudit.refresh_from_db()
    assert reaudit.status == Audit.Status.SUCCEEDED and reaudit.changes == []
