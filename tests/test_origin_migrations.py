"""The upgrade to origin keys (issue 31.3): rows and breakers stored under the old spellings."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.breakers import BREAKERS_KEY, FAILURE, Breaker
from tests.database import migrate, migrate_to_latest

BEFORE = [("audits", "0015_audit_client"), ("jobs", "0004_dead_letter_task_failed_index")]
AFTER = [("audits", "0016_origin_hosts"), ("jobs", "0005_breakers_by_origin")]


@pytest.fixture
def old_schema(transactional_db):
    yield migrate(BEFORE)
    # Back to the latest schema, whatever migrations came after these.
    migrate_to_latest()


def test_pages_and_shared_links_stored_with_a_trailing_dot_are_respelled(old_schema):
    Page = old_schema.get_model("audits", "Page")
    SharedLink = old_schema.get_model("audits", "SharedLink")
    dotted = Page.objects.create(url="http://u@victim.com.:8080/a?b", domain="victim.com.")
    Page.objects.create(url="http://taken.example/", domain="taken.example")
    taken = Page.objects.create(url="http://taken.example./", domain="taken.example.")
    ipv6 = Page.objects.create(url="http://[0:0::1]:81/", domain="0:0::1")
    plain = Page.objects.create(url="http://plain.example/x.", domain="plain.example")
    link = SharedLink.objects.create(url="https://victim.com.:444/x")
    SharedLink.objects.create(url="http://shared.example/")
    kept = SharedLink.objects.create(url="http://shared.example./")

    apps = migrate(AFTER)
    Page = apps.get_model("audits", "Page")
    SharedLink = apps.get_model("audits", "SharedLink")

    def page(row):
        return Page.objects.values_list("url", "domain").get(id=row.id)

    assert page(dotted) == ("http://u@victim.com:8080/a?b", "victim.com")
    # Its URL is another page's: it keeps it (pages are never merged), in one domain.
    assert page(taken) == ("http://taken.example./", "taken.example")
    assert page(ipv6) == ("http://[::1]:81/", "[::1]")
    assert page(plain) == ("http://plain.example/x.", "plain.example")
    assert SharedLink.objects.get(id=link.id).url == "https://victim.com:444/x"
    assert SharedLink.objects.get(id=kept.id).url == "http://shared.example./"


def test_breakers_keyed_by_a_bare_host_are_forgotten(old_schema, redis_client, settings):
    CircuitBreaker = old_schema.get_model("jobs", "CircuitBreaker")
    settings.BREAKER_MIN_CALLS = 2
    old, new = Breaker("audits.run_audit", "victim"), Breaker("audits.run_audit", "http://victim")
    for breaker in (old, new):
        for _ in range(2):
            breaker.record(breaker.acquire(), FAILURE)
    # record_transition mirrored both in today's table; the old one is what an upgrade finds.
    CircuitBreaker.objects.get_or_create(
        task_name="webhooks.deliver", host="127.0.0.1", defaults={"changed_at": timezone.now()}
    )

    apps = migrate(AFTER)
    CircuitBreaker = apps.get_model("jobs", "CircuitBreaker")
    assert sorted(CircuitBreaker.objects.values_list("host", flat=True)) == ["http://victim"]
    assert {m.decode() for m in redis_client.smembers(BREAKERS_KEY)} == {new.key}
    assert not redis_client.exists(old.key)
    assert new.state()["state"] == "open"
