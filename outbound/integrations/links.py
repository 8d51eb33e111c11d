"""Checking one outbound link: a GET through the redirect loop, or GitHub's API for a repository.

Links to GitHub repositories are checked through the API when credentials are
configured (exists? archived?), otherwise like any other link. Plain links hold
one of their host's slots (LINKCHECK_PER_HOST_CONCURRENCY, LINKCHECK_PER_HOST_RATE)
across every worker. Each redirect target is put to the caller's robots.txt verdict
(`verdict_for`) before it is requested. Outcome statuses are the values of
`audits.models.LinkCheck.Status` (outbound does not import audits).
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx2
from django.conf import settings

from jobs.errors import Permanent, Transient
from outbound.client import OutboundClient, shared_client
from outbound.guard import TargetNotAllowed
from outbound.hostslots import SlotLimit, call_lease
from outbound.integrations.github import GitHubClient
from outbound.redirects import RedirectChain, TooManyRedirects, UnfollowableRedirect
from outbound.statuses import Answer, classify_status, unwanted_answer
from outbound.urls import InvalidURL, origin_key

OK = "ok"
REDIRECTED = "redirected"
BROKEN = "broken"
SKIPPED = "skipped"
BLOCKED_BY_ROBOTS = "blocked_by_robots"  # its origin's robots.txt says no (audits.robots)

GITHUB_WEB_HOSTS = {"github.com", "www.github.com"}
# github.com/<owner>/<repo>, optionally with a trailing slash or .git: a repository.
GITHUB_REPOSITORY_PATH = re.compile(
    r"^/([A-Za-z0-9](?:[A-Za-z0-9-]{0,38}))/([A-Za-z0-9._-]{1,100}?)(?:\.git)?/?$"
)
# First path segments on github.com that are pages, not owners.
GITHUB_RESERVED = {
    "about", "apps", "collections", "customer-stories", "enterprise", "explore", "features",
    "issues", "login", "marketplace", "new", "notifications", "orgs", "pricing", "pulls",
    "readme", "search", "security", "settings", "site", "sponsors", "team", "topics", "trending",
}  # fmt: skip


@dataclass(frozen=True)
class LinkVerdict:
    """May a link check request a URL (its origin's robots.txt, outbound.integrations.robots)."""

    allowed: bool
    crawl_delay: float | None = None  # seconds between a host's link checks, if it asks
    detail: str = ""  # why a link is not requested


# The verdict on a URL a check is about to request, None when there is none to give (no
# origin, a refused host): audits.robots.link_verdict, handed in (outbound imports no app).
# It may raise RateLimited (another worker is reading that robots.txt, or the host says wait).
VerdictFor = Callable[[str], LinkVerdict | None]


class _HopDisallowed(Exception):
    """A redirect's target that its own robots.txt says not to request."""


@dataclass(frozen=True)
class LinkOutcome:
    status: str
    status_code: int | None = None
    final_url: str = ""
    github: dict | None = None
    detail: str = ""


def link_check_slots(*, crawl_delays: dict[str, float] | None = None) -> SlotLimit:
    """The link checks' per-host slots; `crawl_delays` ({origin: seconds}, from robots.txt)
    space those origins' checks further (up to ROBOTS_MAX_CRAWL_DELAY_SECONDS)."""
    longest = settings.ROBOTS_MAX_CRAWL_DELAY_SECONDS
    return SlotLimit(
        "links",
        concurrency=settings.LINKCHECK_PER_HOST_CONCURRENCY,
        rate=settings.LINKCHECK_PER_HOST_RATE,
        lease=call_lease(settings.AUDIT_FETCH_TIMEOUT_SECONDS),
        name_rates=tuple(
            (origin, 1.0 / min(delay, longest))
            for origin, delay in (crawl_delays or {}).items()
            if delay > 0 and longest > 0
        ),
    )


def github_repository(url: str) -> tuple[str, str] | None:
    """(owner, name) when `url` is a GitHub repository's page."""
    parts = urlsplit(url)
    if (parts.hostname or "").lower() not in GITHUB_WEB_HOSTS or parts.query:
        return None
    match = GITHUB_REPOSITORY_PATH.match(parts.path)
    if not match or match.group(1).lower() in GITHUB_RESERVED:
        return None
    return match.group(1), match.group(2)


def check_url(
    url: str,
    *,
    github: GitHubClient | None = None,
    resume: dict | None = None,
    crawl_delay: float | None = None,
    verdict_for: VerdictFor | None = None,
) -> LinkOutcome:
    """Check one link. Raises RateLimited (defer) or Transient (retry).

    `resume` is where a deferred check of the link had got to (`RateLimited.resume`);
    `crawl_delay` the link's origin's robots.txt Crawl-delay, if it has one;
    `verdict_for` is asked about each redirect target before it is requested.
    """
    repository = github_repository(url) if github is not None else None
    if repository is not None:
        return check_github_repository(github, *repository)
    return check_http(url, resume=resume, crawl_delay=crawl_delay, verdict_for=verdict_for)


def check_github_repository(github: GitHubClient, owner: str, name: str) -> LinkOutcome:
    try:
        repository = github.repository(owner, name)
    except Permanent as exc:
        # GitHub refuses to say (a plain 403, say): retrying cannot change that.
        return LinkOutcome(BROKEN, status_code=exc.status_code, detail=f"GitHub API: {exc}")
    facts = {
        "repository": repository.full_name or f"{owner}/{name}",
        "missing": not repository.exists,
        "archived": repository.archived,
        "via": repository.via,
    }
    if not repository.exists:
        return LinkOutcome(BROKEN, github=facts, detail="repository not found")
    if repository.moved:
        return LinkOutcome(REDIRECTED, final_url=repository.url, github=facts)
    return LinkOutcome(OK, github=facts)


def does_not_resolve(exc: BaseException) -> bool:
    """A name that does not exist, as opposed to a resolver that failed for now."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, socket.gaierror):
            return seen.errno in {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", -5)}
        seen = seen.__cause__ or seen.__context__
    return False


def check_http(
    url: str,
    *,
    resume: dict | None = None,
    crawl_delay: float | None = None,
    verdict_for: VerdictFor | None = None,
) -> LinkOutcome:
    """GET the link (no body read), following up to five redirects, host by host politely;
    from the hop a deferred check had reached, given its `resume`. A hop whose host is
    busy raises RateLimited saying where the chain got to. `crawl_delay` spaces the
    link's own origin's checks (its robots.txt's Crawl-delay).

    Each redirect target is put to `verdict_for` before it is requested, as the link
    itself was: one its robots.txt disallows (or whose robots.txt is unreachable) ends
    the check `blocked_by_robots` at that hop, unrequested; one it allows is requested
    at its own origin's Crawl-delay."""
    timeout = settings.AUDIT_FETCH_TIMEOUT_SECONDS
    chain = RedirectChain.resumed(url, resume)
    http = shared_client(timeout=timeout)
    delays: dict[str, float] = {}
    if crawl_delay:
        with contextlib.suppress(InvalidURL):
            delays[origin_key(url)] = crawl_delay
    outbound = OutboundClient(http, slots=link_check_slots(crawl_delays=delays))

    def before_hop(hop: str) -> None:
        verdict = verdict_for(hop)
        if verdict is None:
            return
        if not verdict.allowed:
            raise _HopDisallowed(verdict.detail)
        if verdict.crawl_delay:
            delays[origin_key(hop)] = verdict.crawl_delay
            outbound.slots = link_check_slots(crawl_delays=delays)

    try:
        response = chain.follow(
            outbound,
            deadline=time.monotonic() + timeout,
            before_hop=before_hop if verdict_for is not None else None,
        )
    except _HopDisallowed as exc:
        last = chain.redirects[-1]
        return LinkOutcome(
            BLOCKED_BY_ROBOTS,
            final_url=chain.current,
            detail=f"redirected ({last['status_code']}) to {chain.current}, {exc}",
        )
    except TargetNotAllowed as exc:
        return LinkOutcome(SKIPPED, detail=f"not checked: {exc}")
    except InvalidURL as exc:
        # A link with no origin (an empty label: `http://a..b/`) names no server to ask.
        return LinkOutcome(BROKEN, final_url=chain.current, detail=f"not a valid URL: {exc}")
    except TooManyRedirects as exc:
        return LinkOutcome(BROKEN, exc.status_code, chain.current, detail="too many redirects")
    except UnfollowableRedirect as exc:
        return LinkOutcome(BROKEN, exc.status_code, chain.current, detail=str(exc))
    except httpx2.TimeoutException as exc:
        raise Transient(f"timed out after {timeout:g}s checking {chain.current}") from exc
    except httpx2.TransportError as exc:
        if does_not_resolve(exc):
            return LinkOutcome(BROKEN, final_url=chain.current, detail="host does not resolve")
        raise Transient(f"could not check {chain.current}: {exc}") from exc
    response.close()
    status = response.status_code
    answer = classify_status(status)
    if answer.retryable:
        raise unwanted_answer(f"{chain.current} answered {status}", response)
    if answer is Answer.PERMANENT:
        return LinkOutcome(BROKEN, status, chain.current)
    return LinkOutcome(REDIRECTED if chain.redirects else OK, status, chain.current)
