"""Plumb's indexes hold what its queries read (PostgreSQL: the plans are tests/test_query_plans.py).

No index for LIKE (DECISIONS.md, "No index for LIKE"): a field's own `unique` or
`db_index` makes Django add one beside the real index, which no query reads and every
insert writes. Uniqueness and lookups keep their own indexes. No index another one
already covers ("No index another one already covers"): a foreign key's own index where a
composite one leads with the key. And the submitter's index holds submitted audits only
("The submitter's index holds submitted audits only"): the nightly re-audits have no
submitter and no listing reads them through it. The idempotency key's unique index holds
keyed audits only ("The idempotency key's index holds keyed audits only"): a submission
has no key.
"""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import IntegrityError, connection, transaction

from audits.models import Audit, Page, SharedLink
from tests.database import migrate, migrate_to_latest

PLUMB_APPS = ("audits", "jobs", "ratelimit", "reaudit", "webhooks", "observability")
BEFORE = [
    ("audits", "0023_page_timestamp_indexes_only_stamped"),
    ("jobs", "0006_breaker_changed_index"),
]
SUBMITTER_INDEX = "audit_submitter_created_idx"
IDEMPOTENCY_INDEX = "audit_idempotency_key_unique"
AFTER = [("audits", "0024_no_pattern_indexes"), ("jobs", "0007_dead_letter_task_id_index_in_meta")]

PATTERN_INDEXES = """
SELECT tbl.relname, index.relname FROM pg_index
JOIN pg_class AS index ON index.oid = pg_index.indexrelid
JOIN pg_class AS tbl ON tbl.oid = pg_index.indrelid
WHERE tbl.relname = ANY (%s) AND pg_table_is_visible(tbl.oid)
  AND EXISTS (SELECT 1 FROM pg_opclass WHERE pg_opclass.oid = ANY (pg_index.indclass::oid[])
              AND pg_opclass.opcname IN ('varchar_pattern_ops', 'text_pattern_ops'))
"""


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's indexes")


def plumb_tables() -> list[str]:
    return [
        model._meta.db_table
        for name in PLUMB_APPS
        if apps.is_installed(name)
        for model in apps.get_app_config(name).get_models()
    ]


# Indexes that a longer one on the same table starts with, column for column and operator
# class for class: every read the shorter serves, the longer does. Unique and partial ones
# are left out: they enforce or select something of their own.
COVERED_INDEXES = """
WITH idx AS (
  SELECT tbl.relname AS tbl, index.relname AS name,
         string_to_array(pg_index.indkey::text, ' ') AS cols,
         string_to_array(pg_index.indclass::text, ' ') AS classes,
         pg_index.indisunique AS uniq, pg_index.indpred IS NOT NULL AS partial
  FROM pg_index
  JOIN pg_class AS index ON index.oid = pg_index.indexrelid
  JOIN pg_class AS tbl ON tbl.oid = pg_index.indrelid
  WHERE tbl.relname = ANY (%s) AND pg_table_is_visible(tbl.oid)
)
SELECT short.tbl, short.name, long.name FROM idx AS short JOIN idx AS long
  ON long.tbl = short.tbl AND long.name <> short.name AND NOT long.partial
WHERE NOT short.uniq AND NOT short.partial
  AND cardinality(short.cols) < cardinality(long.cols)
  AND long.cols[1:cardinality(short.cols)] = short.cols
  AND long.classes[1:cardinality(short.classes)] = short.classes
ORDER BY 1, 2, 3
"""
FOREIGN_KEY_INDEXES = {
    "audits_linkcheck_audit_id_bbcba3cd",
    "reaudit_placement_fan_out_id_eda77e8f",
    "reaudit_slicerun_fan_out_id_869e982f",
    "webhooks_delivery_audit_id_f6624095",
}


