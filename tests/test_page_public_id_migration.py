"""Migration 0014 gives every existing page its own random public id and leaves every
foreign key to the page (audits, nightly placements, deliveries) as it was."""

from __future__ import annotations

import uuid

import pytest

from tests.database import migrate, migrate_to_latest

BEFORE = [("audits", "0013_shared_link_checked_index")]
AFTER = [("audits", "0014_page_owner_public_id_api_tokens")]


@pytest.mark.django_db(transaction=True)
def test_existing_pages_get_distinct_public_ids_and_keep_their_audits():
    old = migrate(BEFORE)
    Page, Audit = old.get_model("audits", "Page"), old.get_model("audits", "Audit")
    pages = [
        Page.objects.create(url=f"https://example.org/{n}", domain="example.org") for n in range(5)
    ]
    audits = {Audit.objects.create(page=page, task_id="t").id: page.id for page in pages}
    try:
        new = migrate(AFTER)
        Page, Audit = new.get_model("audits", "Page"), new.get_model("audits", "Audit")
        public_ids = list(Page.objects.values_list("public_id", flat=True))
        assert len(public_ids) == 5 and len(set(public_ids)) == 5
        assert all(isinstance(value, uuid.UUID) and value.version == 4 for value in public_ids)
        assert dict(Audit.objects.values_list("id", "page_id")) == audits
        assert set(Page.objects.values_list("owner", flat=True)) == {None}
    finally:
        migrate_to_latest()
