"""Issue 31, point 1, end to end: a host's decades-long Retry-After cannot close
submissions for everyone, and a Retry-After on a 200 holds nobody. Real HTTP servers on
127.0.0.1, the API, a real `audits` worker and Redis.

The first test starts its worker once its pages are submitted; the two after it share one
`audits` worker (two processes, a quick sweep of the delayed store)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from urllib.parse import urlsplit

import pytest
from rest_framework.test import APIClient

from audits.models import Audit, LinkCheck
from tests.http_server import LocalServer, QuietHandler
from tests.submitting import post_audit
from tests.workers import module_worker, wait_for

pytestmark = pytest.mark.slow

# 275 link checks against a backlog cap of 50 (the finding's were 1,100 against 1,000):
# enough to close submissions several times over, at a quarter of 100 links' CPU.
LINKS_PER_PAGE = 25
# What the finding's host answered to every link.
DECADES = "999999999"

audits_worker = module_worker("audits", concurrency=2, env={"DELAYED_POLL_INTERVAL_SECONDS": "0.2"})


class Host(LocalServer):
    """`/page/<n>` lists LINKS_PER_PAGE links to `links_to` (`<links_to>/<n>/<k>`), with
    `page_headers`; every other path answers `answer` (status, headers) and is counted."""

    def __init__(self, *, links_to: str = "", page_headers=None, answer=(200, None)):
        super().__init__(_Handler)
        self.links_to = links_to
        self.page_headers = dict(page_headers or {})
        self.answer = (answer[0], dict(answer[1] or {}))
        self.lock = threading.Lock()
        self.answered = 0


class _Handler(QuietHandler):
    def do_GET(self):
        server: Host = self.server
        path = urlsplit(self.path).path
        if path.startswith("/page/"):
            page = path.removeprefix("/page/")
            links = (
                [f"{server.links_to}/{page}/{k}" for k in range(LINKS_PER_PAGE)]
                if server.links_to
                else []
            )
            anchors = "".join(f"<a href='{url}'>{url}</a>" for url in links)
            body = f"<!doctype html><title>Page {page}</title>{anchors}".encode()
            return self.send(200, {"Content-Type": "text/html", **server.page_headers}, body)
        with server.lock:
            server.answered += 1
        status, headers = server.answer
        self.send(status, {"Content-Type": "text/html", **headers}, b"<title>no</title>")


@pytest.fixture
def hosts(http_server):
    return lambda **options: http_server(Host(**options))


def submit(url: str, address: str):
    return post_audit(APIClient(), url, REMOTE_ADDR=address)


def queue() -> dict:
    response = APIClient().get("/api/queue")
    assert response.status_code == 200
    return response.json()


def test_eleven_pages_of_links_to_a_host_asking_for_decades_do_not_close_submissions(
    hosts, start_worker, settings
):
    settings.AUDIT_QUEUE_MAX_DEPTH = 50  # the finding's 1,000, scaled to the test
    # The whole backlog is open to one client here: what must not close it is a wait of
    # decades, whatever each client's share (a fair share would refuse the address first).
    settings.AUDIT_CLIENT_MAX_SHARE = 1.0
    limiter = hosts(answer=(429, {"Retry-After": DECADES}))
    pages = hosts(links_to=limiter.url)
    # Eleven submissions from one address, all admitted while the backlog is small.
    answers = [submit(f"{pages.url}/page/{n}", "198.51.100.7").status_code for n in range(11)]
    assert answers == [202] * 11
    worker = start_worker("audits", concurrency=8, env={"DELAYED_POLL_INTERVAL_SECONDS": "0.2"})
    checks = LinkCheck.objects.filter(audit__page__url__startswith=pages.url)
    wait_for(
        lambda: checks.count() == 11 * LINKS_PER_PAGE and limiter.answered,
        timeout=120, interval=0.5, message="the pages' link checks", show=[worker],
    )  # fmt: skip

    # Another client is admitted within a couple of minutes: the host's decades are no
    # backlog. (Before the fix, the links' waits filled it until 2058: 503 every time.)
    # A refused submission writes nothing and takes no token, so trying again is free.
    def another_client_admitted():
        response = submit(f"{pages.url}/page/other", "203.0.113.5")
        assert response.status_code in (202, 503), response.content
        return response.status_code == 202

    wait_for(
        another_client_admitted, timeout=150, interval=1.0,
        message="another client's submission to be admitted", show=[worker],
    )  # fmt: skip

    # Each link is reported rate_limited, with when the host said it may be asked again,
    # and each audit finished; the limiter was asked a few times, not once a link.
    wait_for(
        lambda: not Audit.objects.exclude(status__in=Audit.FINISHED).exists(),
        timeout=60, interval=0.5, message="every audit to finish", show=[worker],
    )  # fmt: skip
    assert set(checks.values_list("status", flat=True)) == {LinkCheck.Status.RATE_LIMITED}
    year = datetime.fromtimestamp(time.time() + int(DECADES), tz=UTC).year
    assert checks.filter(retry_at__year=year).count() == checks.count()
    for audit in Audit.objects.all():
        assert audit.status == Audit.Status.SUCCEEDED, audit.error
        statuses = {link["status"] for link in audit.result["links"]}
        assert statuses == {"rate_limited"}
        assert audit.result["links"][0]["retry_at"].startswith(f"{year}-")
    assert limiter.answered <= 10
    # /api/queue: what can run soon, which is nothing; nothing deferred for decades.
    wait_for(lambda: queue()["backlog"] == 0, timeout=30, message="an empty backlog", show=[worker])
    assert queue()["deferred_beyond_horizon"] == 0


def test_a_200_with_retry_after_on_one_audit_does_not_hold_another_clients_audit(
    hosts, audits_worker
):
    site = hosts(page_headers={"Retry-After": "86400"})
    worker = audits_worker
    first = submit(f"{site.url}/page/a", "198.51.100.7")
    assert first.status_code == 202
    wait_for(
        lambda: Audit.objects.get(id=first.json()["id"]).status in Audit.FINISHED,
        timeout=60, message="the first audit", show=[worker],
    )  # fmt: skip
    second = submit(f"{site.url}/page/b", "203.0.113.5")
    assert second.status_code == 202
    # Held for 24 h before the fix (the 200's Retry-After blocked the host for everyone).
    audit = wait_for(
        lambda: Audit.objects.filter(id=second.json()["id"], status__in=Audit.FINISHED).first(),
        timeout=60, message="the other client's audit", show=[worker],
    )  # fmt: skip
    assert audit.status == Audit.Status.SUCCEEDED, audit.error


def test_a_page_whose_host_asks_for_decades_fails_saying_until_when(hosts, audits_worker):
    site = hosts(page_headers={"Retry-After": DECADES}, answer=(429, {"Retry-After": DECADES}))
    worker = audits_worker
    submitted = submit(f"{site.url}/limited", "198.51.100.7")
    assert submitted.status_code == 202
    audit = wait_for(
        lambda: Audit.objects.filter(id=submitted.json()["id"], status__in=Audit.FINISHED).first(),
        timeout=60, message="the rate-limited audit", show=[worker],
    )  # fmt: skip
    assert audit.status == Audit.Status.FAILED
    year = datetime.fromtimestamp(time.time() + int(DECADES), tz=UTC).year
    assert f"rate limited until {year}-" in audit.error
    assert site.answered == 1
    assert queue()["backlog"] == 0 and queue()["deferred_beyond_horizon"] == 0
