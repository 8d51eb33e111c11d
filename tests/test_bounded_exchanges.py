"""Hostile downstreams (issue 26): decompression bombs and headers trickled byte by byte, served
by a real HTTP server on 127.0.0.1, against every integration (page, links, GitHub, webhook)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import psutil
import pytest

from jobs.errors import Permanent, Transient
from outbound.integrations import links, webhook
from outbound.integrations.github import GitHubClient, GitHubCredentials
from outbound.integrations.page import fetch_page
from tests.hostile import HostileServer, SilentResolver, bomb
from tests.workers import database_url_for_workers, wait_for

pytestmark = pytest.mark.django_db

# What reading a bomb may add to this process: the cap (at most 5 MiB here) and the
# decoders' pieces, far from the GiB a bomb inflates to.
MAX_GROWTH_BYTES = 200 * 1024 * 1024


@pytest.fixture(scope="session")
def _bombs():
    # Built once, before any request: compressing a GiB takes seconds of CPU.
    for codings in [("gzip", "gzip"), ("gzip", "gzip", "gzip")]:
        bomb(codings)


@pytest.fixture
def hostile(_bombs, http_server):
    return http_server(HostileServer(trickle_interval=0.5, trickle_seconds=60))


def fetch(url, **overrides):
    options = {"timeout": 10.0, "max_bytes": 1024 * 1024, "user_agent": "PlumbTest/1"}
    options.update(overrides)
    return fetch_page(url, allow_private=True, **options)


class PeakGrowth:
    """The most this process's RSS grew above its start while the block ran, sampled
    every few milliseconds: an inflated body is freed by the time the call returns."""

    def __enter__(self):
        self.process = psutil.Process()
        self.start = self.peak = self.process.memory_info().rss
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while not self.stopping.wait(0.002):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __exit__(self, *exc):
        self.stopping.set()
        self.thread.join()

    @property
    def bytes(self) -> int:
        return self.peak - self.start


# --- Bombs ------------------------------------------------------------------------------


def test_a_double_gzipped_gigabyte_is_read_as_its_first_bytes_and_reported_truncated(hostile):
    with PeakGrowth() as growth:
        page = fetch(f"{hostile.base_url}/bomb?codings=gzip,gzip", max_bytes=5 * 1024 * 1024)
    assert page.truncated is True
    assert page.body == bytes(5 * 1024 * 1024)
    assert growth.bytes < MAX_GROWTH_BYTES, f"grew {growth.bytes / 2**20:.0f} MiB"


def test_more_stacked_codings_than_allowed_are_refused_for_good(hostile):
    with pytest.raises(Permanent, match="stacks 3 codings; at most 2 are decoded"):
        fetch(f"{hostile.base_url}/bomb?codings=gzip,gzip,gzip")


def test_a_coding_plumb_does_not_decode_is_refused_for_good(hostile):
    with pytest.raises(Permanent, match="'br' is not one Plumb decodes"):
        fetch(f"{hostile.base_url}/plain?codings=br")


@pytest.mark.parametrize("codings", ["", "gzip", "deflate", "raw-deflate", "gzip,deflate"])
def test_every_coding_plumb_asks_for_decodes_to_the_page(hostile, codings):
    page = fetch(f"{hostile.base_url}/plain?codings={codings}")
    assert hostile.accept_encodings == ["gzip, deflate"]
    assert page.truncated is False
    assert page.body.startswith(b"<!doctype html>") and page.body.endswith(b"</html>")
    assert "content-encoding" not in page.headers


def test_no_codings_allowed_asks_for_identity(hostile, settings):
    settings.OUTBOUND_MAX_CONTENT_CODINGS = 0
    page = fetch(f"{hostile.base_url}/plain")
    assert page.body.startswith(b"<!doctype html>")
    assert hostile.accept_encodings == ["identity"]
    with pytest.raises(Permanent, match="stacks 1 codings; at most 0"):
        fetch(f"{hostile.base_url}/plain?codings=gzip")


def test_a_receiver_answering_500_with_a_bomb_costs_the_delivery_an_excerpt(hostile):
    with PeakGrowth() as growth, pytest.raises(Transient, match="HTTP 500"):
        webhook.post(f"{hostile.base_url}/bomb?codings=gzip,gzip&status=500", body="{}", headers={})
    assert growth.bytes < MAX_GROWTH_BYTES, f"grew {growth.bytes / 2**20:.0f} MiB"


def test_a_github_api_answering_a_bomb_is_a_transient_failure(hostile, redis_client):
    github = GitHubClient(GitHubCredentials(api_url=f"{hostile.base_url}/bomb", token="t"))
    try:
        with PeakGrowth() as growth, pytest.raises(Transient, match="not JSON"):
            github.repository_via_rest("octo", "repo")
    finally:
        github.close()
    assert growth.bytes < MAX_GROWTH_BYTES, f"grew {growth.bytes / 2**20:.0f} MiB"


# --- Deadlines --------------------------------------------------------------------------
# The server sends a status line, then one header byte every 0.5 s for a minute: no read
# ever waits long enough to time out, so only a deadline on the whole exchange ends it.

DEADLINE = 1.5
# Generous: the point is that the exchange ends near its deadline, not a minute later.
ENDS_WITHIN = DEADLINE + 5


def _page(url, settings):
    fetch(url, timeout=DEADLINE)


def _link(url, settings):
    settings.AUDIT_FETCH_TIMEOUT_SECONDS = DEADLINE
    links.check_http(url)


def _github(url, settings):
    settings.AUDIT_FETCH_TIMEOUT_SECONDS = DEADLINE
    github = GitHubClient(GitHubCredentials(api_url=url, token="t"))
    try:
        github.repository_via_rest("octo", "repo")
    finally:
        github.close()


def _webhook(url, settings):
    settings.WEBHOOK_TIMEOUT_SECONDS = DEADLINE
    webhook.post(url, body="{}", headers={})


@pytest.mark.parametrize("call", [_page, _link, _github, _webhook], ids=lambda c: c.__name__[1:])
def test_a_receiver_trickling_its_headers_is_cut_off_at_the_deadline(
    hostile, settings, redis_client, call
):
    started = time.monotonic()
    with pytest.raises(Transient):
        call(f"{hostile.base_url}/trickle", settings)
    assert time.monotonic() - started < ENDS_WITHIN
    # The connection is closed, not left trickling: the server sees its client go.
    wait_for(lambda: hostile.in_flight == 0, timeout=5, message="the server to see the client go")


# --- A lookup the resolver never answers ---------------------------------------------------

# Run in a process of its own whose resolver is the silent one: each integration, against a
# name only DNS could answer, one JSON line each.
_LOOKUP_CALLS = """
import json, sys, time
import django
django.setup()
from jobs.errors import Transient
from outbound.integrations import links, webhook
from outbound.integrations.github import GitHubClient, GitHubCredentials
from outbound.integrations.page import fetch_page

