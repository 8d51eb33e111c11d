"""The one client factory and the one sender every outbound call goes through.

`build_client` makes the httpx2 client, and `shared_client` keeps one per process and
settings for every caller (page fetches, link checks, webhook deliveries): the SSRF
guard at connect time (every connection, so every redirect hop, unless
AUDIT_ALLOW_PRIVATE_TARGETS), one TLS context per process, a timeout that is also each
exchange's whole deadline (connect, headers and body), a cap on the decoded body and on
stacked content codings (`outbound.bounded`), Plumb's user agent, no automatic redirects
(the one redirect loop is `outbound.redirects`), and no cookie kept (`NoCookies`).

`OutboundClient.send` asks admission about the call's bucket before making it,
records what the response says about the bucket (`ratelimit.responses`), sleeps
short waits inline (INLINE_WAITS through `jobs.policy.delay`) and raises
`jobs.errors.RateLimited` for long ones. Optionally it holds one of the origin's
(or the credential's) slots for the call (`outbound.hostslots`). Every request
that reaches a downstream, or fails trying, is one downstream request in the metrics.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import logging
import os
import ssl
import time
from collections.abc import Callable

import httpx2
import redis
from django.conf import settings

from config.redis import redis_client
from jobs.errors import RateLimited
from jobs.policy import RETRY, delay
from observability.metrics import record_downstream_request
from outbound import bounded, hostslots
from outbound.guard import GuardedNetworkBackend
from outbound.statuses import Answer, classify_status
from outbound.urls import origin_key
from ratelimit.admission import (
    INLINE_WAITS,
    MAX_INLINE_RETRIES,
    Admission,
    admit,
    admit_read,
    reads_one_bucket,
)
from ratelimit.observations import DEFAULT_RESOURCE, Kind, host_key, hot_key
from ratelimit.responses import Verdict, observe

log = logging.getLogger(__name__)

ACCEPT = "text/html,application/xhtml+xml,*/*;q=0.8"
# The downstream-request metric's outcome for each answer.
METRIC_OUTCOMES = {
    Answer.OK: "ok",
    Answer.PERMANENT: "ok",  # an answer, if not the one wanted
    Answer.RATE_LIMITED: "rate_limited",
    Answer.TRANSIENT: "transient_status",
}

_tls: tuple[int, ssl.SSLContext] | None = None


class NoCookies(http.cookiejar.CookieJar):
    """A cookie jar that keeps nothing. A process's client is shared by every audit, link
    check and delivery, whoever asked for it: a cookie one client's audit was given would
    go with another client's next fetch of that site, and what a page shows would depend
    on which audits came before. A crawler's view is a cookieless one (Googlebot sends
    none), and not parsing Set-Cookie saves each answer's cookie handling."""

    def extract_cookies(self, response, request) -> None:
        return None

    def set_cookie(self, cookie) -> None:
        return None


def tls_context() -> ssl.SSLContext:
    """This process's TLS context, made once per process (a forked child makes its own).

    Building one loads the CA bundle: about 35 ms of CPU, which every attempt
    (and so every retry in a storm) paid when each client built its own.
    """
    global _tls
    if _tls is None or _tls[0] != os.getpid():
        _tls = (os.getpid(), httpx2.create_ssl_context())
    return _tls[1]


def build_client(
    *,
    timeout: float,
    user_agent: str | None = None,
    allow_private: bool | None = None,
    max_body_bytes: int | None = None,
) -> httpx2.Client:
    """An httpx2 client for downstream calls; the user agent, the private-address
    switch and the decoded-body cap default to AUDIT_USER_AGENT,
    AUDIT_ALLOW_PRIVATE_TARGETS and AUDIT_MAX_PAGE_BYTES.

    `timeout` bounds each exchange as a whole (connect, headers and body), not only
    each read: a request may ask for less with the `plumb_deadline` extension.
    """
    if user_agent is None:
        user_agent = settings.AUDIT_USER_AGENT
    if allow_private is None:
        allow_private = settings.AUDIT_ALLOW_PRIVATE_TARGETS
    if max_body_bytes is None:
        max_body_bytes = settings.AUDIT_MAX_PAGE_BYTES
    transport = httpx2.HTTPTransport(retries=0, verify=tls_context())
    # httpx2 has no public hook for the network backend; the pool's is the one
    # place every connection (and so every redirect hop) goes through.
    transport._pool._network_backend = bounded.DeadlineBackend(
        GuardedNetworkBackend(allow_private=allow_private)
    )
    max_codings = settings.OUTBOUND_MAX_CONTENT_CODINGS
    return httpx2.Client(
        transport=bounded.BoundedTransport(
            transport,
            total_seconds=timeout,
            max_body_bytes=max_body_bytes,
            max_codings=max_codings,
        ),
        timeout=httpx2.Timeout(timeout),
        follow_redirects=False,
        cookies=NoCookies(),
        headers={
            "User-Agent": user_agent,
            "Accept": ACCEPT,
            "Accept-Encoding": bounded.accept_encoding(max_codings),
        },
    )


