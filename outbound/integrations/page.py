"""The audited page: one GET through the redirect loop, a size cap, timings.

Each hop holds one of its host's page-fetch slots (PAGE_FETCH_PER_HOST_CONCURRENCY,
across every worker, `outbound.hostslots`): a thousand pages of one site submitted
together reach it a few at a time, as a polite crawler's would. A host whose slots are
all taken raises RateLimited at once, so the audit waits in the delayed store, not in
a worker thread, and audits of other hosts run meanwhile.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx2
from django.conf import settings

from jobs.errors import Permanent, Transient
from outbound.bounded import TRUNCATED
from outbound.client import OutboundClient, shared_client
from outbound.guard import TargetNotAllowed
from outbound.hostslots import SlotLimit, call_lease
from outbound.redirects import RedirectChain, TooManyRedirects, UnfollowableRedirect
from outbound.statuses import classify_status, unwanted_answer


def page_fetch_slots(timeout: float) -> SlotLimit:
    return SlotLimit(
        "pages",
        concurrency=settings.PAGE_FETCH_PER_HOST_CONCURRENCY,
        # Held for one fetch at most (every hop and the body are within the timeout).
        lease=call_lease(timeout),
        wait_inline=False,
        warmup_rate=settings.PAGE_FETCH_WARMUP_RATE or None,
    )


@dataclass(frozen=True)
class Validators:
    """A response's validators, for a later conditional request to the same URL."""

    url: str
    etag: str = ""
    last_modified: str = ""

    @classmethod
    def of(cls, url: str, headers: httpx2.Headers) -> Validators | None:
        found = cls(url, headers.get("etag", ""), headers.get("last-modified", ""))
        return found if found.etag or found.last_modified else None

    @classmethod
    def from_json(cls, data) -> Validators | None:
        if not isinstance(data, dict) or not isinstance(data.get("url"), str):
            return None
        etag, modified = data.get("etag") or "", data.get("last_modified") or ""
        if not (isinstance(etag, str) and isinstance(modified, str) and (etag or modified)):
            return None
        return cls(data["url"], etag, modified)

    def as_json(self) -> dict:
        return {"url": self.url, "etag": self.etag, "last_modified": self.last_modified}

    def request_headers(self) -> dict[str, dict[str, str]]:
        """{url: headers}: If-None-Match and If-Modified-Since (RFC 9110 13.1)."""
        headers = {}
        if self.etag:
            headers["If-None-Match"] = self.etag
        if self.last_modified:
            headers["If-Modified-Since"] = self.last_modified
        return {self.url: headers}


@dataclass
class FetchedPage:
    requested_url: str
    final_url: str
    status_code: int
    headers: httpx2.Headers
    body: bytes
    truncated: bool
    ttfb_ms: float
    total_ms: float
    redirects: list[dict] = field(default_factory=list)

    @property
    def not_modified(self) -> bool:
        return self.status_code == 304

    @property
    def validators(self) -> Validators | None:
        """What a later fetch may send to ask whether the page changed: a success's only."""
        if not 200 <= self.status_code < 300:
            return None
        return Validators.of(self.final_url, self.headers)

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()

    @property
    def charset(self) -> str | None:
        for param in self.headers.get("content-type", "").split(";")[1:]:
            key, _, value = param.partition("=")
            if key.strip().lower() == "charset":
                return value.strip().strip('"') or None
        return None


def fetch_page(
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    user_agent: str,
    allow_private: bool,
    resume: dict | None = None,
    validators: Validators | None = None,
) -> FetchedPage:
    """Fetch `url`, following up to five redirects, within `timeout` seconds in all;
    from the hop a deferred fetch had reached, given its `resume` (`RateLimited.resume`).

    The timeout bounds the whole fetch (every hop, its headers and the body), so a
    server that trickles headers or a body without end still ends the audit on time;
    the size cap (on the decoded body: `outbound.bounded`) truncates the body rather
    than failing the audit. A body Plumb cannot decode raises Permanent. A 4xx page is a result to
    report; a retryable status (5xx, 408, 425, 429) raises Transient with the
    page's Retry-After. Each hop is admitted against its host's rate-limit
    observations first: a host that asked us to wait longer than an inline wait
    raises RateLimited. A forbidden address, a redirect loop or a redirect to
    something unfetchable raises Permanent.

    `validators` (an earlier fetch's ETag and Last-Modified) make the request to their
    URL conditional: a `304 Not Modified` comes back as such, with no body.
    """
    started = time.monotonic()
    deadline = started + timeout
    chain = RedirectChain.resumed(url, resume)
    client = shared_client(
        timeout=timeout,
        user_agent=user_agent,
        allow_private=allow_private,
        max_body_bytes=max_bytes,
    )
    try:
        outbound = OutboundClient(client, slots=page_fetch_slots(timeout))
        response = chain.follow(
            outbound,
            deadline=deadline,
            headers_for=validators.request_headers() if validators else None,
        )
    except TargetNotAllowed as exc:
        raise Permanent(f"refused to fetch {chain.current}: {exc}") from exc
    except TooManyRedirects as exc:
        raise Permanent(str(exc)) from None
    except UnfollowableRedirect as exc:
        raise Permanent(
            f"{chain.current} redirects to {exc.location!r}, which cannot be fetched: {exc}"
        ) from None
    except httpx2.TimeoutException as exc:
        raise Transient(f"timed out after {timeout:g}s fetching {chain.current}") from exc
    except httpx2.TransportError as exc:
        raise Transient(
            f"could not fetch {chain.current}: {exc.__class__.__name__}: {exc}"
        ) from exc
    try:
        ttfb_ms = (time.monotonic() - started) * 1000
        if classify_status(response.status_code).retryable:
            raise unwanted_answer(f"{chain.current} answered {response.status_code}", response)
        body, truncated = _read_body(
            response, max_bytes=max_bytes, deadline=deadline, timeout=timeout
        )
    finally:
        response.close()
    return FetchedPage(
        requested_url=url,
        final_url=chain.current,
        status_code=response.status_code,
        headers=response.headers,
        body=body,
        truncated=truncated,
        ttfb_ms=round(ttfb_ms, 1),
        total_ms=round((time.monotonic() - started) * 1000, 1),
        redirects=chain.redirects,
    )


def _read_body(
    response: httpx2.Response, *, max_bytes: int, deadline: float, timeout: float
) -> tuple[bytes, bool]:
    # The client decodes the body and cuts it at max_bytes, and its reads end at the
    # deadline (outbound.bounded); the checks here restate both for this loop.
    chunks: list[bytes] = []
    size = 0
    try:
        for chunk in response.iter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                return b"".join(chunks)[:max_bytes], True
            if time.monotonic() > deadline:
                raise Transient(f"timed out after {timeout:g}s reading the body of {response.url}")
    except httpx2.TimeoutException as exc:
        raise Transient(f"timed out after {timeout:g}s reading the body of {response.url}") from exc
    except httpx2.TransportError as exc:
        raise Transient(f"connection broke reading the body of {response.url}: {exc}") from exc
    except httpx2.DecodingError as exc:
        raise Permanent(f"cannot decode the body of {response.url}: {exc}") from None
    return b"".join(chunks), bool(response.extensions.get(TRUNCATED))
