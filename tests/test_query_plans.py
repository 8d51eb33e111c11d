"""The lookups made once per audit go straight to their rows, whatever PostgreSQL's
statistics say: a night adds rows by the hundred thousand between two ANALYZEs, and a
plan that walks rows costs a little more with every audit (BENCHMARKS.md, "Capacity").

Each plan is checked on the statistics the test database has (its tables are rarely
analyzed, as a night's are at its start) and on fresh ones.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audits import admission, robots, submission
from audits.models import Audit, LinkCheck, Page, PreviousSuccess
from audits.pages import audits_listed, change_counts
from audits.services import claim_audit
from outbound.urls import normalize_url
from reaudit import services
from reaudit.tasks import NIGHT_TASKS
from tests.reaudit_factories import DAY, make_pages
from tests.workers import WorkerProcess

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("the plans are PostgreSQL's")


def plan(queries: CaptureQueriesContext, *fragments: str) -> str:
    """PostgreSQL's plan for the one captured query that holds every fragment."""
    (sql,) = [q["sql"] for q in queries.captured_queries if all(f in q["sql"] for f in fragments)]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)
        return "\n".join(row for (row,) in cursor.fetchall())


def succeeded_audits_of_other_pages(count: int) -> None:
    """Enough rows that a plan reading them all is never the cheap one, whatever the
    statistics (the suite's other tests may have had the table analyzed)."""
    pages = make_pages({"other.test": count // 4})
    Audit.objects.bulk_create(
        Audit(page=page, task_id=f"{page.id}-{n}", status=Audit.Status.SUCCEEDED,
              finished_at=timezone.now(), result={"status": 200})
        for page in pages
        for n in range(4)
    )  # fmt: skip


def analyze(*tables: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE " + ", ".join(tables))


@pytest.mark.parametrize("statistics", ["as they are", "fresh"])
def test_a_finish_reads_the_page_s_previous_success_from_its_own_index(statistics):
    succeeded_audits_of_other_pages(2000)
    page = Page.objects.create(url="http://127.0.0.1:9/a", domain="a.test")
    for task_id in ("earlier", "other"):
        audit = Audit.objects.create(page=page, task_id=task_id)
        Audit.objects.finish(audit.id, status=Audit.Status.SUCCEEDED, result={"status": 200})
    audit = Audit.objects.create(page=page, task_id="now")
    if statistics == "fresh":
        analyze("audits_audit", "audits_page")

    with CaptureQueriesContext(connection) as queries:
        Audit.objects.finish(audit.id, status=Audit.Status.SUCCEEDED, result={"status": 500})

    chosen = plan(queries, 'SELECT "audits_audit"."result"')
    assert "Index Scan using audit_page_success_idx" in chosen, chosen
    assert "Bitmap" not in chosen, chosen  # no second index read and ANDed with it

    # Run as a worker runs it (no query log), the statement is prepared, and the plan
    # PostgreSQL keeps for any page reads the same index.
    audit = Audit.objects.create(page=page, task_id="later")
    Audit.objects.finish(audit.id, status=Audit.Status.SUCCEEDED, result={"status": 200})
    kept = prepared_plan(
        'SELECT "audits_audit"."result"', [page.id, str(audit.id)], "force_generic_plan"
    )
    assert "Index Scan using audit_page_success_idx" in kept, kept
    assert "Bitmap" not in kept, kept


@pytest.mark.parametrize("statistics", ["as they are", "fresh"])
@pytest.mark.parametrize(
    "result",
    [{"status": 200, "findings": []}, {"status": 200}],
    ids=["unchanged, one query", "with the page's failing checks to write"],
)
def test_a_reaudit_s_finish_checks_its_claim_s_previous_success_on_its_own_index(
    statistics, result
):
    # The finish of a re-audit whose claim read the previous success writes on the
    # condition that it is still the page's latest (audits.models.AuditQuerySet.finish).
    succeeded_audits_of_other_pages(2000)
    page = Page.objects.create(url="http://127.0.0.1:9/a", domain="a.test")
    audit = Audit.objects.create(page=page, task_id="earlier")
    Audit.objects.finish(audit.id, status=Audit.Status.SUCCEEDED, result=result)
    previous = PreviousSuccess(audit.id, result)
    audit = Audit.objects.create(page=page, task_id="now", trigger=Audit.Trigger.REAUDIT)
    if statistics == "fresh":
        analyze("audits_audit", "audits_page")

    with CaptureQueriesContext(connection) as queries:
        assert Audit.objects.finish(
            audit.id, status=Audit.Status.SUCCEEDED, result=result, previous=previous
        )

    (sql,) = [q["sql"] for q in queries if 'previous."id"' in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)  # the UPDATE, or its CTE with the page's update
        chosen = "\n".join(row for (row,) in cursor.fetchall())
    assert "Index Scan using audit_page_success_idx" in chosen, chosen
    assert "Bitmap" not in chosen, chosen


@pytest.mark.parametrize("statistics", ["as they are", "fresh"])
def test_a_placement_firing_finds_its_row_by_night_and_page(statistics):
    pages = make_pages({"a.test": 1000, "b.test": 1000})
    services.fan_out(DAY, night_tasks=NIGHT_TASKS)
    if statistics == "fresh":
        analyze("reaudit_placement", "reaudit_fanout", "audits_page")

    with CaptureQueriesContext(connection) as queries:
        services.fire_placement(pages[0].id, DAY)

    chosen = plan(queries, 'UPDATE "reaudit_placement"').splitlines()
    # Every read of the placements goes by the page (or by a row found so): not every
    # unfired placement of the night read, then ANDed with the page's.
    reads = [
        (line, chosen[n + 1])
        for n, line in enumerate(chosen)
        if "Scan" in line and " on reaudit_placement" in line
    ]
    assert reads, chosen
    for scan, condition in reads:
        assert "Seq Scan" not in scan, chosen
        assert "Cond" in condition and ("page_id" in condition or "(id = " in condition), chosen
    assert not any("BitmapAnd" in line for line in chosen), chosen


@pytest.mark.parametrize("statistics", ["as they are", "fresh"])
def test_the_pages_changed_and_worse_are_counted_from_their_own_indexes(statistics):
    # Every page changed long ago: the counts read only the few changed in the last day.
    pages = make_pages({"a.test": 1000, "b.test": 1000})
    long_ago = timezone.now() - timedelta(days=3)
    Page.objects.update(last_changed_at=long_ago, last_worse_at=long_ago)
    Page.objects.filter(id__in=[page.id for page in pages[:5]]).update(
        last_changed_at=timezone.now(), last_worse_at=timezone.now()
    )
    if statistics == "fresh":
        analyze("audits_page", "audits_audit")

    with CaptureQueriesContext(connection) as queries:
        counts = change_counts()

    assert counts == {"pages_changed": 5, "pages_worse": 5}
    for column, index in (
        ("last_changed_at", "page_changed_idx"),
        ("last_worse_at", "page_worse_idx"),
    ):
        chosen = plan(queries, f'"audits_page"."{column}" >=')
        assert index in chosen, chosen  # an index scan of it: plain, bitmap or index-only
        assert "Seq Scan" not in chosen and "audits_audit" not in chosen, chosen


def test_a_clients_audit_listing_reads_its_own_rows_by_index(django_user_model):
    """On fresh statistics only: on a never-analyzed table PostgreSQL may walk the
    created_at index for the page owner's half (DECISIONS.md, "Who sees what")."""
    succeeded_audits_of_other_pages(4000)
    client = django_user_model.objects.create_user("client")
    own_page = Page.objects.create(url="http://127.0.0.1:9/own", domain="a.test", owner=client)
    Audit.objects.create(page=own_page, task_id="reaudit", trigger=Audit.Trigger.REAUDIT)
    other_page = Page.objects.filter(domain="other.test").first()
    Audit.objects.create(page=other_page, task_id="submitted", submitter=client)
    analyze("audits_audit", "audits_page")

    with CaptureQueriesContext(connection) as queries:
        listed = list(audits_listed(client)[:20])
    assert [audit.task_id for audit in listed] == ["submitted", "reaudit"]
    assert len(queries) == 1  # each audit's page came with it
    chosen = plan(queries, "UNION")
    assert "audit_submitter_created_idx" in chosen, chosen
    assert "audit_page_created_idx" in chosen, chosen
    assert "Seq Scan on audits_audit" not in chosen, chosen
    assert "audits_audit_created_at" not in chosen, chosen  # no walk of every audit


def prepared_plan(fragment: str, arguments: list[str], plan_cache_mode: str) -> str:
    """PostgreSQL's plan for the one statement prepared on this connection that holds
    `fragment`, run with `arguments`: its plan for them (force_custom_plan, what its first
    five runs get) or the plan it may keep for any (force_generic_plan)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name FROM pg_prepared_statements WHERE position(%s in statement) > 0",
            [fragment],
        )
        ((name,),) = cursor.fetchall()
        cursor.execute(f"SET LOCAL plan_cache_mode = {plan_cache_mode}")
        placeholders = ", ".join(["%s"] * len(arguments))
        cursor.execute(f"EXPLAIN EXECUTE {name}({placeholders})", arguments)
        return "\n".join(row for (row,) in cursor.fetchall())


@pytest.mark.parametrize("plan_cache_mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("statistics", ["as they are", "fresh"])
def test_a_client_s_holding_is_counted_from_its_unfinished_audits_index(
    statistics, plan_cache_mode
):
    # Every submission counts its client's unfinished audits (audits.admission) with a
    # statement prepared once per connection: a probe of the partial index, never a walk
    # of the client's finished history, whether planned for its client or for any; and
    # the link checks of its audits checking links read through their own index, never
    # every check of every client (the plan PostgreSQL may keep, force_generic_plan).
    # A history of 10,000: with 2,000, a table the suite's earlier tests had not grown was
    # small enough for a sequential scan to be the cheaper plan for this client, by fresh
    # statistics (the test failed run alone with the few tests before it).
    succeeded_audits_of_other_pages(10_000)
    Audit.objects.filter(status=Audit.Status.SUCCEEDED).update(client="ip:192.0.2.1")
    page = Page.objects.create(url="http://127.0.0.1:9/a", domain="a.test")
    for n in range(40):
        Audit.objects.create(page=page, task_id=f"queued-{n}", client="ip:192.0.2.1")
    checking = Audit.objects.create(
        page=page, task_id="checking", client="ip:192.0.2.1", status=Audit.Status.CHECKING_LINKS
    )
    LinkCheck.objects.bulk_create(
        LinkCheck(audit=checking, url=f"http://127.0.0.1:9/{n}") for n in range(3)
    )
    audits_checking_links(page, [f"ip:192.0.2.{n % 50 + 2}" for n in range(400)], checks=50)
    if statistics == "fresh":
        analyze("audits_audit", "audits_linkcheck")

    assert admission.client_holding("ip:192.0.2.1") == 40 + 3

    # As the statement takes them (admission.holding_params): the client four times, and
    # its share (the default, 100).
    client = ["ip:192.0.2.1"] * 4 + ["100"]
    chosen = prepared_plan("SELECT entries FROM held", client, plan_cache_mode)
    assert "audit_client_unfinished_idx" in chosen, chosen
    assert "Seq Scan on audits_audit" not in chosen, chosen
    if plan_cache_mode == "force_generic_plan":
        assert "Seq Scan on audits_linkcheck" not in chosen, chosen

    # A submission reads the same holding inside its own statement (audits.submission).
    with connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL plan_cache_mode = {plan_cache_mode}")
    tables = ("audits_audit", "audits_linkcheck")
    scans_before = [table_reads(table)[0] for table in tables]
    submission.submit_audit(normalize_url("http://127.0.0.1:9/b"), client="ip:192.0.2.1")
    assert [table_reads(table)[0] for table in tables] == scans_before


@pytest.mark.parametrize("plan_cache_mode", ["force_custom_plan", "force_generic_plan"])
def test_a_client_holding_far_past_its_share_costs_its_submissions_no_more_than_its_share(
    plan_cache_mode, settings
):
    # A client may hold far more than its share: the share refuses new submissions, not
    # the link checks of the audits it already has (one entry per check). Each of its
    # submissions, refused or not, reads its holding first; the count stops at the share.
    settings.AUDIT_QUEUE_MAX_DEPTH, settings.AUDIT_CLIENT_MAX_SHARE = 1000, 0.05
    page = Page.objects.create(url="http://127.0.0.1:9/a", domain="a.test")
    Audit.objects.bulk_create(
        Audit(page=page, task_id=f"queued-{n}", client="ip:192.0.2.1") for n in range(30)
    )
    audits_checking_links(page, ["ip:192.0.2.1"] * 40, checks=50)
    analyze("audits_audit", "audits_linkcheck")

    with connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL plan_cache_mode = {plan_cache_mode}")

    # 30 audits and 2,000 checks, read as its share: by the submission's own statement
    # (refused), and by the holding's (a submission the backlog refused reads it too).
    def submitting() -> None:
        with pytest.raises(submission.ClientShareHeld) as refused:
            submission.submit_audit(normalize_url("http://127.0.0.1:9/b"), client="ip:192.0.2.1")
        assert refused.value.held == 50

    def reading_the_holding() -> None:
        assert admission.client_holding("ip:192.0.2.1") == 50

    for read in (submitting, reading_the_holding):
        checks_before = table_reads("audits_linkcheck")
        read()
        # Through their index, and no more of them than the share: 2,000 without the LIMIT.
        checks_after = table_reads("audits_linkcheck")
        seq_scans, fetched = (
            after - before for after, before in zip(checks_after, checks_before, strict=True)
        )
        assert seq_scans == 0
        assert 0 < fetched <= 50
    assert not Page.objects.filter(url="http://127.0.0.1:9/b").exists()


def audits_checking_links(page: Page, clients: list[str], *, checks: int) -> None:
    """An audit of `page` checking links for each of `clients`, each waiting on `checks`."""
    audits = Audit.objects.bulk_create(
        Audit(page=page, task_id=f"checking-{n}", client=client,
              status=Audit.Status.CHECKING_LINKS)
        for n, client in enumerate(clients)
    )  # fmt: skip
    LinkCheck.objects.bulk_create(
        (LinkCheck(audit=audit, url=f"http://127.0.0.1:9/{n}") for audit in audits
         for n in range(checks)),
        batch_size=5000,
    )  # fmt: skip


def table_reads(table: str) -> tuple[int, int]:
    """This transaction's sequential scans of `table`, and the rows its index scans fetched
    from it, so far (PostgreSQL's statistics of the transaction)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq_scan, idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relname = %s",
            [table],
        )
        return cursor.fetchone()


def test_a_client_s_holding_is_planned_once_for_every_client():
    # settings: plan_cache_mode=force_generic_plan. Under PostgreSQL's default the
    # statement was planned again on every call whenever its statistics made the plan for
    # any client look dearer than each client's own (bench/admission.py).
    page = Page.objects.create(url="http://127.0.0.1:9/a", domain="a.test")
    Audit.objects.create(page=page, task_id="queued", client="ip:192.0.2.1")
    for n in range(6):
        admission.client_holding(f"ip:192.0.2.{n % 2 + 1}")
        submission.submit_audit(
            normalize_url(f"http://127.0.0.1:9/{n}"), client=f"ip:192.0.2.{n % 2 + 1}"
        )

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE position(%s in statement) > 0",
            ['"audits_audit"."client" = $2'],
        )
        # The holding's statement and the submission's.
        assert cursor.fetchall() == [(6, 0), (6, 0)]


def test_an_attempt_s_statements_are_planned_once_per_connection():
    # Its host's lookup, its claim, its robots.txt's freshness and its finish's statements
    # are prepared: PostgreSQL plans each once per connection, where planning them on every
    # attempt cost more than running them (DECISIONS.md, "An attempt's statements are
    # prepared"). Each runs here as a worker runs it, twice, and both runs used the plan
    # kept (settings: plan_cache_mode=force_generic_plan).
    page = Page.objects.create(url="http://127.0.0.1:9/a", domain="a.test")
    for n in range(2):
        audit = Audit.objects.create(page=page, task_id=f"attempt-{n}")
        assert Audit.objects.status_and_url(audit.id) == (Audit.Status.QUEUED, page.url)
        assert claim_audit(str(audit.id)) is not None
        robots.stored("http://127.0.0.1:9")
        Audit.objects.finish(audit.id, status=Audit.Status.SUCCEEDED, result={"status": 200})

    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        prepared = cursor.fetchall()
    for fragment in (
        'SELECT "audits_audit"."status", "audits_page"."url"',  # the host's lookup
        '"attempts" = "attempts" + 1',  # the claim
        'SELECT "fetched_at" FROM "audits_robotstxt"',  # robots.txt's freshness
        'FOR UPDATE OF "audits_page"',  # the finish's page lock
        'SELECT "audits_audit"."result"',  # the previous success
        '"next_attempt_at" = NULL, "result" = $2',  # the finish
    ):
        plans = [(generic, custom) for text, generic, custom in prepared if fragment in text]
        # Both runs on a kept plan (a finish with a previous success to compare with has a
        # statement of its own shape).
        assert plans and sum(generic for generic, _ in plans) == 2, (fragment, prepared)
        assert all(custom == 0 for _, custom in plans), (fragment, prepared)


def test_the_suite_s_workers_prepare_their_statements_as_a_deployment_s_do():
    # Under DEBUG, jobs.sql binds client-side for Django's query log: every integration
    # test would run a worker's statements down a path no deployment takes.
    assert WorkerProcess("audits").env["DEBUG"] == "false"
