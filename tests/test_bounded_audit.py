"""A page of any shape gives a bounded audit (issues 26.4 and 31.5): what a worker holds
while it reads the page, what the audit stores, what the API serves, what a webhook
carries and what the admin renders are bounded by AUDIT_MAX_LINKS, WEBHOOK_MAX_LINKS and
the URL length."""

from __future__ import annotations

import json
import threading

import httpx2
import psutil
import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.urls import reverse

from audits import services, submission
from audits.models import Audit, LinkCheck
from audits.summary import abridged_result
from outbound.urls import MAX_URL_LENGTH, normalize_url
from tests.hostile_pages import (
    HostilePages,
    distinct_attributes,
    link_stuffed_page,
    one_tag_page,
)
from tests.workers import wait_for
from webhooks.deliver import payload_for


@pytest.fixture
def hostile(http_server):
    return http_server(HostilePages())


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
        response = httpx2.post(
            f"{live_server.url}/api/audits", json={"url": hostile.url + path}, timeout=10
        )
        assert response.status_code == 202, response.text
        submitted[path] = response.json()["id"]

    def finished(audit_id):
        response = httpx2.get(f"{live_server.url}/api/audits/{audit_id}", timeout=10)
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
    # No tree, no nesting limit: the page is read to its end, as a browser reads it.
    assert (results["/deep"]["title"], results["/deep"]["truncated"]) == ("Deep", False)
    assert LinkCheck.objects.count() == 300


def same_host_anchors(count: int) -> str:
    """The security review's page: `count` distinct same-host anchors (4.5 MB for 200,000)."""
    return "".join(f"<a href=/p/{i}>x</a>" for i in range(count))


# The most a worker may grow while it audits one hostile page: the page itself (5 MiB),
# its text and a tree within AUDIT_MAX_TREE_ELEMENTS, with room for the sampling's noise.
PEAK_GROWTH_BOUND = 60 * 1024 * 1024


