"""Link checks: what each link is reported as, the audit's join and deadline, politeness."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from audits import linkcheck, submission
from audits.models import Audit, LinkCheck
from outbound.integrations import links
from outbound.integrations.github import GitHubCredentials
from outbound.integrations.links import check_http, github_repository
from outbound.urls import normalize_url
from tests.fake_github import LinkedPage
from tests.workers import wait_for

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://github.com/psf/requests", ("psf", "requests")),
        ("https://github.com/psf/requests/", ("psf", "requests")),
        ("https://www.github.com/psf/requests.git", ("psf", "requests")),
        ("https://github.com/psf/requests/issues", None),
        ("https://github.com/features/actions", None),
        ("https://github.com/psf", None),
        ("https://gist.github.com/psf/requests", None),
    ],
)
def test_it_knows_a_github_repository_link(url, expected):
    assert github_repository(url) == expected


def test_links_are_reported_ok_redirected_broken_or_skipped(site, settings, redis_client):
    settings.LINKCHECK_PER_HOST_RATE = 100
    assert check_http(f"{site.base_url}/").status == "ok"
    redirected = check_http(f"{site.base_url}/redirect")
    assert (redirected.status, redirected.final_url) == ("redirected", f"{site.base_url}/")
    assert (check_http(f"{site.base_url}/missing").status, 404) == ("broken", 404)
    assert check_http("http://does-not-exist.invalid/").detail == "host does not resolve"
    settings.AUDIT_ALLOW_PRIVATE_TARGETS = False
    assert check_http(f"{site.base_url}/").status == "skipped"  # the SSRF guard holds here too


def test_without_github_credentials_a_repository_link_is_a_plain_link(settings):
    settings.GITHUB_TOKEN = ""
    assert GitHubCredentials.from_settings() is None


def checking_audit(site, links: list[str], *, cap: int = 100, settings=None) -> Audit:
    page = submission.get_or_create_page(normalize_url(f"{site.base_url}/"))
    audit = Audit.objects.create(page=page, task_id="t", status=Audit.Status.RUNNING)
    linkcheck.start_link_checks(str(audit.id), {"status_code": 200, "external_links": links})
    return Audit.objects.get(id=audit.id)


def test_the_last_check_to_finish_finishes_the_audit(site, redis_client):
    audit = checking_audit(site, [f"{site.base_url}/", f"{site.base_url}/missing"])
    assert audit.status == Audit.Status.CHECKING_LINKS
    first, second = audit.link_checks.order_by("url")
    linkcheck.run_link_check(first.id)
    assert Audit.objects.get(id=audit.id).status == Audit.Status.CHECKING_LINKS
    linkcheck.run_link_check(second.id)
    done = Audit.objects.get(id=audit.id)
    assert done.status == Audit.Status.SUCCEEDED
    assert [link["status"] for link in done.result["links"]] == ["ok", "broken"]
    assert done.result["status_code"] == 200  # the page's own result is kept
    assert linkcheck.run_link_check(first.id) is None  # a duplicate delivery changes nothing


def test_links_over_the_cap_are_skipped(site, settings, redis_client):
    settings.AUDIT_MAX_LINK_CHECKS = 1
    audit = checking_audit(site, [f"{site.base_url}/", f"{site.base_url}/noindex"])
    statuses = dict(audit.link_checks.values_list("url", "status"))
    assert statuses == {f"{site.base_url}/": "queued", f"{site.base_url}/noindex": "skipped"}


def test_the_deadline_finishes_the_audit_reporting_unfinished_checks(site, redis_client):
    audit = checking_audit(site, [f"{site.base_url}/", f"{site.base_url}/noindex"])
    first, second = audit.link_checks.order_by("url")
    linkcheck.run_link_check(first.id)
    LinkCheck.objects.filter(id=second.id).update(
        status=LinkCheck.Status.RATE_LIMITED_PENDING, retry_at=timezone.now()
    )
    assert linkcheck.finish_overdue_link_checks() == 0  # not overdue yet
    later = timezone.now() + timedelta(seconds=3600)
    assert linkcheck.finish_overdue_link_checks(now=later) == 1
    done = Audit.objects.get(id=audit.id)
    assert done.status == Audit.Status.SUCCEEDED
    assert done.result["link_check"] == {
        "total": 2, "unfinished": 1, "rate_limited_pending": 1, "deadline_passed": True,
    }  # fmt: skip
    pending = done.result["links"][1]
    assert pending["status"] == "rate_limited_pending" and pending["finished"] is False
    assert linkcheck.run_link_check(second.id) is None  # woken after the deadline: nothing to do


@pytest.mark.slow
def test_link_checks_keep_to_the_per_host_concurrency_and_rate_across_processes(
    start_worker, redis_client
):
    fast = LinkedPage(delay=0).start()  # only the rate can hold these back
    slow = LinkedPage(delay=1.0).start()  # here the concurrency binds first
    links = [f"{fast.url}/target/{n}" for n in range(8)] + [
        f"{slow.url}/target/{n}" for n in range(4)
    ]
    page = LinkedPage(links).start()
    try:
        env = {"LINKCHECK_PER_HOST_CONCURRENCY": "2", "LINKCHECK_PER_HOST_RATE": "4"}
        # Four pool processes share nothing but Redis, like four workers on four hosts.
        start_worker("audits", concurrency=4, env=env)
        audit = submission.submit_audit(normalize_url(f"{page.url}/"))
        wait_for(
            lambda: Audit.objects.get(id=audit.id).status == Audit.Status.SUCCEEDED,
            timeout=60, message="the audit and its twelve checks",
        )  # fmt: skip
        result = Audit.objects.get(id=audit.id).result
        assert [link["status"] for link in result["links"]] == ["ok"] * 12
        assert slow.max_in_flight == 2
        # 4 per second: no one-second window holds more than 4 arrivals (one more for
        # scheduling jitter on a busy machine); unpaced, all eight come at once.
        arrivals = sorted(fast.arrivals)
        assert len(arrivals) == 8
        assert max(sum(t <= a < t + 1.0 for a in arrivals) for t in arrivals) <= 5
    finally:
        for server in (page, fast, slow):
            server.stop()


def test_link_outcomes_are_the_link_check_statuses():
    # outbound does not import audits: its plain strings must be the model's values.
    assert {links.OK, links.REDIRECTED, links.BROKEN, links.SKIPPED} <= set(LinkCheck.Status.values)
    assert links.OK == LinkCheck.Status.OK and links.BROKEN == LinkCheck.Status.BROKEN
    assert links.REDIRECTED == LinkCheck.Status.REDIRECTED
    assert links.SKIPPED == LinkCheck.Status.SKIPPED
