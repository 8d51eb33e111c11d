"""One origin's failures are its own (issue 31.3): a closed port of a host opens no breaker
for a healthy server on another port of it, and every spelling of one origin shares one
breaker, one slot and one shared link. Real workers, real servers on 127.0.0.1.

The audits test starts its own worker; the two webhook tests share one webhooks worker
(as deployed, with fast retries and one delivery at a time per origin)."""

from __future__ import annotations

import socket
import threading

import httpx2
import pytest
from django.conf import settings

from audits import linkcheck, submission
from audits.models import Audit, SharedLink
from jobs import delayed
from jobs.errors import RateLimited
from jobs.models import CircuitBreaker
from outbound.client import OutboundClient, shared_client
from outbound.hostslots import SlotLimit
from outbound.urls import normalize_url, origin_key
from tests.receiver import Receiver
from tests.test_linkcheck import checking_audit
from tests.webhook_helpers import FAST_RETRIES, delivery, schedule
from tests.workers import module_worker, wait_for

# A breaker that opens on three failures and stays open far longer than any test waits:
# anything parked behind it would not run before the test times out.
LONG_OPEN_BREAKER = {
    "BREAKER_MIN_CALLS": "3",
    "BREAKER_FAILURE_RATE": "0.5",
    "BREAKER_OPEN_SECONDS": "600",
    "DELAYED_POLL_INTERVAL_SECONDS": "0.2",
}


# A webhooks worker as deployed (thread pool, concurrency from its own settings): twenty
# attempts a delivery, fast retries, one delivery in flight per origin.
webhooks_worker = module_worker(
    "webhooks",
    concurrency=None,
    pool="threads",
    env={
        "WEBHOOK_MAX_ATTEMPTS": "20",
        "WEBHOOK_PER_HOST_CONCURRENCY": "1",
        **LONG_OPEN_BREAKER,
        **FAST_RETRIES,
    },
)


def closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on: a connection to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def open_breakers(task_name: str) -> list[str]:
    return list(
        CircuitBreaker.objects.filter(task_name=task_name, state="open").values_list(
            "host", flat=True
        )
    )


@pytest.fixture
def receiver(http_server):
    return lambda respond=lambda at, number: 200: http_server(Receiver(respond))


@pytest.mark.slow
def test_a_closed_port_does_not_park_audits_of_another_port_of_the_same_host(site, start_worker):
    worker = start_worker("audits", env={**LONG_OPEN_BREAKER, "RETRY_BACKOFF_BASE_SECONDS": "0.2"})
    down = f"http://127.0.0.1:{closed_port()}/"
    for n in range(3):
        submission.submit_audit(normalize_url(f"{down}?n={n}"))
    wait_for(
        lambda: open_breakers("audits.run_audit"), timeout=60,
        message="the closed port's breaker to open", show=[worker],
    )  # fmt: skip

    healthy = submission.submit_audit(normalize_url(f"{site.base_url}/noindex"))
    wait_for(
        lambda: Audit.objects.get(id=healthy.id).status == "succeeded", timeout=30,
        message="the healthy port's audit, not parked", show=[worker],
    )  # fmt: skip
    assert Audit.objects.get(id=healthy.id).attempts == 1
    assert "breaker open" not in (Audit.objects.get(id=healthy.id).error or "")
    assert site.hits["/noindex"] == 1
    assert open_breakers("audits.run_audit") == [origin_key(down)]


@pytest.mark.slow
def test_failing_callbacks_to_a_closed_port_do_not_delay_a_receiver_on_another_port(
    receiver, webhooks_worker
):
    worker = webhooks_worker
    down = f"http://127.0.0.1:{closed_port()}/hook"
    failing = [schedule(down, number=n) for n in range(4)]
    wait_for(
        lambda: open_breakers("webhooks.deliver"), timeout=60,
        message="the closed port's breaker to open", show=[worker],
    )  # fmt: skip

    hook = receiver()
    healthy = schedule(hook.url, number=len(failing))
    wait_for(
        lambda: delivery(healthy).status == "delivered", timeout=30,
        message="the healthy receiver's delivery, not parked", show=[worker],
    )  # fmt: skip
    assert (delivery(healthy).attempts, hook.count(200)) == (1, 1)
    assert all(delivery(row).status != "delivered" for row in failing)
    assert open_breakers("webhooks.deliver") == [origin_key(down)]