def audited_with_peak_growth(
    live_server, hostile, start_worker, path: str, body: bytes, env: dict | None = None
):
    """(the audit of `body` served at `path`, how much the worker's memory grew meanwhile),
    audited by a worker started as make run starts it (with `env` besides)."""
    hostile.pages[path] = (body, None, "text/html")
    worker = start_worker(
        "audits",
        concurrency=django_settings.AUDITS_WORKER_CONCURRENCY,  # as make run starts it
        pool="threads",
        env={"AUDIT_MAX_LINK_CHECKS": "0", **(env or {})},
    )
    process = psutil.Process(worker.process.pid)
    before = process.memory_info().rss
    peak = before
    sampling = True

    def sample():
        nonlocal peak
        while sampling:
            peak = max(peak, process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    response = httpx2.post(
        f"{live_server.url}/api/audits", json={"url": hostile.url + path}, timeout=10
    )
    assert response.status_code == 202, response.text

    def finished():
        audit = Audit.objects.get(id=response.json()["id"])
        return audit.status in Audit.FINISHED and audit

    audit = wait_for(finished, timeout=90, show=[worker])
    sampling = False
    sampler.join()
    assert audit.status == Audit.Status.SUCCEEDED, audit.error
    return audit, peak - before


@pytest.mark.slow
def test_a_page_of_200000_anchors_is_audited_in_bounded_memory(live_server, hostile, start_worker):
    external = "".join(f"<a href='http://localhost/{i}'>e</a>" for i in range(500))
    body = f"<title>Links</title>{same_host_anchors(200_000)}{external}".encode()
    audit, growth = audited_with_peak_growth(live_server, hostile, start_worker, "/anchors", body)
    result = audit.result
    assert result["link_counts"] == {"internal": 200_000, "external": 500}
    assert result["links_truncated"] is True
    assert len(result["external_links"]) == 100  # AUDIT_MAX_LINKS
    assert result["links_over_cap"] == 400
    assert LinkCheck.objects.filter(audit=audit).count() == 100
    # The whole lxml tree and a set of every link took 150 MB for this one page.
    assert growth < PEAK_GROWTH_BOUND, f"{growth / 2**20:.0f} MiB"


@pytest.mark.slow
@pytest.mark.parametrize(
    "markup",
    [
        # A million comments, no element: each a node of the tree (155 MiB in one).
        pytest.param(b"<!-->", id="comments"),
        # Five million NULs: each a parse error Lexbor keeps a record of (88 MiB).
        pytest.param(b"\x00", id="nuls"),
    ],
)
def test_a_page_of_markup_without_elements_is_audited_in_bounded_memory(
    live_server, hostile, start_worker, markup
):
    title = b"<title>Markup</title>"
    body = title + markup * ((5 * 1024 * 1024 - len(title)) // len(markup))
    audit, growth = audited_with_peak_growth(live_server, hostile, start_worker, "/markup", body)
    assert audit.result["title"] == "Markup"
    assert growth < PEAK_GROWTH_BOUND, f"{growth / 2**20:.0f} MiB"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("attributes", "reason"),
    [
        # Lexbor's tree costs their square, in C no time limit interrupts: 40,000 took
        # 3.7 s in one process, 80,000 take tens of seconds. The child is given 2.
        pytest.param(distinct_attributes(80_000), "too_costly_for_a_tree", id="distinct"),
        # 196 MiB in one process: within the child's 256, outside the worker.
        pytest.param(b" a" * (5 * 1024 * 1024 // 2), None, id="duplicate"),
    ],
)
def test_a_tag_of_many_attributes_is_parsed_outside_the_worker(
    live_server, hostile, start_worker, attributes, reason
):
    audit, growth = audited_with_peak_growth(
        live_server, hostile, start_worker, "/attributes", one_tag_page(attributes),
        env={"AUDIT_TREE_SECONDS": "2"},
    )  # fmt: skip
    by_id = {item["id"]: item for item in audit.result["findings"]}
    assert audit.result["title"] == "Attributes"
    assert by_id["link-text"]["details"].get("reason") == reason
    assert growth < PEAK_GROWTH_BOUND, f"{growth / 2**20:.0f} MiB"


def long_links_page(hostile) -> None:
    """The security review's page: 300 links of 2,040 characters (620 KB)."""
    hostile.pages["/"] = (
        link_stuffed_page(f"localhost:{hostile.server_address[1]}", links=300, length=2040),
        None,
        "text/html",
    )


@pytest.mark.django_db
def test_a_page_of_300_long_links_stores_a_bounded_result(hostile, settings):
    settings.AUDIT_MAX_LINK_CHECKS = 0
    long_links_page(hostile)
    page = submission.get_or_create_page(normalize_url(f"{hostile.url}/"))
    audit = Audit.objects.create(page=page, task_id="t")
    services.execute_audit(str(audit.id))
    audit = Audit.objects.get(id=audit.id)
    assert audit.status == Audit.Status.SUCCEEDED
    result = audit.result
    assert len(result["links"]) == len(result["external_links"]) == settings.AUDIT_MAX_LINKS
    assert result["link_check"]["outcomes"] == {"skipped": 100}
    assert (result["links_over_cap"], result["links_truncated"]) == (200, True)
    assert LinkCheck.objects.filter(audit=audit).count() == 100
    # 1.25 MB with 300 links kept: now at most AUDIT_MAX_LINKS links of 2 KB, twice.
    assert len(json.dumps(result)) < 450_000


@pytest.mark.django_db
def test_a_page_of_300_long_links_makes_a_small_webhook_payload(hostile, settings):
    settings.AUDIT_MAX_LINK_CHECKS = 0
    settings.PUBLIC_BASE_URL = "https://plumb.example"
    long_links_page(hostile)
    page = submission.get_or_create_page(normalize_url(f"{hostile.url}/"))
    audit = Audit.objects.create(page=page, task_id="t")
    services.execute_audit(str(audit.id))
    payload = payload_for(Audit.objects.get(id=audit.id))
    # 1.25 MB before: now WEBHOOK_MAX_LINKS (10) links of 2 KB, twice, and the rest.
    assert len(json.dumps(payload)) < 64 * 1024
    data = payload["data"]
    assert data["links"]["self"] == f"https://plumb.example/api/audits/{audit.id}"
    result = data["result"]
    assert len(result["links"]) == len(result["external_links"]) == 10
    assert result["links_truncated"] is True
    assert result["link_check"]["outcomes"] == {"skipped": 100}
    assert result["link_counts"]["external"] == 300


def test_an_abridged_result_lists_broken_links_first():
    links = [{"url": f"https://x.example/{i:03}", "status": "ok"} for i in range(50)]
    links[40]["status"] = "broken"
    links[7]["status"] = "rate_limited_pending"
    result = {"links": links, "external_links": [link["url"] for link in links]}
    abridged = abridged_result(result, 3)
    assert [link["url"] for link in abridged["links"]] == [
        "https://x.example/040",
        "https://x.example/007",
        "https://x.example/000",
    ]
    assert abridged["external_links"] == sorted(link["url"] for link in abridged["links"])
    assert abridged["links_truncated"] is True
    assert abridged_result(result, 50) is result
