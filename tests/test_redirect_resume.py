"""A redirected link deferred at a busy hop resumes at that hop: no hop is asked twice."""

from __future__ import annotations

import functools

import pytest

from audits import submission
from audits.models import Audit, LinkCheck
from jobs.errors import RateLimited
from outbound.integrations.page import fetch_page
from outbound.redirects import RedirectChain
from outbound.urls import normalize_url, origin_key
from tests.fake_github import LinkedPage
from tests.workers import wait_for

START = "http://a.example/moved"
WHERE = {
    "url": START,
    "current": "http://b.example/moved",
    "redirects": [{"url": START, "status_code": 302}],
}


def test_a_chain_resumes_at_the_hop_it_reached():
    chain = RedirectChain.resumed(START, WHERE)
    assert (chain.current, chain.redirects) == (WHERE["current"], WHERE["redirects"])
    assert chain.where() == WHERE


@pytest.mark.parametrize(
    "where",
    [
        None,
        {**WHERE, "url": "http://other.example/"},  # another link's chain
        {**WHERE, "redirects": []},
        {**WHERE, "redirects": [{"url": START, "status_code": 200}]},
        {**WHERE, "redirects": [{"url": START, "status_code": 302}] * 6},  # past the cap
        {**WHERE, "current": "ftp://b.example/"},
        {**WHERE, "current": "HTTP://B.example/moved"},  # not as Plumb spells a hop
        "http://b.example/moved",
    ],
)
def test_a_point_that_is_not_one_of_this_chain_starts_it_over(where):
    chain = RedirectChain.resumed(START, where)
    assert (chain.current, chain.redirects) == (START, [])


def hold_slot(redis_client, pool: str, name: str) -> str:
    """Take one of `name`'s slots in `pool` as another worker would, for a minute at most."""
    key = f"hostslots:{pool}:{name}:inflight"
    redis_client.zadd(key, {"held-by-the-test": redis_client.time()[0] + 60})
    return key


def pending_detail() -> str:
    check = LinkCheck.objects.filter(status=LinkCheck.Status.RATE_LIMITED_PENDING).first()
    return "" if check is None else check.detail


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_link_deferred_at_a_busy_redirect_target_asks_the_first_host_once(
    start_worker, redis_client, http_server
):
    target = http_server(LinkedPage())  # host B
    moved = http_server(LinkedPage(redirect_to=target.url))  # host A: redirects to B
    page = http_server(LinkedPage([f"{moved.url}/moved"]))
    start_worker(
        "audits", concurrency=2,
        env={
            "LINKCHECK_PER_HOST_CONCURRENCY": "1", "LINKCHECK_PER_HOST_RATE": "100",
            "LINKCHECK_PER_CLIENT_CONCURRENCY": "1",
            "RATELIMIT_INLINE_MAX_WAIT_SECONDS": "0.3",
            "DELAYED_POLL_INTERVAL_SECONDS": "0.1",
        },
    )  # fmt: skip
    # Every slot of B is busy: the check reaches B through A, and is deferred there.
    busy_target = hold_slot(redis_client, "links", origin_key(target.url))
    audit = submission.submit_audit(normalize_url(f"{page.url}/"), client="ip:192.0.2.7")
    wait_for(
        lambda: origin_key(target.url) in pending_detail(),
        timeout=60, message="the check deferred at B",
    )  # fmt: skip
    # Then the client's turn is taken too: the resumed check is deferred before it
    # calls anything, and still knows where it got to.
    busy_client = hold_slot(redis_client, "link-clients", "ip:192.0.2.7")
    wait_for(
        lambda: "every client waiting" in pending_detail(),
        timeout=30, message="the check deferred for its client's turn",
    )  # fmt: skip
    redis_client.zrem(busy_target, "held-by-the-test")
    redis_client.zrem(busy_client, "held-by-the-test")
    wait_for(
        lambda: Audit.objects.get(id=audit.id).status == Audit.Status.SUCCEEDED,
        timeout=60, message="the audit",
    )  # fmt: skip
    assert len(moved.arrivals) == 1  # A, asked once in all
    assert len(target.arrivals) == 1
    # The result is the whole chain's: redirected, from A to where B answered.
    [link] = Audit.objects.get(id=audit.id).result["links"]
    assert link == {
        "url": f"{moved.url}/moved",
        "status": "redirected",
        "status_code": 200,
        "final_url": f"{target.url}/moved",
    }


@pytest.mark.django_db
def test_a_page_fetch_deferred_at_a_busy_redirect_target_resumes_there(
    settings, redis_client, http_server
):
    settings.PAGE_FETCH_PER_HOST_CONCURRENCY = 1
    target = http_server(LinkedPage())
    moved = http_server(LinkedPage(redirect_to=target.url))
    fetch = functools.partial(
        fetch_page, f"{moved.url}/moved", timeout=10, max_bytes=100_000,
        user_agent="plumb-test", allow_private=True,
    )  # fmt: skip
    busy_target = hold_slot(redis_client, "pages", origin_key(target.url))
    with pytest.raises(RateLimited) as deferred:
        fetch()
    assert deferred.value.resume["current"] == f"{target.url}/moved"
    redis_client.zrem(busy_target, "held-by-the-test")
    page = fetch(resume=deferred.value.resume)
    assert (len(moved.arrivals), len(target.arrivals)) == (1, 1)
    assert page.final_url == f"{target.url}/moved"
    assert page.redirects == [{"url": f"{moved.url}/moved", "status_code": 302}]