@pytest.mark.slow
def test_every_spelling_of_a_callback_origin_shares_its_breaker(receiver, webhooks_worker):
    # Stored as given, as rows from before origins were normalized are: three spellings of
    # http://localhost:PORT. Failures of one open the breaker of all three. (The dotted one
    # only waits here: this machine's /etc/hosts resolves `localhost`, not `localhost.`.)
    hook = receiver(lambda at, number: 503)
    port = hook.url.split(":")[2].split("/")[0]
    worker = webhooks_worker
    shouted = [schedule(f"http://LOCALHOST:{port}/hook", number=n) for n in range(3)]
    wait_for(
        lambda: open_breakers("webhooks.deliver"), timeout=60,
        message="the breaker to open", show=[worker],
    )  # fmt: skip
    sent_before = len(hook.requests)
    others = [
        schedule(f"http://localhost.:{port}/hook", number=3),
        schedule(f"http://localhost:{port}/hook", number=4),
    ]

    def parked() -> set[str]:
        return {
            entry.args[0]
            for entry, _due in delayed.entries(settings.WEBHOOK_QUEUE)
            if entry.wait == "park"
        }

    wait_for(
        lambda: {str(row.id) for row in others} <= parked(), timeout=30,
        message="the other spellings' deliveries parked", show=[worker],
    )  # fmt: skip
    # Parked on their first run, by the breaker the other spelling opened: never sent.
    assert len(hook.requests) == sent_before
    assert all(delivery(row).attempts == 0 for row in others)
    assert all(delivery(row).status != "delivered" for row in shouted)
    assert open_breakers("webhooks.deliver") == [f"http://localhost:{port}"]


@pytest.mark.django_db
def test_every_spelling_of_a_link_shares_one_outcome_and_one_request(site, redis_client):
    port = site.base_url.rsplit(":", 1)[1]
    spellings = [
        f"http://localhost.:{port}/noindex",
        f"http://LOCALHOST:{port}/noindex",
        f"http://localhost:{port}/noindex",
    ]
    audit, queued = checking_audit(site, spellings)
    assert SharedLink.objects.get().url == f"http://localhost:{port}/noindex"
    assert len(queued) == 1
    linkcheck.run_shared_check(queued[0].shared_link_id, queued[0].task_id)
    assert Audit.objects.get(id=audit.id).status == "succeeded"
    assert sorted(audit.link_checks.values_list("status", flat=True)) == ["ok"] * 3
    assert site.hits["/noindex"] == 1


@pytest.mark.django_db
def test_every_spelling_of_an_origin_waits_for_its_one_slot(site, redis_client, http_server):
    port = site.base_url.rsplit(":", 1)[1]
    one_at_a_time = SlotLimit("pages", concurrency=1, lease=30, wait_inline=False)
    outbound = OutboundClient(shared_client(timeout=10), slots=one_at_a_time)

    def send(url: str) -> httpx2.Response:
        response = outbound.send(outbound.http.build_request("GET", url))
        response.close()
        return response

    holding = threading.Thread(target=send, args=(f"http://LOCALHOST:{port}/slow?delay=3",))
    holding.start()
    try:
        wait_for(lambda: site.hits["/slow"] == 1, timeout=5, message="the slow request")
        for spelling in (f"http://localhost.:{port}/noindex", f"http://localhost:{port}/noindex"):
            with pytest.raises(RateLimited, match="busy"):
                send(spelling)
        assert site.hits["/noindex"] == 0
        # Another port of the same host is another origin, with its own slot.
        other = http_server(Receiver())
        response = outbound.send(outbound.http.build_request("POST", other.url))
        assert response.status_code == 200
    finally:
        holding.join()
