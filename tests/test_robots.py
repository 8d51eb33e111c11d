"""robots.txt before link checks: read once per host per window, shared, obeyed as Google does."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.utils import timezone

from audits import linkcheck, robots, services, submission
from audits.models import Audit, LinkCheck, RobotsTxt
from jobs.errors import RateLimited
from outbound.integrations.robots import RULES, UNAVAILABLE, UNREACHABLE
from outbound.urls import normalize_url
from tests.fake_github import LinkedPage
from tests.robots_site import RobotsAnswer, RobotsSite
from tests.workers import wait_for

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]

BLOCKED = LinkCheck.Status.BLOCKED_BY_ROBOTS


@pytest.fixture(autouse=True)
def _quick_checks(settings):
    settings.LINKCHECK_PER_HOST_RATE = 100
    settings.LINKCHECK_BROKEN_RECHECK_SECONDS = 0


@pytest.fixture
def host():
    server = RobotsSite().start()
    yield server
    server.stop()


def check_links(links: list[str], *, page: str = "http://127.0.0.1:9/page") -> dict[str, dict]:
    """An audit listing `links`, its checks run here; each link's entry in its result."""
    page_row = submission.get_or_create_page(normalize_url(page))
    audit = Audit.objects.create(page=page_row, task_id="t", status=Audit.Status.RUNNING)
    _, queued = linkcheck.start_link_checks(
        str(audit.id), {"status_code": 200, "external_links": links}
    )
    for check in queued:
        linkcheck.run_shared_check(check.shared_link_id, check.task_id)
    audit.refresh_from_db()
    assert audit.status == Audit.Status.SUCCEEDED
    return {entry["url"]: entry for entry in audit.result["links"]}


def statuses(entries: dict[str, dict]) -> dict[str, str]:
    return {url: entry["status"] for url, entry in entries.items()}


def test_a_disallowed_link_is_reported_blocked_and_never_requested(host, redis_client):
    host.robots = RobotsAnswer(body=b"User-agent: *\nDisallow: /private\n")
    private, public = f"{host.url}/private/a", f"{host.url}/public/b"
    entries = check_links([private, public])
    assert statuses(entries) == {private: BLOCKED, public: "ok"}
    assert entries[private]["detail"] == f"not requested: disallowed by {host.url}/robots.txt"
    assert host.hits == {"/public/b": 1}
    assert host.robots_requests == 1


def test_plumbs_own_group_is_the_one_obeyed(host, redis_client):
    # AUDIT_USER_AGENT is "Plumb/0.1 (...)": the `plumb` group is more specific than `*`.
    host.robots = RobotsAnswer(body=b"User-agent: *\nAllow: /\n\nUser-agent: plumb\nDisallow: /\n")
    link = f"{host.url}/anything"
    assert statuses(check_links([link])) == {link: BLOCKED}
    assert host.hits == {}


def test_robots_txt_is_read_once_per_host_per_window_then_again(host, redis_client):
    host.robots = RobotsAnswer(body=b"User-agent: *\nDisallow: /private\n")
    check_links([f"{host.url}/a", f"{host.url}/private/1"])
    check_links([f"{host.url}/b", f"{host.url}/private/2"], page="http://127.0.0.1:9/other")
    assert host.robots_requests == 1
    row = RobotsTxt.objects.get(origin=host.url)
    assert row.availability == RULES and row.claim_token == ""
    assert row.fresh_until - row.fetched_at == timedelta(days=1)  # ROBOTS_FRESH_SECONDS

    RobotsTxt.objects.update(fresh_until=timezone.now())  # the window has passed
    host.robots = RobotsAnswer(body=b"User-agent: *\nDisallow: /c\n")
    link = f"{host.url}/c"
    assert statuses(check_links([link], page="http://127.0.0.1:9/third")) == {link: BLOCKED}
    assert host.robots_requests == 2


@pytest.mark.parametrize("status", [404, 403, 410, 401])
def test_a_robots_txt_that_is_not_there_allows_everything(host, status, redis_client):
    host.robots = RobotsAnswer(status=status, body=b"User-agent: *\nDisallow: /\n")
    link = f"{host.url}/page"
    assert statuses(check_links([link])) == {link: "ok"}
    assert RobotsTxt.objects.get().availability == UNAVAILABLE