def covered_indexes() -> list[tuple[str, str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(COVERED_INDEXES, [plumb_tables()])
        return cursor.fetchall()


def foreign_keys() -> dict[str, int]:
    """Each foreign key's constraint of the tables whose key lost its index, by name: its
    oid changes if it is dropped and added again."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, oid::int FROM pg_constraint WHERE contype = 'f' AND conrelid::regclass::text"
            " IN ('audits_linkcheck', 'reaudit_placement', 'reaudit_slicerun', 'webhooks_delivery')"
        )
        return dict(cursor.fetchall())


def pattern_indexes() -> list[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(PATTERN_INDEXES, [plumb_tables()])
        return sorted(cursor.fetchall())


def index_definitions(prefix: str) -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index"
            " WHERE indexrelid::regclass::text LIKE %s",
            [prefix + "%"],
        )
        return dict(cursor.fetchall())


def unique_constraints(table: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint WHERE contype = 'u' AND conrelid = %s::regclass",
            [table],
        )
        return [name for (name,) in cursor.fetchall()]


def index_bytes(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_relation_size(%s::regclass)", [name])
        return cursor.fetchone()[0]


@pytest.mark.django_db
def test_no_table_of_plumb_has_an_index_for_like():
    assert plumb_tables()
    assert pattern_indexes() == []


@pytest.mark.django_db
def test_urls_are_still_unique():
    Page.objects.create(url="https://example.test/", domain="example.test")
    SharedLink.objects.create(url="https://example.test/")
    with pytest.raises(IntegrityError), transaction.atomic():
        Page.objects.create(url="https://example.test/", domain="example.test")
    with pytest.raises(IntegrityError), transaction.atomic():
        SharedLink.objects.create(url="https://example.test/")


@pytest.mark.django_db(transaction=True)
def test_an_upgrade_drops_them_and_keeps_the_unique_indexes():
    try:
        # Built again from nothing up to the release before, as an old deployment's were:
        # migrating back alone leaves no index for LIKE to find.
        migrate([("audits", None), ("jobs", None)])
        migrate(BEFORE)
        before = pattern_indexes()
        migrate(AFTER)
        after = pattern_indexes()
    finally:
        migrate_to_latest()
    # Each table's name, one per index: the page's URL and domain, a distinct link's URL,
    # an origin, a token's hash and a dead letter's task id.
    assert [table for table, _ in before] == [
        "audits_apitoken",
        "audits_page",
        "audits_page",
        "audits_robotstxt",
        "audits_sharedlink",
        "jobs_deadletter",
    ]
    assert after == []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint WHERE contype = 'u' AND conrelid::regclass::text"
            " IN ('audits_page', 'audits_sharedlink', 'audits_robotstxt', 'audits_apitoken')"
        )
        unique = sorted(name for (name,) in cursor.fetchall())
    assert unique == [
        "audits_apitoken_key_hash_key",
        "audits_page_public_id_9417b147_uniq",
        "audits_page_url_key",
        "audits_robotstxt_origin_key",
        "audits_sharedlink_url_key",
    ]


@pytest.mark.django_db
def test_the_nightly_re_audits_leave_the_submitter_s_index_empty(django_user_model):
    page = Page.objects.create(url="https://example.test/", domain="example.test")
    empty = index_bytes(SUBMITTER_INDEX)
    Audit.objects.bulk_create(
        Audit(page=page, trigger=Audit.Trigger.REAUDIT, task_id=f"night-{n}") for n in range(2000)
    )
    assert index_bytes(SUBMITTER_INDEX) == empty
    client = django_user_model.objects.create_user("client")
    Audit.objects.bulk_create(
        Audit(page=page, submitter=client, task_id=f"submitted-{n}") for n in range(2000)
    )
    assert index_bytes(SUBMITTER_INDEX) > empty


def upgraded_from_a_failed_build(before: list, prefix: str, leftover: str) -> tuple:
    """The definitions of the indexes named `prefix...` at `before`, after the upgrade from
    there with `leftover` run first (what a build that failed half-way leaves: CREATE INDEX
    CONCURRENTLY does leave it), and back at `before`; and the audits' unique constraints
    then."""
    try:
        migrate(before)
        old = index_definitions(prefix)
        with connection.cursor() as cursor:
            cursor.execute(leftover)
        migrate_to_latest()
        new = index_definitions(prefix)
        migrate(before)
        reversed_ = index_definitions(prefix)
        constraints = unique_constraints("audits_audit")
    finally:
        migrate_to_latest()
    return old, new, reversed_, constraints


@pytest.mark.django_db(transaction=True)
def test_the_submitter_s_index_is_rebuilt_in_place_even_after_a_failed_build():
    every_audit, submitted_only, reversed_, _ = upgraded_from_a_failed_build(
        [("audits", "0024_no_pattern_indexes")],
        "audit_submitter_created",
        "CREATE INDEX audit_submitter_created_new ON audits_audit (submitter_id)",
    )
    assert list(every_audit) == [SUBMITTER_INDEX]
    assert "WHERE" not in every_audit[SUBMITTER_INDEX]
    assert list(submitted_only) == [SUBMITTER_INDEX]
    assert submitted_only[SUBMITTER_INDEX].endswith("WHERE (submitter_id IS NOT NULL)")
    assert reversed_ == every_audit


@pytest.mark.django_db
def test_submitted_audits_leave_the_idempotency_key_s_index_empty():
    page = Page.objects.create(url="https://example.test/", domain="example.test")
    empty = index_bytes(IDEMPOTENCY_INDEX)
    Audit.objects.bulk_create(Audit(page=page, task_id=f"submitted-{n}") for n in range(2000))
    assert index_bytes(IDEMPOTENCY_INDEX) == empty
    Audit.objects.bulk_create(
        Audit(page=page, trigger=Audit.Trigger.REAUDIT, task_id=f"night-{n}",
              idempotency_key=f"reaudit-{n}")
        for n in range(2000)
    )  # fmt: skip
    assert index_bytes(IDEMPOTENCY_INDEX) > empty


@pytest.mark.django_db
def test_a_key_is_still_unique():
    page = Page.objects.create(url="https://example.test/", domain="example.test")
    Audit.objects.create(page=page, task_id="first", idempotency_key="reaudit-1")
    with pytest.raises(IntegrityError), transaction.atomic():
        Audit.objects.create(page=page, task_id="second", idempotency_key="reaudit-1")


@pytest.mark.django_db(transaction=True)
def test_the_idempotency_key_s_index_is_rebuilt_in_place_even_after_a_failed_build():
    every_audit, keyed_only, reversed_, constraints = upgraded_from_a_failed_build(
        [("audits", "0026_link_check_audit_index_covered")],
        "audit_idempotency_key",
        "CREATE UNIQUE INDEX audit_idempotency_key_new ON audits_audit (idempotency_key)",
    )
    assert list(every_audit) == [IDEMPOTENCY_INDEX]
    assert "WHERE" not in every_audit[IDEMPOTENCY_INDEX]
    assert list(keyed_only) == [IDEMPOTENCY_INDEX]
    assert keyed_only[IDEMPOTENCY_INDEX].endswith("WHERE (idempotency_key IS NOT NULL)")
    assert reversed_ == every_audit
    # Back to a constraint, as Django made it, not an index alone.
    assert IDEMPOTENCY_INDEX in constraints


@pytest.mark.django_db
def test_no_index_of_plumb_is_covered_by_another():
    assert covered_indexes() == []


@pytest.mark.django_db(transaction=True)
def test_an_upgrade_drops_the_covered_indexes_and_keeps_the_foreign_keys():
    before = [
        ("audits", "0025_submitter_index_submitted_only"),
        ("reaudit", "0005_catch_up_entry_removed"),
        ("webhooks", "0003_delivery_job_row"),
    ]
    try:
        migrate(before)
        covered = covered_indexes()
        keys = foreign_keys()
        migrate_to_latest()
        after = covered_indexes()
        keys_after = foreign_keys()
    finally:
        migrate_to_latest()
    assert {short for _, short, _ in covered} == FOREIGN_KEY_INDEXES
    assert after == []
    # Only the indexes changed: no key was dropped and checked again over the whole table.
    assert keys and keys_after == keys
