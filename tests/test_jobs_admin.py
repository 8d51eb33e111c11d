"""The admin pages for breakers and dead letters (replay with a worker is in test_dead_letters)."""

from __future__ import annotations

from django.utils import timezone

from jobs.breakers import FAILURE, Breaker
from jobs.models import CircuitBreaker, DeadLetter
from tests.test_metrics import scrape


def test_an_operator_sees_an_open_breaker_and_closes_it_by_hand(
    admin_client, redis_client, settings, caplog
):
    settings.BREAKER_MIN_CALLS, settings.BREAKER_OPEN_SECONDS = 2, 600
    breaker = Breaker("audits.run_audit", "slow.example")
    for _ in range(2):
        breaker.record(breaker.acquire(), FAILURE)
    row = CircuitBreaker.objects.get(host="slow.example")

    page = admin_client.get("/admin/jobs/circuitbreaker/").content.decode()
    assert "slow.example" in page and "open until" in page

    with caplog.at_level("INFO", logger="jobs.breakers"):
        response = admin_client.post(
            "/admin/jobs/circuitbreaker/",
            {"action": "close_breakers", "_selected_action": [row.id]},
        )
    assert response.status_code == 302
    assert breaker.state()["state"] == "closed"
    assert breaker.acquire().decision == "allow"
    row.refresh_from_db()
    assert (row.state, row.last_transition) == ("closed", "closed_by_operator")
    closed = (("key_class", "host"), ("to_state", "closed"))
    assert scrape()[("plumb_breaker_transitions_total", closed)] == 1
    (record,) = [r for r in caplog.records if r.getMessage() == "breaker.closed_by_operator"]
    assert (record.by, record.previous) == ("admin", "open")


def test_dead_letters_are_listed_and_filtered_by_task_reason_and_replay_state(admin_client):
    now = timezone.now()
    common = {"first_failed_at": now, "last_failed_at": now, "kwargs": {}}
    DeadLetter.objects.create(
        task_name="audits.run_audit", task_id="exhausted-1", args=["a"],
        reason=DeadLetter.Reason.ATTEMPTS_EXHAUSTED, exception="TransientFetchError: answered 503",
        traceback="Traceback (most recent call last): ...", attempts=5, **common,
    )  # fmt: skip
    DeadLetter.objects.create(
        task_name="audits.run_audit", task_id="replayed-1", args=["b"],
        reason=DeadLetter.Reason.ATTEMPTS_EXHAUSTED, replayed_at=now, replayed_by="ops",
        exception="TransientFetchError: timed out", **common,
    )  # fmt: skip
    DeadLetter.objects.create(
        task_name="", task_id="", args=None, reason=DeadLetter.Reason.MALFORMED,
        exception="not a message envelope", raw_message="queue entry: junk", **common,
    )  # fmt: skip

    shown_as = {
        "exhausted": "answered 503",
        "replayed": "timed out",
        "junk": "not a message envelope",
    }

    def listed(query: str) -> set[str]:
        page = admin_client.get(f"/admin/jobs/deadletter/?{query}").content.decode()
        return {name for name, text in shown_as.items() if text in page}

    assert listed("") == {"exhausted", "replayed", "junk"}
    assert listed("replayed=no") == {"exhausted", "junk"}
    assert listed("replayed=yes") == {"replayed"}
    assert listed("reason__exact=malformed") == {"junk"}
    assert listed("task_name=audits.run_audit") == {"exhausted", "replayed"}

    exhausted = DeadLetter.objects.get(task_id="exhausted-1")
    detail = admin_client.get(f"/admin/jobs/deadletter/{exhausted.id}/change/")
    assert "Traceback (most recent call last)" in detail.content.decode()


def test_replaying_a_dead_letter_that_cannot_be_decoded_is_refused(admin_client):
    now = timezone.now()
    junk = DeadLetter.objects.create(
        task_name="", args=None, reason=DeadLetter.Reason.MALFORMED,
        first_failed_at=now, last_failed_at=now,
    )  # fmt: skip
    response = admin_client.post(
        "/admin/jobs/deadletter/",
        {"action": "replay", "_selected_action": [junk.id]},
        follow=True,
    )
    assert "Skipped dead letter" in response.content.decode()
    junk.refresh_from_db()
    assert junk.replayed_at is None


def test_dead_letters_come_only_from_workers_never_from_the_add_form(admin_client):
    assert admin_client.get("/admin/jobs/deadletter/add/").status_code == 403
    listing = admin_client.get("/admin/jobs/deadletter/").content.decode()
    assert "/admin/jobs/deadletter/add/" not in listing


def test_the_dashboards_dead_letter_link_opens_the_dead_letters(admin_client, redis_client):
    page = admin_client.get("/dashboard/").content.decode()
    assert 'href="/admin/jobs/deadletter/"' in page
