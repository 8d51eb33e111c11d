"""Plumb's own responses carry a Content-Security-Policy, and HSTS when it is configured."""

from __future__ import annotations

import pytest
from django.test import Client

from audits.analysis import audit_result
from outbound.integrations.page import fetch_page

pytestmark = pytest.mark.django_db(transaction=True)


def test_plumb_s_own_audit_of_its_admin_login_finds_no_missing_security_header(live_server):
    """The report: Plumb's audit of its own /admin/login/ said CSP was missing."""
    page = fetch_page(
        f"{live_server.url}/admin/login/", timeout=10, max_bytes=1_000_000,
        user_agent="PlumbTest/1", allow_private=True,
    )  # fmt: skip
    assert audit_result(page)["missing_security_headers"] == []


@pytest.mark.parametrize("path", ["/admin/login/", "/dashboard/", "/api/schema", "/healthz"])
def test_every_response_forbids_inline_and_foreign_scripts(client, path):
    policy = client.get(path)["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";") if d.strip())
    assert directives["script-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert directives["object-src"] == "'none'"


def test_hsts_is_sent_over_https_when_configured(settings):
    # SecurityMiddleware reads its settings when it is built: a fresh client each time.
    assert "Strict-Transport-Security" not in Client().get("/healthz", secure=True)
    settings.SECURE_HSTS_SECONDS = 31536000
    assert "Strict-Transport-Security" not in Client().get("/healthz")  # never over http
    response = Client().get("/healthz", secure=True)
    assert response["Strict-Transport-Security"] == "max-age=31536000"


def test_a_proxy_s_https_header_counts_only_when_configured(settings):
    settings.SECURE_HSTS_SECONDS = 60
    forged = Client().get("/healthz", HTTP_X_FORWARDED_PROTO="https")
    assert "Strict-Transport-Security" not in forged
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    proxied = Client().get("/healthz", HTTP_X_FORWARDED_PROTO="https")
    assert proxied["Strict-Transport-Security"] == "max-age=60"
