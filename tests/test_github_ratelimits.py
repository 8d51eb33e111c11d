"""GitHub's rate limits, against a local server that keeps real buckets, and real workers.

The specs come from an incident (shared seeds, 002): App-JWT rows clearing an
installation's backoff, a 60 s Retry-After cut to 8 s and retried in lockstep,
graphql rows crowding the core row out of a pacing check, and token refreshes
that each minted their own token.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime

import pytest

from audits import linkcheck, submission
from audits.models import Audit, LinkCheck
from jobs import delayed
from jobs.errors import RateLimited
from outbound.integrations.github import GitHubClient, GitHubCredentials
from outbound.urls import normalize_url
from ratelimit.admission import admit
from ratelimit.observations import (
    RateLimitObservation,
    github_app_key,
    github_installation_key,
)
from tests.conftest import APP_ID, INSTALLATION_ID
from tests.fake_github import LinkedPage
from tests.submitting import submit
from tests.workers import wait_for

INSTALLATION = github_installation_key(INSTALLATION_ID)
REPO_LINKS = [f"https://github.com/plumb/repo{n}" for n in range(6)]


def client() -> GitHubClient:
    return GitHubClient(GitHubCredentials.from_settings())


@pytest.fixture
def linked_page(http_server):
    return lambda links, **options: http_server(LinkedPage(links, **options))


def rest_and_graphql(server, identity):
    return (
        len(server.requests(identity=identity, resource="core")),
        len(server.requests(identity=identity, resource="graphql")),
    )


# --- In-process: the client and the token cache against the server -----------------


@pytest.mark.django_db
def test_repositories_are_checked_with_an_installation_token(fake_github, redis_client):
    github = client()
    assert github.repository("plumb", "repo1").archived is True
    assert github.repository("plumb", "nope").exists is False
    assert fake_github.state.mints == 1  # cached by installation, not minted per call
    # Each credential's answers are observed under its own bucket.
    keys = set(RateLimitObservation.objects.values_list("key", "resource"))
    assert keys == {(github_app_key(APP_ID), "core"), (INSTALLATION, "core")}


def test_a_missing_repository_is_reported_at_once_with_one_api_call(
    fake_github, settings, redis_client, transactional_db
):
    # A site's broken answer is checked once more (LINKCHECK_BROKEN_RECHECK_SECONDS);
    # GitHub's API saying "not found" is an answer, not a hiccup: asking it twice spent
    # the one shared credential's turn twice (issue 31: 200 calls for 100 links).
    settings.LINKCHECK_BROKEN_RECHECK_SECONDS = 10
    page = submission.get_or_create_page(normalize_url("http://127.0.0.1:9/readme"))
    audit = Audit.objects.create(page=page, task_id="t", status=Audit.Status.RUNNING)
    _, (check,) = linkcheck.start_link_checks(
        str(audit.id),
        {"status_code": 200, "external_links": ["https://github.com/plumb/missing"]},
    )
    linkcheck.run_shared_check(check.shared_link_id, check.task_id)  # no Transient: no recheck
    done = Audit.objects.get(id=audit.id)
    assert done.status == Audit.Status.SUCCEEDED
    assert done.result["links"][0]["status"] == "broken"
    assert done.result["links"][0]["github"]["missing"] is True
    assert rest_and_graphql(fake_github, fake_github.installation) == (1, 0)


@pytest.mark.django_db
def test_an_app_jwt_observation_does_not_clear_an_installations_exhaustion_backoff(
    fake_github, redis_client
):
    github = client()
    fake_github.exhaust(fake_github.installation, "core", reset_in=600)
    fake_github.exhaust(fake_github.installation, "graphql", reset_in=600)
    with pytest.raises(RateLimited):
        github.repository("plumb", "repo0")
    delayed.schedule(
        delayed.Entry("audits.check_shared_link", "audits", "t-1", [1], wait="deferral",
                      wait_on=(INSTALLATION, "core")),
        delay=0,
    )  # fmt: skip

    # A fresh mint: an App-JWT call, answered from the App's healthy bucket, newest of all.
    fake_github.revoke_tokens()
    redis_client.delete(github.tokens.cache_key)
    github.tokens.get()
    newest = RateLimitObservation.objects.first()
    assert (newest.key, newest.remaining) == (github_app_key(APP_ID), 4998)

    assert not admit(INSTALLATION, "core").go
    assert delayed.wake_due("audits", client=redis_client) == 0  # it stays stored
    assert rest_and_graphql(fake_github, fake_github.installation) == (1, 1)


@pytest.mark.django_db
def test_ten_graphql_calls_do_not_hide_an_exhausted_core_bucket(fake_github, redis_client):
    github = client()
    fake_github.exhaust(fake_github.installation, "core", reset_in=600)
    assert github.repository("plumb", "repo0").via == "graphql"  # core revealed spent
    for n in range(10):
        assert github.repository_via_graphql("plumb", f"repo{n % 8}").exists
    assert not admit(INSTALLATION, "core").go
    assert github.repository("plumb", "repo2").via == "graphql"
    assert rest_and_graphql(fake_github, fake_github.installation) == (1, 12)


@pytest.mark.django_db(transaction=True)
def test_concurrent_token_refreshes_mint_once(fake_github, redis_client):
    fake_github.state.mint_delay = 0.3  # every refresher arrives while the mint is in flight
    results, errors = [], []

    def check(n):
        try:
            results.append(client().repository("plumb", f"repo{n % 8}").exists)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def in_threads(count):
        threads = [threading.Thread(target=check, args=(n,)) for n in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)

    in_threads(6)  # a cold cache
    assert fake_github.state.mints == 1
    fake_github.revoke_tokens()  # every cached token now gets a 401: a forced refresh each
    in_threads(6)
    assert errors == []
    assert results == [True] * 12
    assert fake_github.state.mints == 2


# --- Real workers ---------------------------------------------------------------------


def parked_entries(redis_client) -> list[tuple[delayed.Entry, float]]:
    return delayed.entries("audits", redis_client)


@pytest.mark.slow
def test_a_60s_retry_after_causes_no_inline_retry_and_a_queue_retry_60s_later_with_jitter(
    fake_github, linked_page, start_worker, redis_client
):
    fake_github.secondary_limit(fake_github.installation, retry_after=60)
    page = linked_page(REPO_LINKS[:3])
    # A 20 s visibility timeout: a 60 s wait is parked in Redis, where the test can read it.
    start_worker(
        "audits", env={**fake_github.worker_env, "AUDITS_VISIBILITY_TIMEOUT_SECONDS": "20"}
    )
    audit = submit(f"{page.url}/")

    entries = wait_for(
        lambda: len(found := parked_entries(redis_client)) == 3 and found,
        timeout=30, message="the three checks to be parked",
    )  # fmt: skip
    (revealing,) = fake_github.requests(identity=fake_github.installation)
    assert revealing.status == 403  # the one request; no inline retry, no GraphQL try
    for task, due in entries:
        assert task.task == "audits.check_shared_link"
        assert task.retries == 0  # no attempt spent
        assert due >= revealing.at + 60
        assert due <= revealing.at + 60 + 7  # Retry-After plus up to 10 % jitter
    assert len({due for _, due in entries}) == 3  # jittered, not in lockstep
    checks = LinkCheck.objects.filter(audit=audit)
    assert {check.status for check in checks} == {LinkCheck.Status.RATE_LIMITED_PENDING}
    # Another request would be an inline retry (at once: the checks above are parked, so
    # their attempts are over) or a parked check woken early (by the delayed store's
    # 0.25 s poll): a second covers both; the 60 s wake itself is the next test's.
    time.sleep(1)
    assert len(fake_github.requests(identity=fake_github.installation)) == 1


@pytest.mark.slow
def test_a_secondary_limit_longer_than_the_bound_reports_the_links_rate_limited(
    fake_github, linked_page, start_worker, redis_client
):
    # Past RATELIMIT_MAX_WAIT_SECONDS (an hour): no wait in the store, the links end.
    fake_github.secondary_limit(fake_github.installation, retry_after=7200)
    page = linked_page(REPO_LINKS[:3])
    start_worker("audits", env=fake_github.worker_env)
    audit = submit(f"{page.url}/")
    done = wait_for(
        lambda: (found := Audit.objects.get(id=audit.id)).status == Audit.Status.SUCCEEDED
        and found,
        timeout=30, message="the audit to finish with its links rate limited",
    )  # fmt: skip
    links = done.result["links"]
    assert [link["status"] for link in links] == ["rate_limited"] * 3
    revealed = fake_github.requests(identity=fake_github.installation)[0].at
    for link in links:
        retry_at = datetime.fromisoformat(link["retry_at"]).timestamp()
        assert revealed + 7200 - 5 <= retry_at <= revealed + 7200 * 1.1 + 5
    assert parked_entries(redis_client) == []
    assert len(fake_github.requests(identity=fake_github.installation)) == 1


@pytest.mark.slow
def test_parked_link_checks_wake_spread_out_after_the_reset_and_all_complete(
    fake_github, linked_page, start_worker, redis_client
):
    page = linked_page(REPO_LINKS)
    # A 5 s visibility timeout: waits over 2.5 s are parked in Redis, not held as ETAs.
    worker = start_worker(
        "audits",
        concurrency=2,
        env={**fake_github.worker_env, "AUDITS_VISIBILITY_TIMEOUT_SECONDS": "5",
             "RATELIMIT_INLINE_MAX_WAIT_SECONDS": "1"},
    )  # fmt: skip
    reset_at = fake_github.exhaust(fake_github.installation, "core", reset_in=10)
    fake_github.exhaust(fake_github.installation, "graphql", reset_in=10)
    audit = submit(f"{page.url}/")
    entries = wait_for(
        lambda: len(found := parked_entries(redis_client)) == 6 and found,
        timeout=30, message=f"all six checks to be parked: {worker.output()}",
    )  # fmt: skip
    dues = sorted(due for _, due in entries)
    assert dues[0] >= reset_at
    assert len(set(dues)) == 6 and dues[-1] - dues[0] > 0.05  # spread, not a herd

    wait_for(
        lambda: Audit.objects.get(id=audit.id).status == Audit.Status.SUCCEEDED,
        timeout=30, message="the audit to finish once its checks woke",
    )  # fmt: skip
    result = Audit.objects.get(id=audit.id).result
    assert [link["status"] for link in result["links"]] == ["ok"] * 6
    assert [link["github"]["archived"] for link in result["links"]] == [
        False, True, False, False, False, False,
    ]  # fmt: skip
    assert result["link_check"]["unfinished"] == 0
    after_reset = [
        seen for seen in fake_github.requests(identity=fake_github.installation)
        if seen.at >= reset_at
    ]  # fmt: skip
    assert len(after_reset) == 6
    assert all(seen.status == 200 for seen in after_reset)
    # Before the reset, only the two answers that revealed the spent buckets.
    assert rest_and_graphql(fake_github, fake_github.installation) == (1 + 6, 1)


@pytest.mark.slow
def test_with_the_bucket_exhausted_for_the_whole_test_the_downstream_sees_only_the_revealing_requests(
    fake_github, linked_page, start_worker, redis_client
):
    fake_github.exhaust(fake_github.installation, "core", reset_in=3600)
    fake_github.exhaust(fake_github.installation, "graphql", reset_in=3600)
    page = linked_page(REPO_LINKS[:5])
    start_worker(
        "audits",
        concurrency=2,
        env={**fake_github.worker_env, "AUDIT_LINKCHECK_DEADLINE_SECONDS": "8"},
    )
    audit = submit(f"{page.url}/")

    done = wait_for(
        lambda: (found := Audit.objects.get(id=audit.id)).status == Audit.Status.SUCCEEDED
        and found,
        timeout=30, message="the audit to finish at its link-check deadline",
    )  # fmt: skip
    links = done.result["links"]
    assert [link["status"] for link in links] == ["rate_limited_pending"] * 5
    assert all(link["finished"] is False and link["retry_at"] for link in links)
    assert done.result["link_check"] == {
        "total": 5, "outcomes": {"rate_limited_pending": 5},
        "unfinished": 5, "rate_limited_pending": 5, "deadline_passed": True,
    }  # fmt: skip
    # One answer per bucket revealed it spent; nothing reached GitHub after that.
    assert rest_and_graphql(fake_github, fake_github.installation) == (1, 1)
    assert fake_github.state.mints == 1
