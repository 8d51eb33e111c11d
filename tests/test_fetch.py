"""The audit's fetch and analysis against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import time

import pytest

from audits.analysis import audit_result
from jobs.errors import Permanent, RateLimited, Transient
from outbound.client import build_client
from outbound.integrations.page import fetch_page
from outbound.urls import InvalidURL, normalize_url

# Every fetch asks admission about its host; a host never seen is looked up in the database.
pytestmark = pytest.mark.django_db


def fetch(url, **overrides):
    options = {
        "timeout": 5.0,
        "max_bytes": 1024 * 1024,
        "user_agent": "PlumbTest/1",
        "allow_private": True,
    }
    options.update(overrides)
    return fetch_page(url, **options)


def test_it_follows_redirects_and_records_the_chain(site):
    page = fetch(f"{site.base_url}/redirect")
    assert page.final_url == f"{site.base_url}/"
    assert [hop["status_code"] for hop in page.redirects] == [301, 302]
    assert page.redirects[0]["url"] == f"{site.base_url}/redirect"


def test_it_reports_what_a_page_says_about_itself(site):
    result = audit_result(fetch(f"{site.base_url}/"))
    assert result["status_code"] == 200
    assert result["title"] == "Plumb demo"
    assert result["meta_description"] == "Plumb demo on the Plumb demo site"
    assert result["canonical"] == f"{site.base_url}/"
    assert result["h1_count"] == 1
    assert result["noindex"] is False
    assert result["link_counts"] == {"internal": 6, "external": 1}
    assert result["missing_security_headers"] == []
    assert result["ttfb_ms"] > 0 and result["total_ms"] >= result["ttfb_ms"]


def test_it_lists_the_missing_security_headers(site):
    result = audit_result(fetch(f"{site.base_url}/no-security-headers"))
    assert result["missing_security_headers"] == [
        "content-security-policy", "x-content-type-options", "referrer-policy",
    ]  # fmt: skip


def test_it_sees_robots_noindex(site):
    assert audit_result(fetch(f"{site.base_url}/noindex"))["noindex"] is True


def test_a_non_html_page_is_reported_not_parsed(site):
    result = audit_result(fetch(f"{site.base_url}/report.pdf"))
    assert result["is_html"] is False
    assert result["content_type"] == "application/pdf"
    assert result["title"] is None


def test_a_4xx_page_is_a_result_not_an_error(site):
    result = audit_result(fetch(f"{site.base_url}/missing"))
    assert result["status_code"] == 404


def test_a_huge_page_is_truncated_at_the_cap(site):
    page = fetch(f"{site.base_url}/huge?mb=4", max_bytes=256 * 1024)
    assert page.truncated is True
    assert len(page.body) == 256 * 1024
    assert audit_result(page)["title"] == "Huge"


def test_a_slow_page_times_out_as_a_transient_error(site):
    started = time.monotonic()
    with pytest.raises(Transient, match="timed out"):
        fetch(f"{site.base_url}/slow?delay=3", timeout=0.5)
    assert time.monotonic() - started < 2


def test_a_body_without_end_ends_within_the_timeout(site):
    started = time.monotonic()
    with pytest.raises(Transient, match="timed out"):
        fetch(f"{site.base_url}/trickle", timeout=1.5, max_bytes=10 * 1024 * 1024)
    assert time.monotonic() - started < 3


def test_a_500_is_transient_and_the_page_recovers(site):
    url = f"{site.base_url}/flaky?key=recover&fail=1"
    with pytest.raises(Transient) as failure:
        fetch(url)
    assert failure.value.status_code == 500
    assert fetch(url).status_code == 200


def test_a_retry_after_on_a_503_is_kept_and_holds_the_host(site):
    # The parser itself is tested in test_retry.
    with pytest.raises(Transient) as failure:
        fetch(f"{site.base_url}/busy?key=ra&fail=1&retry_after=120")
    assert failure.value.status_code == 503
    assert failure.value.retry_after == 120
    # The host asked for 120 s: the next call to it waits without a request.
    with pytest.raises(RateLimited):
        fetch(f"{site.base_url}/flaky?key=no-ra&fail=1")
    assert site.hits["/flaky"] == 0


def test_a_500_without_retry_after_leaves_the_delay_to_the_policy(site):
    with pytest.raises(Transient) as failure:
        fetch(f"{site.base_url}/flaky?key=no-ra&fail=1")
    assert failure.value.retry_after is None


def test_a_redirect_loop_fails_for_good(site):
    with pytest.raises(Permanent, match="more than 5 redirects"):
        fetch(f"{site.base_url}/loop")


def test_a_refused_connection_is_transient():
    with pytest.raises(Transient, match="could not fetch"):
        fetch("http://127.0.0.1:9/")


def test_private_targets_are_refused_unless_allowed(site):
    with pytest.raises(Permanent, match="loopback"):
        fetch(f"{site.base_url}/", allow_private=False)


def test_it_sends_a_user_agent_naming_plumb(site, settings):
    client = build_client(timeout=1, user_agent=settings.AUDIT_USER_AGENT, allow_private=True)
    assert client.headers["user-agent"].startswith("Plumb/")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("HTTPS://Example.ORG", "https://example.org/"),
        ("http://example.org:80/a?b=1#frag", "http://example.org/a?b=1"),
        ("https://user:pw@example.org:8443/x", "https://user:pw@example.org:8443/x"),
        ("  https://bücher.example/  ", "https://xn--bcher-kva.example/"),
    ],
)
def test_urls_are_normalized(raw, expected):
    assert normalize_url(raw).url == expected


@pytest.mark.parametrize(
    "raw",
    [
        "ftp://example.org/",
        "example.org",
        "http://",
        "https://exa mple.org/",
        "http://x:99999/",
        "",
    ],
)
def test_bad_urls_are_refused_with_a_reason(raw):
    with pytest.raises(InvalidURL):
        normalize_url(raw)


def test_no_fetch_carries_a_cookie_an_earlier_one_was_given(http_server):
    # One process's client serves every client's audits: a cookie set for one audit must
    # not go with the next fetch of that site, nor along its own redirect.
    seen: list[str | None] = []

    def respond(request):
        seen.append(request.headers.get("Cookie"))
        if request.path == "/hop":
            return 302, {"Location": "/page", "Set-Cookie": "hop=1; Path=/"}, b""
        return 200, {"Content-Type": "text/html", "Set-Cookie": "session=abc; Path=/"}, b"<p>x"

    server = http_server(respond=respond)
    fetch(f"{server.url}/page")
    page = fetch(f"{server.url}/hop")
    assert page.final_url == f"{server.url}/page"
    assert seen == [None, None, None]