_shared: dict[tuple, httpx2.Client] = {}


def shared_client(
    *,
    timeout: float,
    user_agent: str | None = None,
    allow_private: bool | None = None,
    max_body_bytes: int | None = None,
) -> httpx2.Client:
    """One client per process and settings, shared by its threads (httpx2's pool is
    thread-safe), so calls to a host reuse its connections instead of each paying for
    a client and a connection. Keyed by the process too: a forked child never shares
    its parent's sockets."""
    if user_agent is None:
        user_agent = settings.AUDIT_USER_AGENT
    if allow_private is None:
        allow_private = settings.AUDIT_ALLOW_PRIVATE_TARGETS
    if max_body_bytes is None:
        max_body_bytes = settings.AUDIT_MAX_PAGE_BYTES
    key = (
        os.getpid(), timeout, user_agent, allow_private, max_body_bytes,
        settings.OUTBOUND_MAX_CONTENT_CODINGS,
    )  # fmt: skip
    client = _shared.get(key)
    if client is None:
        client = _shared[key] = build_client(
            timeout=timeout,
            user_agent=user_agent,
            allow_private=allow_private,
            max_body_bytes=max_body_bytes,
        )
    return client


def admission_key_for_url(url: httpx2.URL | str) -> str:
    """The rate-limit bucket of a plain URL: its origin's (outbound.urls.origin_key)."""
    return host_key(origin_key(str(url)))


def key_class(key: str) -> str:
    """The low-cardinality class of an admission key: `host`, `github-installation`, …"""
    return key.split(":", 1)[0]


