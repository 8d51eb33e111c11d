"""The one HTTP-status classification every integration reads.

What a status says about trying again, whoever sent it:

    ok            1xx, 2xx, 3xx: an answer about what was asked for
    rate_limited  429, or a response the rate-limit classification calls a limit
                  (ratelimit.responses): slow down, then try again
    transient     5xx, 408, 425: trouble now that may pass: try again later
    permanent     any other 4xx: this request is refused as it is

Each integration decides what its own answer means from here: a page's 404 is a
result to report, a link's is a broken link, a webhook receiver's ends the delivery.
"""

from __future__ import annotations

import enum

import httpx2

from jobs.errors import Permanent, Transient
from ratelimit.headers import parse_retry_after

# 4xx answers that say "not now" rather than "no".
TRANSIENT_CLIENT_STATUSES = frozenset({408, 425})
TOO_MANY_REQUESTS = 429


class Answer(enum.StrEnum):
    OK = "ok"
    RATE_LIMITED = "rate_limited"
    TRANSIENT = "transient"
    PERMANENT = "permanent"

    @property
    def retryable(self) -> bool:
        """Worth the same request again later."""
        return self in (Answer.RATE_LIMITED, Answer.TRANSIENT)


def classify_status(status_code: int, *, rate_limited: bool = False) -> Answer:
    """What `status_code` says; `rate_limited` when the response's headers or body said so."""
    if rate_limited or status_code == TOO_MANY_REQUESTS:
        return Answer.RATE_LIMITED
    if status_code >= 500 or status_code in TRANSIENT_CLIENT_STATUSES:
        return Answer.TRANSIENT
    if status_code >= 400:
        return Answer.PERMANENT
    return Answer.OK


def unwanted_answer(message: str, response: httpx2.Response) -> Permanent | Transient:
    """The error for an answer that is not the one wanted: Permanent for a refusal, else
    Transient, with the answer's own Retry-After."""
    status = response.status_code
    if classify_status(status) is Answer.PERMANENT:
        return Permanent(message, status_code=status)
    return Transient(
        message,
        retry_after=parse_retry_after(response.headers.get("retry-after")),
        status_code=status,
    )
