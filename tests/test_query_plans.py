"""The lookups made once per audit go straight to their rows, whatever PostgreSQL's
statistics say: a night adds rows by the hundred thousand between two ANALYZEs, and a
plan that walks rows costs a little more with every audit (BENCHMARKS.md, "Capacity").

The test database's tables have never been analyzed, as a night's are at its start.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audits.models import Audit, Page
from reaudit import services
from reaudit.tasks import NIGHT_TASKS
from tests.reaudit_factories import DAY, make_pages

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


def test_a_finish_reads_the_page_s_previous_success_from_its_own_index():
    page = Page.objects.create(url="http://127.0.0.1:9/a", domain="a.test")
    for task_id in ("earlier", "other"):
        audit = Audit.objects.create(page=page, task_id=task_id)
        Audit.objects.finish(audit.id, status=Audit.Status.SUCCEEDED, result={"status": 200})
    audit = Audit.objects.create(page=page, task_id="now")

    with CaptureQueriesContext(connection) as queries:
        Audit.objects.finish(audit.id, status=Audit.Status.SUCCEEDED, result={"status": 500})

    chosen = plan(queries, 'SELECT "audits_audit"."result"')
    assert "Index Scan using audit_page_success_idx" in chosen, chosen
    assert "Bitmap" not in chosen, chosen  # no second index read and ANDed with it


def test_a_placement_firing_finds_its_row_by_night_and_page():
    pages = make_pages({"a.test": 3, "b.test": 2})
    services.fan_out(DAY, night_tasks=NIGHT_TASKS)

    with CaptureQueriesContext(connection) as queries:
        services.fire_placement(pages[0].id, DAY)

    chosen = plan(queries, 'UPDATE "reaudit_placement"').splitlines()
    (scan,) = [n for n, line in enumerate(chosen) if "placement_unfired_idx" in line]
    # The page is in the index's condition: not every unfired placement read and then
    # ANDed with the page's.
    assert "Index Cond" in chosen[scan + 1] and "page_id" in chosen[scan + 1], chosen
    assert not any("BitmapAnd" in line for line in chosen), chosen