url, deadline = sys.argv[1], float(sys.argv[2])
calls = {
    "page": lambda: fetch_page(url, timeout=deadline, max_bytes=1 << 20, user_agent="PlumbTest/1",
                               allow_private=False),
    "link": lambda: links.check_http(url),
    "github": lambda: GitHubClient(GitHubCredentials(api_url=url, token="t")).repository_via_rest(
        "octo", "repo"),
    "webhook": lambda: webhook.post(url, body="{}", headers={}),
}
for name, call in calls.items():
    started = time.monotonic()
    try:
        call()
        outcome = "answered"
    except Transient:
        outcome = "transient"
    except Exception as exc:
        outcome = repr(exc)
    print(json.dumps({"call": name, "seconds": time.monotonic() - started, "outcome": outcome}),
          flush=True)
"""


@pytest.fixture
def silent_resolver():
    reason = SilentResolver.unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs as root with util-linux: {reason}")
        pytest.skip(f"the silent resolver needs a mount namespace: {reason}")
    resolver = SilentResolver().start()
    yield resolver
    resolver.stop()


def test_a_lookup_the_resolver_never_answers_ends_at_the_deadline(silent_resolver):
    # The resolver waits 30 s a try; getaddrinfo cannot be interrupted, so without a bound
    # of Plumb's own each call below would hold its worker thread for those 30 s.
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": database_url_for_workers(),
        "AUDIT_FETCH_TIMEOUT_SECONDS": str(DEADLINE),
        "WEBHOOK_TIMEOUT_SECONDS": str(DEADLINE),
        "AUDIT_ALLOW_PRIVATE_TARGETS": "false",
    }
    url = "http://unanswered.plumb-test.example/"
    done = silent_resolver.run(
        [sys.executable, "-c", _LOOKUP_CALLS, url, str(DEADLINE)], env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["call"] for r in results] == ["page", "link", "github", "webhook"]
    for result in results:
        assert result["outcome"] == "transient", result
        assert result["seconds"] < ENDS_WITHIN, result
    # The lookups did reach the silent resolver: it, not a fast refusal, was what they met.
    assert silent_resolver.queries >= len(results)


# Run in a process whose resolver is the silent one: a name only DNS could answer, left
# hanging at its deadline, then `localhost` (from /etc/hosts), at once.
_LOOKUP_BESIDE_A_HUNG_ONE = """
import json, sys, time
import httpcore2
from outbound.guard import resolve

try:
    resolve(sys.argv[1], 80, 0.5)
    hung = "answered"
except httpcore2.ConnectTimeout:
    hung = "timed out"
started = time.monotonic()
addresses = resolve("localhost", 80, 5.0)
print(json.dumps({"hung": hung, "addresses": addresses, "seconds": time.monotonic() - started}))
"""


def test_a_lookup_the_resolver_never_answers_holds_up_no_other_lookup(silent_resolver):
    # The hung lookup keeps its thread for the resolver's 30 s; the next lookup takes
    # another, so a name the machine can answer is answered at once.
    done = silent_resolver.run(
        [sys.executable, "-c", _LOOKUP_BESIDE_A_HUNG_ONE, "unanswered.plumb-test.example"],
        env=dict(os.environ), timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["hung"] == "timed out"
    assert result["addresses"] == ["127.0.0.1"]
    assert result["seconds"] < 1.0, result
