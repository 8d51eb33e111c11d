"""The one redirect loop: a GET and the redirects it leads to, hop by hop.

Redirects are followed here, not by httpx2, so that every hop is its own
admitted, observed and counted request (`OutboundClient.send`), its target is
normalized like a submitted URL, and the guard checks each hop's address when
it connects. What a long chain or a bad Location means is the caller's to say:
the page fetch fails the audit, the link check reports the link broken.

A hop that may not be asked now (its origin's slots busy, its bucket closed) raises
RateLimited carrying where the chain got to (`RedirectChain.where`); the deferred
job resumes there (`RedirectChain.resumed`), so the hops that answered already are
not asked again, and the chain it reports is still the whole one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import urljoin

import httpx2

from jobs.errors import RateLimited
from outbound.client import OutboundClient
from outbound.urls import InvalidURL, normalize_url

MAX_REDIRECTS = 5
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


class RedirectError(Exception):
    """The chain cannot be followed further from `RedirectChain.current`."""

    def __init__(self, message: str, *, status_code: int, location: str):
        super().__init__(message)
        self.status_code = status_code
        self.location = location


class TooManyRedirects(RedirectError):
    """More than MAX_REDIRECTS hops."""


class UnfollowableRedirect(RedirectError):
    """A Location that is no URL Plumb fetches (another scheme, no host, too long)."""


class DeadlinePassed(httpx2.TimeoutException):
    """The chain's whole time ran out between hops: a timeout like any other."""


class RedirectChain:
    """Where a GET of `url` has got to: `current` is the URL of the latest hop,
    `redirects` the hops before it ({"url", "status_code"}), so a caller that
    catches an error can say which hop failed."""

    def __init__(self, url: str):
        self.url = url
        self.current = url
        self.redirects: list[dict] = []

    def where(self) -> dict:
        """Where the chain has got to, as JSON: for a deferred job to resume it."""
        return {"url": self.url, "current": self.current, "redirects": self.redirects}

    @classmethod
    def resumed(cls, url: str, where) -> RedirectChain:
        """The chain of `url`, from where a deferred run of it got to (`where`); from the
        start when `where` is None or not a point of this chain (it came in a message)."""
        chain = cls(url)
        if _is_point_of(url, where):
            chain.current = where["current"]
            chain.redirects = [
                {"url": hop["url"], "status_code": hop["status_code"]} for hop in where["redirects"]
            ]
        return chain

    def follow(
        self,
        outbound: OutboundClient,
        *,
        deadline: float,
        headers_for: dict[str, dict[str, str]] | None = None,
        before_hop: Callable[[str], None] | None = None,
    ) -> httpx2.Response:
        """The first answer that is not a redirect, streamed and open: the caller closes it.

        `deadline` (time.monotonic()) bounds the whole chain. `headers_for` adds headers
        to the hop of one URL (a conditional request's validators belong to the URL that
        gave them). `before_hop(url)` is called before each redirect target is requested
        (a resumed chain's current hop included); whatever it raises ends the chain there,
        a RateLimited saying where the chain got to. Raises TooManyRedirects,
        UnfollowableRedirect, DeadlinePassed, and whatever `outbound.send` raises.
        """
        while True:
            try:
                if before_hop is not None and self.redirects:
                    before_hop(self.current)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DeadlinePassed(f"no time left to fetch {self.current}")
                request = outbound.http.build_request(
                    "GET",
                    self.current,
                    timeout=httpx2.Timeout(remaining),
                    headers=(headers_for or {}).get(self.current),
                )
                response = outbound.send(request, stream=True, deadline=deadline)
            except RateLimited as exc:
                if self.redirects:
                    exc.resume = self.where()
                raise
            status = response.status_code
            if status not in REDIRECT_STATUSES or "location" not in response.headers:
                return response
            response.close()
            location = response.headers["location"]
            self.redirects.append({"url": self.current, "status_code": status})
            if len(self.redirects) > MAX_REDIRECTS:
                raise TooManyRedirects(
                    f"more than {MAX_REDIRECTS} redirects starting at {self.url}",
                    status_code=status,
                    location=location,
                )
            try:
                self.current = normalize_url(urljoin(self.current, location)).url
            except InvalidURL as exc:
                raise UnfollowableRedirect(
                    str(exc), status_code=status, location=location
                ) from None


def _is_point_of(url: str, where) -> bool:
    """`where` is a point `RedirectChain.where` gave for `url`: the chain's own start, at
    most MAX_REDIRECTS hops of (URL, redirect status), and a URL Plumb fetches next."""
    if not isinstance(where, dict) or where.get("url") != url:
        return False
    hops, current = where.get("redirects"), where.get("current")
    if not isinstance(hops, list) or not 0 < len(hops) <= MAX_REDIRECTS:
        return False
    if not all(
        isinstance(hop, dict)
        and isinstance(hop.get("url"), str)
        and hop.get("status_code") in REDIRECT_STATUSES
        for hop in hops
    ):
        return False
    try:
        return isinstance(current, str) and normalize_url(current).url == current
    except InvalidURL:
        return False