@pytest.mark.parametrize("status", [500, 502])
def test_a_robots_txt_that_fails_holds_back_every_link_for_a_while(
    host, status, settings, redis_client
):
    settings.LINKCHECK_BROKEN_FRESH_SECONDS = 0  # the next audit asks again
    host.robots = RobotsAnswer(status=status)
    link = f"{host.url}/page"
    entries = check_links([link])
    assert statuses(entries) == {link: BLOCKED}
    assert "is unreachable (answered" in entries[link]["detail"]
    assert host.hits == {}
    row = RobotsTxt.objects.get()
    assert row.availability == UNREACHABLE
    assert row.fresh_until - row.fetched_at == timedelta(minutes=10)  # ROBOTS_UNREACHABLE_SECONDS

    host.robots = RobotsAnswer(status=404)
    assert statuses(check_links([link], page="http://127.0.0.1:9/b")) == {link: BLOCKED}
    assert host.robots_requests == 1  # still within the shorter window
    RobotsTxt.objects.update(fresh_until=timezone.now())
    assert statuses(check_links([link], page="http://127.0.0.1:9/c")) == {link: "ok"}
    assert host.robots_requests == 2


def test_a_robots_txt_that_times_out_holds_back_every_link(host, settings, redis_client):
    settings.AUDIT_FETCH_TIMEOUT_SECONDS = 0.5
    host.robots = RobotsAnswer(delay=2.0)
    link = f"{host.url}/page"
    entries = check_links([link])
    assert statuses(entries) == {link: BLOCKED}
    assert "timed out" in entries[link]["detail"]
    assert host.hits == {}


def test_only_the_first_500_kib_are_read(host, redis_client):
    # Past 500 KiB a `Disallow: /` that Protego alone would obey.
    body = b"User-agent: *\nDisallow: /private\n#" + b"x" * 600_000 + b"\nDisallow: /\n"
    host.robots = RobotsAnswer(body=body)
    private, public = f"{host.url}/private", f"{host.url}/public"
    assert statuses(check_links([private, public])) == {private: BLOCKED, public: "ok"}
    row = RobotsTxt.objects.get()
    assert row.truncated is True and len(row.body) <= 500 * 1024


def test_a_byte_order_mark_does_not_hide_the_first_line(host, redis_client):
    host.robots = RobotsAnswer(body=b"\xef\xbb\xbfUser-agent: *\nDisallow: /\n")
    link = f"{host.url}/page"
    assert statuses(check_links([link])) == {link: BLOCKED}


def test_a_redirected_robots_txt_applies_to_the_host_asked(host, redis_client):
    elsewhere = RobotsSite(RobotsAnswer(body=b"User-agent: *\nDisallow: /private\n")).start()
    try:
        host.robots = RobotsAnswer(status=301, location=f"{elsewhere.url}/robots.txt")
        private, public = f"{host.url}/private", f"{host.url}/public"
        assert statuses(check_links([private, public])) == {private: BLOCKED, public: "ok"}
        assert elsewhere.robots_requests == 1
    finally:
        elsewhere.stop()


def test_more_than_five_redirects_is_as_if_there_were_no_robots_txt(host, redis_client):
    host.robots = RobotsAnswer(status=302, location=f"{host.url}/robots.txt")
    link = f"{host.url}/page"
    assert statuses(check_links([link])) == {link: "ok"}
    assert host.robots_requests == 6  # the first request and five redirects
    assert RobotsTxt.objects.get().availability == UNAVAILABLE


@pytest.fixture
def other_host():
    server = RobotsSite().start()
    yield server
    server.stop()


def test_a_redirect_to_another_host_reads_that_hosts_robots_txt_before_following(
    host, other_host, redis_client
):
    host.robots = RobotsAnswer(body=b"User-agent: *\nAllow: /\n")
    other_host.robots = RobotsAnswer(body=b"User-agent: *\nDisallow: /private\n")
    blocked_target = f"{other_host.url}/private/moved-here"
    allowed_target = f"{other_host.url}/public/moved-here"
    host.redirects = {"/old": blocked_target, "/older": allowed_target}
    blocked, allowed = f"{host.url}/old", f"{host.url}/older"

    entries = check_links([blocked, allowed])

    assert statuses(entries) == {blocked: BLOCKED, allowed: "redirected"}
    assert entries[blocked]["final_url"] == blocked_target  # reported at the hop
    assert entries[blocked]["detail"] == (
        f"redirected (301) to {blocked_target}, not requested: disallowed by "
        f"{other_host.url}/robots.txt"
    )
    assert entries[allowed]["final_url"] == allowed_target
    assert host.hits == {"/old": 1, "/older": 1}
    assert other_host.hits == {"/public/moved-here": 1}  # never the disallowed one
    assert (host.robots_requests, other_host.robots_requests) == (1, 1)


