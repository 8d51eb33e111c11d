"""The one rate-limit-aware way Plumb calls out: the page fetch, link checks and GitHub.

`OutboundClient.send` asks admission about the call's bucket before making it,
records what the response says about the bucket, tells rate-limit answers apart
(primary exhaustion, secondary limits, GraphQL's RATE_LIMITED) from ordinary
ones, sleeps short waits inline on a jittered ladder and raises `RateLimited`
for long ones, which tasks turn into a deferred retry.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from django.conf import settings

from observability.metrics import record_downstream_request
from ratelimit.admission import MAX_INLINE_RETRIES, RateLimited, admit, inline_delay
from ratelimit.headers import LimitHeaders, parse_limit_headers
from ratelimit.observations import (
    DEFAULT_RESOURCE,
    SECONDARY_RESOURCE,
    Kind,
    Observation,
    host_key,
    record,
)
from ratelimit.politeness import Politeness, polite_slot

RATE_LIMIT_STATUSES = {403, 429}
# GitHub's documented advice when a secondary limit comes without Retry-After.
SECONDARY_DEFAULT_WAIT_SECONDS = 60.0
SECONDARY_MESSAGES = ("secondary rate limit", "abuse detection")


def admission_key_for_url(url: httpx.URL | str) -> str:
    url = httpx.URL(url)
    return host_key(url.host, url.port)


@dataclass(frozen=True)
class Verdict:
    """How one response spoke about its bucket."""

    kind: str
    limits: LimitHeaders
    blocked_until: float | None = None  # set for secondary limits and bare 429s

    @property
    def limited(self) -> bool:
        return self.kind != Kind.OK


def _body_json(response: httpx.Response) -> dict | None:
    try:
        body = json.loads(response.content)
    except httpx.ResponseNotRead:
        return None  # a streamed body is the caller's to read
    except (ValueError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


def _graphql_rate_limited(body: dict | None) -> bool:
    errors = (body or {}).get("errors") or []
    return any(isinstance(e, dict) and e.get("type") == "RATE_LIMITED" for e in errors)


def classify(response: httpx.Response, *, now: float, ladder_step: int = 0) -> Verdict:
    """Primary exhaustion, a secondary limit, another rate limit, or an ordinary answer.

    - secondary: 403/429 with Retry-After, or GitHub's secondary-limit message
      (then 60 s if no Retry-After came with it);
    - primary: 403/429 with `remaining` 0 (wait until the reset), or a GraphQL
      200 whose errors say RATE_LIMITED with `remaining` 0;
    - rate_limited: a 429 or RATE_LIMITED saying nothing about when: a short,
      jittered wait from the inline ladder, recorded so other workers wait too.
    """
    limits = parse_limit_headers(response.headers, now=now)
    body = _body_json(response)
    status = response.status_code
    exhausted = limits.remaining is not None and limits.remaining <= 0
    if status in RATE_LIMIT_STATUSES:
        message = str((body or {}).get("message", "")).lower()
        if limits.retry_after is not None:
            return Verdict(Kind.SECONDARY, limits, now + limits.retry_after)
        if any(text in message for text in SECONDARY_MESSAGES):
            return Verdict(Kind.SECONDARY, limits, now + SECONDARY_DEFAULT_WAIT_SECONDS)
        if exhausted and limits.reset_at is not None:
            return Verdict(Kind.PRIMARY, limits)
        if status == 429:
            return Verdict(Kind.RATE_LIMITED, limits, now + inline_delay(ladder_step))
        return Verdict(Kind.OK, limits)  # a plain 403: forbidden, not a rate limit
    if _graphql_rate_limited(body):
        if exhausted and limits.reset_at is not None:
            return Verdict(Kind.PRIMARY, limits)
        return Verdict(Kind.RATE_LIMITED, limits, now + inline_delay(ladder_step))
    return Verdict(Kind.OK, limits)


class OutboundClient:
    """Sends requests through an httpx.Client, minding each bucket's admission.

    With `politeness` (link checks, GitHub) each request also holds one of the
    host's (or the credential's) politeness slots.
    """

    def __init__(
        self,
        http: httpx.Client,
        *,
        politeness: Politeness | None = None,
        inline_max_wait: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.http = http
        self.politeness = politeness
        self.inline_max_wait = (
            settings.RATELIMIT_INLINE_MAX_WAIT_SECONDS
            if inline_max_wait is None
            else inline_max_wait
        )
        self.sleep = sleep

    def send(
        self,
        request: httpx.Request,
        *,
        key: str | None = None,
        resource: str = DEFAULT_RESOURCE,
        stream: bool = False,
        deadline: float | None = None,
    ) -> httpx.Response:
        """The response, once the bucket admits the call and the answer is not a rate limit.

        `key` defaults to the request's host. `deadline` (time.monotonic()) caps
        inline waits further. Raises RateLimited when the wait is too long to sleep.
        """
        key = key or admission_key_for_url(request.url)
        for step in range(MAX_INLINE_RETRIES + 1):
            with self._slot(request.url, key, deadline):
                admission = admit(key, resource)
                if admission.go:
                    response = self._send_counted(request, key=key, stream=stream)
                    verdict = self.observe(response, key=key, resource=resource, ladder_step=step)
                    _count(
                        key, response.status_code, _outcome(response.status_code, verdict), response
                    )
                    if not verdict.limited:
                        return response
                    response.close()
                    until = self._until(verdict)
                    reason = f"{verdict.kind}: {request.method} {request.url} answered {response.status_code}"
                else:
                    until = admission.until
                    reason = "admission"
            wait = until - time.time()
            if step == MAX_INLINE_RETRIES or wait > self._inline_budget(deadline):
                raise RateLimited(key, resource, until, reason=reason)
            self.sleep(inline_delay(step, at_least=wait))
        raise AssertionError("unreachable")  # pragma: no cover

    def _send_counted(self, request: httpx.Request, *, key: str, stream: bool) -> httpx.Response:
        """Send; a request that never got an answer is counted here, one that did by `send`."""
        started = time.monotonic()
        try:
            response = self.http.send(request, stream=stream)
        except httpx.TimeoutException:
            record_downstream_request(key_class(key), None, "timeout", time.monotonic() - started)
            raise
        except (httpx.TransportError, httpx.ProtocolError):
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

    def _until(self, verdict: Verdict) -> float:
        now = time.time()
        candidates = [verdict.blocked_until or 0.0]
        if verdict.kind == Kind.PRIMARY and verdict.limits.reset_at:
            candidates.append(verdict.limits.reset_at)
        return max(max(candidates), now)

    def _slot(self, url: httpx.URL, key: str, deadline: float | None):
        if self.politeness is None:
            return contextlib.nullcontext()
        return polite_slot(
            key if self.politeness.per_admission_key else url.netloc.decode("ascii"),
            politeness=self.politeness,
            admission_key=key,
            lease=settings.AUDIT_FETCH_TIMEOUT_SECONDS + 5,
            max_wait=self._inline_budget(deadline),
        )

    @staticmethod
    def observe(
        response: httpx.Response, *, key: str, resource: str, ladder_step: int = 0
    ) -> Verdict:
        """Classify `response` and record what it says about (key, resource)."""
        now = time.time()
        verdict = classify(response, now=now, ladder_step=ladder_step)
        if verdict.limits.is_empty and not verdict.limited:
            return verdict
        # A plain host's bucket is the one admission asks about; GitHub names its own,
        # and its secondary limits hold for the whole credential.
        if not key.startswith("host:"):
            if verdict.kind == Kind.SECONDARY:
                resource = SECONDARY_RESOURCE
            elif verdict.limits.resource:
                resource = verdict.limits.resource
        record(
            Observation.from_headers(
                key,
                resource,
                verdict.limits,
                kind=verdict.kind,
                status_code=response.status_code,
                observed_at=now,
                blocked_until=verdict.blocked_until,
            )
        )
        return verdict


def key_class(key: str) -> str:
    """The low-cardinality class of an admission key: `host`, `github-installation`, …"""
    return key.split(":", 1)[0]


def _outcome(status_code: int, verdict: Verdict) -> str:
    if verdict.limited or status_code == 429:
        return "rate_limited"
    if status_code >= 500 or status_code == 408:
        return "transient_status"
    return "ok"


def _count(key: str, status_code: int, outcome: str, response: httpx.Response) -> None:
    """Every request that reached a downstream is one downstream request (redirect hops too)."""
    started = response.extensions.get("plumb_started", time.monotonic())
    record_downstream_request(key_class(key), status_code, outcome, time.monotonic() - started)
