"""A finished audit's delivery is owed from the moment the finish commits.

The delivery row is written in the finish's own transaction; only its publish waits for
the commit. Before, the row itself was written by an on-commit callback: a worker
killed (or a database that failed over) between the commit and that callback left a
finished audit whose callback was never delivered, and nothing in PostgreSQL owed it
(found by bench/soak.py).
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError, transaction

from audits import pages
from audits.models import NO_PREVIOUS_SUCCESS, Audit, Page, PreviousSuccess
from webhooks import deliver
from webhooks.models import Delivery

CALLBACK = "https://receiver.example/hook"


def running_audit_with_callback() -> Audit:
    page = Page.objects.create(url="https://example.org/outbox", domain="example.org")
    return Audit.objects.create(
        page=page, status=Audit.Status.RUNNING, callback_url=CALLBACK, callback_secret=""
    )


def test_the_delivery_commits_with_the_finish_even_if_no_commit_callback_runs(
    db, django_capture_on_commit_callbacks
):
    audit = running_audit_with_callback()
    # The commit happens; the callbacks after it never run, as when the process dies.
    with django_capture_on_commit_callbacks(execute=False):
        assert Audit.objects.finish(audit.id, status=Audit.Status.SUCCEEDED, result={})

    delivery = Delivery.objects.get(audit=audit)
    assert (delivery.event, delivery.url, delivery.status) == (
        "audit.finished",
        CALLBACK,
        "pending",
    )


def test_a_finish_that_rolls_back_owes_nothing(db):
    audit = running_audit_with_callback()
    with pytest.raises(RuntimeError), transaction.atomic():
        Audit.objects.finish(audit.id, status=Audit.Status.SUCCEEDED, result={})
        raise RuntimeError("the finish's transaction fails")
    assert Audit.objects.get(id=audit.id).status == Audit.Status.RUNNING
    assert not Delivery.objects.filter(audit=audit).exists()


@pytest.mark.parametrize("event", ["audit.finished", "audit.changed"])
def test_a_finish_whose_delivery_cannot_be_written_is_not_finished(db, monkeypatch, event):
    # A finish compared with what its claim read is one round trip when the listeners owe
    # nothing; one that owes a delivery (its own callback, or a change and a page
    # callback) writes it in its transaction, so a failed write leaves it to run again.
    page = Page.objects.create(url="https://example.org/owed", domain="example.org")
    if event == "audit.finished":
        audit = running_audit_with_callback()
        previous, result = NO_PREVIOUS_SUCCESS, {}
    else:
        pages.update(page, callback_url=CALLBACK, callback_secret="whsec_" + "A" * 32)
        before = Audit.objects.create(page=page, status=Audit.Status.SUCCEEDED,
                                      result={"title": "One"})  # fmt: skip
        audit = Audit.objects.create(page=page, status=Audit.Status.RUNNING)
        previous, result = PreviousSuccess(before.id, before.result), {"title": "Two"}

    def cannot_write(audit_id):
        raise DatabaseError("the delivery's insert fails")

    monkeypatch.setattr(deliver, "create_delivery", cannot_write)
    monkeypatch.setattr(deliver, "create_change_delivery", cannot_write)
    with pytest.raises(DatabaseError):
        Audit.objects.finish(
            audit.id, status=Audit.Status.SUCCEEDED, result=result, previous=previous
        )
    assert Audit.objects.get(id=audit.id).status == Audit.Status.RUNNING
