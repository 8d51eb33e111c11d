"""A host's robots.txt: read politely, and what it says about a link (RFC 9309, as Google reads it).

Fetched like a link check (the shared client, the SSRF guard, the host's link-check slots
and rate, its admission), once per origin per ROBOTS_FRESH_SECONDS by whichever worker
claims it (`audits.robots` keeps the shared row). What the answer means, as Google
documents it and RFC 9309 says:

| answer                                   | availability  | links on the origin       | kept for                   |
| ---------------------------------------- | ------------- | ------------------------- | -------------------------- |
| 2xx                                      | `rules`       | Protego on the first 500 KiB | ROBOTS_FRESH_SECONDS    |
| up to 5 redirects, then the final answer | as that answer | as that answer           | as that answer             |
| more redirects, an unfollowable one, 4xx but 429 | `unavailable` | all allowed       | ROBOTS_FRESH_SECONDS       |
| 5xx, a timeout, no connection            | `unreachable` | none requested            | ROBOTS_UNREACHABLE_SECONDS |
| a host name that does not exist          | `unavailable` | allowed: the check says the host does not resolve | ROBOTS_FRESH_SECONDS |

A 429 (or a 503 with Retry-After) is the host's rate limit: `OutboundClient` raises
RateLimited and the checks wait on the host's bucket, requesting nothing meanwhile.
Protego does not know HTTP, sizes or byte order marks: this module cuts the body at 500
KiB and decodes it as UTF-8 without its BOM (Protego reads a BOM as part of the first line).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import httpx2
from django.conf import settings
from protego import Protego

from outbound.bounded import TRUNCATED
from outbound.client import OutboundClient, shared_client
from outbound.integrations.links import LinkVerdict, does_not_resolve, link_check_slots
from outbound.redirects import RedirectChain, RedirectError

# Google reads the first 500 KiB of a robots.txt and ignores the rest (RFC 9309: at least that).
ROBOTS_MAX_BYTES = 500 * 1024

RULES = "rules"  # a 2xx: the file's rules apply
UNAVAILABLE = "unavailable"  # no file to obey (4xx, too many redirects): everything allowed
UNREACHABLE = "unreachable"  # 5xx or no answer: nothing may be requested for now


@dataclass(frozen=True)
class RobotsInfo:
    """What an origin's robots.txt answered: for link checks' verdicts, and for the audit's
    `robots-txt` and `is-crawlable` checks (status and text, as Lighthouse reads them)."""

    url: str  # the robots.txt asked for: `{origin}/robots.txt`
    status_code: int | None  # the final answer's status, after redirects; None: no answer
    body: str = ""  # a 2xx's text: its first 500 KiB, UTF-8 without a BOM (bad bytes replaced)
    availability: str = UNAVAILABLE
    truncated: bool = False  # longer than 500 KiB: the rest is ignored, as Google does
    error: str = ""  # why there was no answer, or why the redirects were not followed

    @property
    def fresh_seconds(self) -> float:
        if self.availability == UNREACHABLE:
            return settings.ROBOTS_UNREACHABLE_SECONDS
        return settings.ROBOTS_FRESH_SECONDS


def robots_url(origin: str) -> str:
    return f"{origin}/robots.txt"


def availability_of(status_code: int | None) -> str:
    if status_code is None or status_code >= 500 or status_code == 429:
        return UNREACHABLE
    if 200 <= status_code < 300:
        return RULES
    return UNAVAILABLE


def decode(body: bytes) -> str:
    return body[:ROBOTS_MAX_BYTES].decode("utf-8-sig", errors="replace")


def fetch_robots(origin: str) -> RobotsInfo:
    """GET `{origin}/robots.txt` under the origin's link-check politeness.

    Raises RateLimited (the host's slots or bucket say wait: the caller defers) and
    TargetNotAllowed (the guard refuses the origin: no verdict to give)."""
    url = robots_url(origin)
    timeout = settings.AUDIT_FETCH_TIMEOUT_SECONDS
    chain = RedirectChain(url)
    http = shared_client(timeout=timeout, max_body_bytes=ROBOTS_MAX_BYTES)
    outbound = OutboundClient(http, slots=link_check_slots())
    deadline = time.monotonic() + timeout
    try:
        response = chain.follow(outbound, deadline=deadline)
    except RedirectError as exc:
        # Google: past five hops (or a hop nowhere) robots.txt is treated as a 404.
        return RobotsInfo(url, exc.status_code, availability=UNAVAILABLE, error=str(exc))
    except httpx2.TimeoutException:
        return RobotsInfo(
            url, None, availability=UNREACHABLE, error=f"timed out after {timeout:g}s"
        )
    except httpx2.TransportError as exc:
        if does_not_resolve(exc):
            # Nothing to be polite to: the link's own check reports the dead host.
            return RobotsInfo(url, None, availability=UNAVAILABLE, error="host does not resolve")
        return RobotsInfo(
            url, None, availability=UNREACHABLE, error=f"{exc.__class__.__name__}: {exc}"
        )
    try:
        status = response.status_code
        availability = availability_of(status)
        if availability != RULES:
            return RobotsInfo(url, status, availability=availability)
        body = b"".join(response.iter_bytes())
        truncated = len(body) > ROBOTS_MAX_BYTES or bool(response.extensions.get(TRUNCATED))
        return RobotsInfo(url, status, decode(body), RULES, truncated=truncated)
    except httpx2.TimeoutException:
        return RobotsInfo(url, None, availability=UNREACHABLE, error="timed out reading the body")
    except (httpx2.TransportError, httpx2.DecodingError) as exc:
        return RobotsInfo(url, None, availability=UNREACHABLE, error=f"reading the body: {exc}")
    finally:
        response.close()


@functools.lru_cache(maxsize=64)
def parsed(body: str) -> Protego:
    """One parse per distinct file per process: a host's links are checked one by one."""
    return Protego.parse(body)


def crawl_delay(info: RobotsInfo, user_agent: str) -> float | None:
    """The Crawl-delay (seconds) the file asks of `user_agent`, if any."""
    if info.availability != RULES:
        return None
    delay = parsed(info.body).crawl_delay(user_agent)
    return float(delay) if delay else None


def verdict(info: RobotsInfo, url: str, user_agent: str) -> LinkVerdict:
    """May a link check request `url`, whose origin's robots.txt answered `info`?"""
    if info.availability == UNREACHABLE:
        why = info.error or f"answered {info.status_code}"
        return LinkVerdict(
            False, detail=f"not requested: {info.url} is unreachable ({why}), so nothing on the "
            "host may be requested for now (RFC 9309)",
        )  # fmt: skip
    if info.availability != RULES:
        return LinkVerdict(True)
    rules = parsed(info.body)
    delay = rules.crawl_delay(user_agent)
    if not rules.can_fetch(url, user_agent):
        return LinkVerdict(False, delay, detail=f"not requested: disallowed by {info.url}")
    return LinkVerdict(True, float(delay) if delay else None)
