"""A page of any shape gives a bounded audit (issue 26.4): what it stores, what the API
serves and what the admin renders are bounded by AUDIT_MAX_LINKS and the URL length."""

from __future__ import annotations

import json

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.urls import reverse

from audits import services, submission
from audits.models import Audit, LinkCheck
from outbound.urls import MAX_URL_LENGTH, normalize_url
from tests.hostile_pages import HostilePages, link_stuffed_page
from tests.workers import wait_for


@pytest.fixture
def hostile():
    server = HostilePages().start()
    yield server
    server.stop()


@pytest.fixture
def staff_client(client, db):
    admin = get_user_model().objects.create_superuser("admin", "admin@example.org", "pw")
    client.force_login(admin)
    return client


def largest_audit(hostile, settings) -> Audit:
    """The largest audit the caps allow: AUDIT_MAX_LINKS external links, each as long
    as a stored URL may be, plus a 100,000-character one, every link check reported."""
    settings.AUDIT_MAX_LINK_CHECKS = 0  # every link a row, none fetched
    # Another host than the page's (127.0.0.1): the links are external.
    hostile.pages["/"] = (
        link_stuffed_page(
            f"localhost:{hostile.server_address[1]}",
            links=settings.AUDIT_MAX_LINKS + 50,
            length=MAX_URL_LENGTH,
        ),
        None,
        "text/html",
    )
    page = submission.get_or_create_page(normalize_url(f"{hostile.url}/"))
    audit = Audit.objects.create(page=page, task_id="t")
    services.execute_audit(str(audit.id))
    return Audit.objects.get(id=audit.id)


@pytest.mark.django_db
def test_the_largest_audit_stores_capped_links_of_bounded_length(hostile, settings):
    if connection.vendor != "postgresql":
        pytest.skip("varchar(2048) is enforced by PostgreSQL, not SQLite")
    audit = largest_audit(hostile, settings)
    assert audit.status == Audit.Status.SUCCEEDED, audit.error
    result = audit.result
    assert len(result["external_links"]) == settings.AUDIT_MAX_LINKS
    assert result["links_over_cap"] == 50
    assert result["links_too_long"] == 1  # the 100,000-character link: counted, not stored
    assert LinkCheck.objects.filter(audit=audit).count() == settings.AUDIT_MAX_LINKS
    assert max(len(url) for url in LinkCheck.objects.values_list("url", flat=True)) <= (
        MAX_URL_LENGTH
    )


@pytest.mark.django_db
def test_the_admin_renders_the_largest_audit_abridged(hostile, settings, staff_client):
    audit = largest_audit(hostile, settings)
    response = staff_client.get(reverse("admin:audits_audit_change", args=[audit.id]))
    assert response.status_code == 200
    page = response.content.decode()
    assert f"... {settings.AUDIT_MAX_LINKS - 20} more" in page  # the links list, abridged
    full = json.dumps(audit.result, indent=2)
    assert len(page) < len(full) + 2_000_000  # the JSON is not inlined whole


@pytest.mark.django_db
def test_a_normal_page_keeps_its_result_shape(hostile, settings):
    hostile.pages["/"] = (
        b"<title> Hello\n world </title><a href='http://localhost/x'>x</a>",
        None,
        "text/html",
    )
    settings.AUDIT_MAX_LINK_CHECKS = 0
    page = submission.get_or_create_page(normalize_url(f"{hostile.url}/"))
    audit = Audit.objects.create(page=page, task_id="t")
    services.execute_audit(str(audit.id))
    result = Audit.objects.get(id=audit.id).result
    assert result["title"] == "Hello world"
    assert result["external_links"] == ["http://localhost/x"]
    assert (result["links_over_cap"], result["links_too_long"]) == (0, 0)
    assert [link["url"] for link in result["links"]] == ["http://localhost/x"]


@pytest.mark.slow
def test_hostile_pages_give_bounded_audits_through_a_worker(live_server, hostile, start_worker):
    links = link_stuffed_page(f"localhost:{hostile.server_address[1]}", links=100_000)
    hostile.pages["/links"] = (links, None, "text/html")
    # 50 MB of binary bytes sent as HTML: the fetch reads its byte cap and stops.
    hostile.pages["/huge"] = (bytes(range(256)) * 4096, 50 * 1024 * 1024, "text/html")
    deep = "<title>Deep</title>" + "<div>" * 10_000 + "</div>" * 10_000
    hostile.pages["/deep"] = (deep.encode(), None, "text/html")
    worker = start_worker("audits", env={"AUDIT_MAX_LINK_CHECKS": "0", "AUDIT_MAX_LINKS": "300"})
    submitted = {}
    for path in ("/links", "/huge", "/deep"):
        response = httpx.post(
            f"{live_server.url}/api/audits", json={"url": hostile.url + path}, timeout=10
        )
        assert response.status_code == 202, response.text
        submitted[path] = response.json()["id"]

    def finished(audit_id):
        response = httpx.get(f"{live_server.url}/api/audits/{audit_id}", timeout=10)
        return response.json()["status"] in {"succeeded", "failed"} and response

    served = {
        path: wait_for(lambda a=audit_id: finished(a), timeout=60, show=[worker])
        for path, audit_id in submitted.items()
    }
    results = {path: response.json()["result"] for path, response in served.items()}
    assert all(response.json()["status"] == "succeeded" for response in served.values()), (
        worker.output()
    )
    assert len(results["/links"]["external_links"]) == 300
    assert results["/links"]["links_over_cap"] == 99_700
    assert results["/links"]["links_too_long"] == 1
    assert len(results["/links"]["links"]) == 300
    assert len(served["/links"].content) < 300 * 2 * MAX_URL_LENGTH  # bounded by the caps
    assert results["/huge"]["truncated"] is True
    assert results["/huge"]["bytes"] == 5 * 1024 * 1024
    assert (results["/deep"]["title"], results["/deep"]["truncated"]) == ("Deep", True)
    assert LinkCheck.objects.count() == 300