class OutboundClient:
    """Sends requests through an httpx2.Client, minding each bucket's admission.

    With `slots` each request also holds one of its origin's (or its credential's)
    slots, waiting for one at most as long as an inline wait (or not at all, for a
    limit that is not `wait_inline`: page fetches). `rate_limits=False`
    (webhook receivers: their 429 is an ordinary failed attempt) sends without
    admission, observations or inline waits; the metrics still count the request.
    """

    def __init__(
        self,
        http: httpx2.Client,
        *,
        slots: hostslots.SlotLimit | None = None,
        rate_limits: bool = True,
        inline_max_wait: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.http = http
        self.slots = slots
        self.rate_limits = rate_limits
        self.inline_max_wait = (
            settings.RATELIMIT_INLINE_MAX_WAIT_SECONDS
            if inline_max_wait is None
            else inline_max_wait
        )
        self.sleep = sleep

    def send(
        self,
        request: httpx2.Request,
        *,
        key: str | None = None,
        resource: str = DEFAULT_RESOURCE,
        stream: bool = False,
        deadline: float | None = None,
    ) -> httpx2.Response:
        """The response, once the bucket admits the call and the answer is not a rate limit.

        `key` defaults to the request's origin. `deadline` (time.monotonic()) caps
        inline waits further, and the exchange itself (`outbound.bounded`). Raises
        RateLimited when the wait is too long to sleep. httpx2's errors (and the guard's TargetNotAllowed) propagate: each
        integration says what they mean for it.
        """
        key = key or admission_key_for_url(request.url)
        if deadline is not None:
            request.extensions[bounded.DEADLINE] = deadline
        # A bucket admission reads alone (a host's) is read in the slot's own step, one
        # round trip for both (outbound.hostslots.ACQUIRE); others are read first.
        together = self.slots is not None and self.rate_limits and reads_one_bucket(key, resource)
        for step in range(1, MAX_INLINE_RETRIES + 2):
            # A bucket closed past the inline budget is refused before a slot is taken: a
            # host that blocked us for hours must not hold its callers to its slot rate.
            # (Read with the slot, a closed bucket takes none.)
            if not together:
                admission = self._admit(key, resource)
                if not admission.go and admission.wait_seconds() > self._inline_budget(deadline):
                    raise RateLimited(key, resource, admission.until, reason="admission")
            bucket = (hot_key(key, resource), time.time()) if together else None
            with self._slot(request.url, key, deadline, bucket=bucket) as held:
                if together:
                    admission = admit_read(key, resource, held.bucket, now=time.time())
                    if held.bucket_closed and admission.go:
                        # Open again since the slot's step read it closed: no slot is
                        # held, so this round does not send; the next one takes a slot.
                        admission = Admission(key=key, resource=resource, until=time.time())
                    if not admission.go and admission.wait_seconds() > self._inline_budget(
                        deadline
                    ):
                        raise RateLimited(key, resource, admission.until, reason="admission")
                elif held.waited:
                    # Waiting for the slot took time: the bucket's word may have changed.
                    # A slot taken at once keeps the word read just before: admission is
                    # read once per request (DECISIONS.md, "The audit's own plumbing").
                    admission = self._admit(key, resource)
                if admission.go:
                    response = self._send_counted(request, key=key, stream=stream)
                    verdict = self._observe(response, key=key, resource=resource, step=step)
                    answer = classify_status(
                        response.status_code, rate_limited=verdict is not None and verdict.limited
                    )
                    done = verdict is None or not verdict.limited
                    # What the answer leaves in Redis goes in one round trip: the metric,
                    # the host's slow-start mark and, when the call is done, the slot's
                    # release (DECISIONS.md, "The audit's own plumbing").
                    pipe = redis_client().pipeline(transaction=False)
                    _count(key, response, METRIC_OUTCOMES[answer], pipe=pipe)
                    if self.slots is not None and not answer.retryable:
                        hostslots.answered(self.slots, self._slot_name(request.url, key), pipe=pipe)
                    if done:
                        held.release_into(pipe)
                    _send_pipeline(pipe, held)
                    if done:
                        return response
                    response.close()
                    until = _until(verdict)
                    reason = f"{verdict.kind}: {request.method} {request.url} answered {response.status_code}"
                else:
                    until = admission.until
                    reason = "admission"
            wait = until - time.time()
            if step > MAX_INLINE_RETRIES or wait > self._inline_budget(deadline):
                raise RateLimited(key, resource, until, reason=reason)
            self.sleep(delay(INLINE_WAITS, RETRY, step=step, after=wait if wait > 0 else None))
        raise AssertionError("unreachable")  # pragma: no cover

    def _admit(self, key: str, resource: str) -> Admission:
        if not self.rate_limits:
            return Admission(key=key, resource=resource)
        return admit(key, resource)

    def _observe(
        self, response: httpx2.Response, *, key: str, resource: str, step: int
    ) -> Verdict | None:
        if not self.rate_limits:
            return None
        return observe(response, key=key, resource=resource, inline_step=step)

    def _send_counted(self, request: httpx2.Request, *, key: str, stream: bool) -> httpx2.Response:
        """Send; a request that never got an answer is counted here, one that did by `send`."""
        started = time.monotonic()
        try:
            response = self.http.send(request, stream=stream)
        except httpx2.TimeoutException:
            record_downstream_request(key_class(key), None, "timeout", time.monotonic() - started)
            raise
        except httpx2.TransportError:
            record_downstream_request(
                key_class(key), None, "connection_error", time.monotonic() - started
            )
            raise
        response.extensions["plumb_started"] = started
        return response

    def _inline_budget(self, deadline: float | None) -> float:
        if deadline is None:
            return self.inline_max_wait
        return min(self.inline_max_wait, deadline - time.monotonic())

    def _slot(self, url: httpx2.URL, key: str, deadline: float | None, *, bucket=None):
        if self.slots is None:
            return contextlib.nullcontext(hostslots.NOTHING_HELD)
        return hostslots.slot(
            self.slots,
            self._slot_name(url, key),
            key=key,
            max_wait=max(0.0, self._inline_budget(deadline)) if self.slots.wait_inline else None,
            bucket=bucket,
        )

    def _slot_name(self, url: httpx2.URL, key: str) -> str:
        return key if self.slots.per_credential else origin_key(str(url))


def _until(verdict: Verdict) -> float:
    now = time.time()
    candidates = [verdict.blocked_until or 0.0]
    if verdict.kind == Kind.PRIMARY and verdict.limits.reset_at:
        candidates.append(verdict.limits.reset_at)
    return max(max(candidates), now)


def _count(key: str, response: httpx2.Response, outcome: str, *, pipe) -> None:
    """Every request that reached a downstream is one downstream request (redirect hops too)."""
    started = response.extensions.get("plumb_started", time.monotonic())
    record_downstream_request(
        key_class(key), response.status_code, outcome, time.monotonic() - started, pipe=pipe
    )


def _send_pipeline(pipe, held: hostslots.Held) -> None:
    """Send the answer's writes. Losing the metric must never fail the call it describes
    (observability.metrics); a slot whose release went down with it is released by
    `hostslots.slot` on its own as the block ends, as it would have been."""
    try:
        pipe.execute()
    except redis.RedisError as exc:
        held.not_sent()
        log.warning("metrics.unrecorded", extra={"metric_event": "downstream_request",
                                                 "error": repr(exc)})  # fmt: skip