def test_a_redirect_to_a_disallowed_path_of_the_same_host_is_not_followed(host, redis_client):
    host.robots = RobotsAnswer(body=b"User-agent: *\nDisallow: /private\n")
    host.redirects = {"/moved": f"{host.url}/private/x"}
    link = f"{host.url}/moved"
    assert statuses(check_links([link])) == {link: BLOCKED}
    assert host.hits == {"/moved": 1}
    assert host.robots_requests == 1


def test_a_redirect_to_a_host_whose_robots_txt_is_unreachable_is_not_followed(
    host, other_host, redis_client
):
    other_host.robots = RobotsAnswer(status=503)
    host.redirects = {"/old": f"{other_host.url}/page"}
    link = f"{host.url}/old"
    entries = check_links([link])
    assert statuses(entries) == {link: BLOCKED}
    assert "unreachable" in entries[link]["detail"]
    assert other_host.hits == {}


def test_a_deferred_check_resumed_at_a_hop_reads_that_hops_robots_txt(
    host, other_host, redis_client
):
    """Another worker reading the target's robots.txt defers the check at the hop; run
    again, it resumes there and obeys the file."""
    other_host.robots = RobotsAnswer(body=b"User-agent: *\nDisallow: /\n")
    host.redirects = {"/old": f"{other_host.url}/page"}
    RobotsTxt.objects.create(
        origin=other_host.url, claim_token="other",
        claimed_until=timezone.now() + timedelta(seconds=30),
    )  # fmt: skip
    link = f"{host.url}/old"
    with pytest.raises(RateLimited) as raised:
        linkcheck.check_link(link, github=None, resume=None)
    assert raised.value.resume["current"] == f"{other_host.url}/page"
    RobotsTxt.objects.filter(origin=other_host.url).update(claim_token="", claimed_until=None)
    outcome = linkcheck.check_link(link, github=None, resume=raised.value.resume)
    assert outcome.status == BLOCKED
    assert host.hits == {"/old": 1}  # the answered hop is not asked again
    assert other_host.hits == {}


def test_crawl_delay_spaces_the_hosts_link_checks(host, redis_client):
    host.robots = RobotsAnswer(body=b"User-agent: *\nCrawl-delay: 1\n")
    links = [f"{host.url}/{n}" for n in range(3)]
    # LINKCHECK_PER_HOST_RATE is 100 a second here: only the Crawl-delay spaces them.
    assert set(statuses(check_links(links)).values()) == {"ok"}
    gaps = [later - earlier for earlier, later in itertools.pairwise(host.arrivals)]
    assert len(gaps) == 2 and min(gaps) >= 0.9
    assert RobotsTxt.objects.get(origin=host.url).crawl_delay == 1.0  # shown in the admin


def test_the_robots_txt_admin_lists_the_files_and_changes_nothing(host, admin_client, redis_client):
    host.robots = RobotsAnswer(body=b"User-agent: *\nCrawl-delay: 2\nDisallow: /private\n")
    check_links([f"{host.url}/a"])
    row = RobotsTxt.objects.get(origin=host.url)
    url = "/admin/audits/robotstxt/"
    listing = admin_client.get(url, {"q": host.url})
    assert listing.status_code == 200
    (shown,) = listing.context["cl"].result_list
    assert (shown.origin, shown.status_code, shown.crawl_delay, shown.body_size) == (
        host.url, 200, 2.0, len(row.body)
    )  # fmt: skip
    assert "body" in shown.get_deferred_fields()  # the list never loads the files
    detail = admin_client.get(f"{url}{row.id}/change/")
    assert detail.status_code == 200 and b"Disallow: /private" in detail.content
    assert admin_client.get(f"{url}add/").status_code == 403
    assert admin_client.post(f"{url}{row.id}/change/", {"origin": "x"}).status_code == 403
    assert admin_client.post(f"{url}{row.id}/delete/", {"post": "yes"}).status_code == 403
    assert RobotsTxt.objects.get(id=row.id).origin == host.url


