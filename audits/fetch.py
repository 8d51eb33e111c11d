"""Fetching a page over HTTP: redirects followed by hand, a size cap, timings."""

from __future__ import annotations

import functools
import ssl
import time
from dataclasses import dataclass, field
from urllib.parse import urljoin

import httpx

from audits.targets import GuardedNetworkBackend, InvalidURL, TargetNotAllowed, normalize_url
from jobs.errors import Permanent, Transient
from ratelimit.client import OutboundClient
from ratelimit.headers import parse_retry_after

MAX_REDIRECTS = 5
REDIRECT_STATUSES = {301, 302, 303, 307, 308}
# A downstream answering these is having trouble, not telling us about the page.
TRANSIENT_STATUSES = {408, 425, 429, 500, 502, 503, 504}


class FetchError(Exception):
    """A fetch that produced no page to report on."""


class TransientFetchError(FetchError, Transient):
    """Worth trying again later: a timeout, a refused connection, a 5xx."""

    def __init__(
        self, message: str, *, retry_after: float | None = None, status_code: int | None = None
    ):
        super().__init__(message)
        self.retry_after = retry_after
        self.status_code = status_code


class PermanentFetchError(FetchError, Permanent):
    """Trying again cannot help: a forbidden target, a redirect loop."""


@dataclass
class FetchedPage:
    requested_url: str
    final_url: str
    status_code: int
    headers: httpx.Headers
    body: bytes
    truncated: bool
    ttfb_ms: float
    total_ms: float
    redirects: list[dict] = field(default_factory=list)

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


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Building one loads the CA bundle: about 35 ms of CPU, which every attempt
    # (and so every retry in a storm) paid when each client built its own.
    return httpx.create_ssl_context()


def build_client(*, timeout: float, user_agent: str, allow_private: bool) -> httpx.Client:
    transport = httpx.HTTPTransport(retries=0, verify=_ssl_context())
    # httpx has no public hook for the network backend; the pool's is the one
    # place every connection (and so every redirect hop) goes through.
    transport._pool._network_backend = GuardedNetworkBackend(allow_private=allow_private)
    return httpx.Client(
        transport=transport,
        timeout=httpx.Timeout(timeout),
        follow_redirects=False,
        headers={"User-Agent": user_agent, "Accept": "text/html,application/xhtml+xml,*/*;q=0.8"},
    )


def fetch_page(
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    user_agent: str,
    allow_private: bool,
) -> FetchedPage:
    """Fetch `url`, following up to five redirects, within `timeout` seconds in all.

    The timeout bounds the whole fetch (every hop and the body), so a server
    that trickles a body without end still ends the audit on time; the size cap
    truncates the body rather than failing the audit. Each hop is admitted
    against its host's rate-limit observations first: a host that asked us to
    wait longer than an inline wait raises `ratelimit.admission.RateLimited`.
    """
    started = time.monotonic()
    deadline = started + timeout
    redirects: list[dict] = []
    current = url
    with build_client(
        timeout=timeout, user_agent=user_agent, allow_private=allow_private
    ) as client:
        outbound = OutboundClient(client)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TransientFetchError(f"timed out after {timeout:g}s fetching {current}")
            request = client.build_request("GET", current, timeout=httpx.Timeout(remaining))
            try:
                response = outbound.send(request, stream=True, deadline=deadline)
            except TargetNotAllowed as exc:
                raise PermanentFetchError(f"refused to fetch {current}: {exc}") from exc
            except httpx.TimeoutException as exc:
                raise TransientFetchError(
                    f"timed out after {timeout:g}s fetching {current}"
                ) from exc
            except (httpx.TransportError, httpx.ProtocolError) as exc:
                raise TransientFetchError(
                    f"could not fetch {current}: {exc.__class__.__name__}: {exc}"
                ) from exc
            try:
                ttfb_ms = (time.monotonic() - started) * 1000
                if response.status_code in REDIRECT_STATUSES and "location" in response.headers:
                    redirects.append({"url": current, "status_code": response.status_code})
                    if len(redirects) > MAX_REDIRECTS:
                        raise PermanentFetchError(
                            f"more than {MAX_REDIRECTS} redirects starting at {url}"
                        )
                    current = _redirect_target(current, response.headers["location"])
                    continue
                if response.status_code in TRANSIENT_STATUSES:
                    raise TransientFetchError(
                        f"{current} answered {response.status_code}",
                        retry_after=parse_retry_after(response.headers.get("retry-after")),
                        status_code=response.status_code,
                    )
                body, truncated = _read_body(
                    response, max_bytes=max_bytes, deadline=deadline, timeout=timeout
                )
            finally:
                response.close()
            return FetchedPage(
                requested_url=url,
                final_url=current,
                status_code=response.status_code,
                headers=response.headers,
                body=body,
                truncated=truncated,
                ttfb_ms=round(ttfb_ms, 1),
                total_ms=round((time.monotonic() - started) * 1000, 1),
                redirects=redirects,
            )


def _redirect_target(current: str, location: str) -> str:
    try:
        return normalize_url(urljoin(current, location)).url
    except InvalidURL as exc:
        raise PermanentFetchError(
            f"{current} redirects to {location!r}, which cannot be fetched: {exc}"
        ) from None


def _read_body(
    response: httpx.Response, *, max_bytes: int, deadline: float, timeout: float
) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    try:
        for chunk in response.iter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size >= max_bytes:
                return b"".join(chunks)[:max_bytes], True
            if time.monotonic() > deadline:
                raise TransientFetchError(
                    f"timed out after {timeout:g}s reading the body of {response.url}"
                )
    except httpx.TimeoutException as exc:
        raise TransientFetchError(
            f"timed out after {timeout:g}s reading the body of {response.url}"
        ) from exc
    except (httpx.TransportError, httpx.ProtocolError) as exc:
        raise TransientFetchError(
            f"connection broke reading the body of {response.url}: {exc}"
        ) from exc
    return b"".join(chunks), False