def test_a_host_whose_robots_txt_another_worker_reads_defers_the_check(host, redis_client):
    RobotsTxt.objects.create(
        origin=host.url, claim_token="other", claimed_until=timezone.now() + timedelta(seconds=30)
    )
    page = submission.get_or_create_page(normalize_url("http://127.0.0.1:9/page"))
    audit = Audit.objects.create(page=page, task_id="t", status=Audit.Status.RUNNING)
    _, (check,) = linkcheck.start_link_checks(
        str(audit.id), {"status_code": 200, "external_links": [f"{host.url}/page"]}
    )
    with pytest.raises(RateLimited) as raised:
        linkcheck.run_shared_check(check.shared_link_id, check.task_id)
    assert raised.value.resource == robots.ROBOTS_RESOURCE
    # Soon, not when the claim ends: the other worker's read is one round trip.
    assert raised.value.retry_at <= timezone.now().timestamp() + 1.5
    assert host.robots_requests == 0 and host.hits == {}
    # The audit waits for it a little at most, then goes without.
    assert robots.robots_for(f"{host.url}/", wait_seconds=0.3) is None


def test_a_claim_left_by_a_dead_worker_is_taken_again_once_it_expires(host, redis_client):
    RobotsTxt.objects.create(
        origin=host.url, claim_token="dead", claimed_until=timezone.now() - timedelta(seconds=1)
    )
    host.robots = RobotsAnswer(body=b"User-agent: *\nDisallow: /\n")
    info = robots.robots_for(f"{host.url}/any/page")
    assert (info.status_code, info.availability) == (200, RULES)
    assert host.robots_requests == 1


def test_robots_for_gives_the_audit_the_status_and_text_once_per_window(host, redis_client):
    host.robots = RobotsAnswer(body=b"User-agent: *\nDisallow: /admin\n")
    info = robots.robots_for(f"{host.url}/some/page?q=1")
    assert info.url == f"{host.url}/robots.txt"
    assert (info.status_code, info.body) == (200, "User-agent: *\nDisallow: /admin\n")
    assert robots.robots_for(f"{host.url}/another") == info
    assert host.robots_requests == 1

    missing = RobotsSite(RobotsAnswer(status=404, body=b"not here")).start()
    try:
        info = robots.robots_for(f"{missing.url}/")
        assert (info.status_code, info.body, info.availability) == (404, "", UNAVAILABLE)
    finally:
        missing.stop()


def test_an_audit_of_a_page_robots_txt_disallows_is_not_gated(host, redis_client):
    host.robots = RobotsAnswer(body=b"User-agent: *\nDisallow: /\n")
    page = submission.get_or_create_page(normalize_url(f"{host.url}/page"))
    audit = Audit.objects.create(page=page, task_id="t")
    services.execute_audit(str(audit.id))
    audit.refresh_from_db()
    assert audit.status == Audit.Status.SUCCEEDED
    assert host.hits == {"/page": 1}


def test_the_guard_still_refuses_a_private_host_before_its_robots_txt(host, settings, redis_client):
    settings.AUDIT_ALLOW_PRIVATE_TARGETS = False
    link = f"{host.url}/page"
    assert statuses(check_links([link])) == {link: "skipped"}
    assert host.robots_requests == 0
    row = RobotsTxt.objects.get()
    assert row.claim_token == ""  # let go: nothing to read there
    assert row.fresh_until is not None  # stale from now: it ages out (audits.retention)


def test_a_host_that_does_not_resolve_is_reported_as_such(redis_client):
    link = "http://does-not-exist.invalid/page"
    entries = check_links([link])
    assert (entries[link]["status"], entries[link]["detail"]) == ("broken", "host does not resolve")


def test_workers_share_one_read_of_a_hosts_robots_txt(start_worker, redis_client):
    targets = LinkedPage(robots="User-agent: *\nDisallow: /private\n").start()
    links = [f"{targets.url}/public/{n}" for n in range(8)] + [
        f"{targets.url}/private/{n}" for n in range(4)
    ]
    page = LinkedPage(links).start()
    try:
        env = {"LINKCHECK_PER_HOST_RATE": "100", "LINKCHECK_PER_HOST_CONCURRENCY": "8"}
        # Two processes of four threads: eight checks race for the host's robots.txt.
        start_worker("audits", concurrency=4, env=env)
        start_worker("audits", concurrency=4, env=env)
        audit = submission.submit_audit(normalize_url(f"{page.url}/"))
        wait_for(
            lambda: Audit.objects.get(id=audit.id).status == Audit.Status.SUCCEEDED,
            timeout=60, message="the audit and its twelve checks",
        )  # fmt: skip
        result = Audit.objects.get(id=audit.id).result
        found = {link["url"]: link["status"] for link in result["links"]}
        assert found == {url: BLOCKED if "/private/" in url else "ok" for url in links}
        assert targets.robots_requests == 1
        assert len(targets.arrivals) == 8  # the public links only
    finally:
        page.stop()
        targets.stop()
