"""Running audits: the plain functions behind the audit task.

They change rows and return what must happen next; they never publish a message
(audits.tasks does, and audits.submission for a new audit), so the task module sits
above them and nothing imports it back.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from audits import robots as robots_store
from audits.analysis import audit_result, says_noindex
from audits.findings import PageInfo, is_crawlable, robots_txt
from audits.linkcheck import QueuedCheck, start_link_checks
from audits.models import (
    AUDIT_JOB,
    NO_PREVIOUS_SUCCESS,
    PREVIOUS_RESULT_OF_REAUDIT,
    PREVIOUS_SUCCESS_ID,
    Audit,
    PreviousSuccess,
)
from jobs.errors import Permanent, WaitTooLong
from outbound.integrations.page import FetchedPage, Validators, fetch_page
from outbound.integrations.robots import RobotsInfo

log = logging.getLogger(__name__)

# The shape of `audit_result`'s fields. A 304 carries a previous result forward only when
# it has this format: change it whenever the analysis reads something new from a page,
# so no page keeps an older analysis's result for as long as it does not change.
# 2: results keep `crawl_directives`, which a 304 sending X-Robots-Tag reads.
RESULT_FORMAT = 2


@dataclass(frozen=True)
class ClaimedAudit:
    url: str
    page_id: int
    trigger: str
    # Set at submission and never changed: a success of an audit with one owes a delivery,
    # so its finish goes straight to a transaction (Audit.objects.finish).
    callback_url: str
    # Whose audit it is (audits.admission.client_key; "" for a nightly re-audit): its turn
    # with the worker's tree builders (audits.treebuild).
    client: str
    # The id of the page's previous succeeded audit (None: it has none), read by every
    # claim; a nightly re-audit's claim also reads its result when AUDIT_CONDITIONAL_REAUDITS
    # is on (None otherwise, and for a client's audit).
    previous_id: uuid.UUID | None = None
    previous_result: dict | None = None

    @property
    def previous(self) -> PreviousSuccess | None:
        """The previous success the claim read, for the finish to compare with:
        NO_PREVIOUS_SUCCESS when the page had none, None when the claim did not read its
        result (the finish reads it)."""
        if self.previous_id is None:
            return NO_PREVIOUS_SUCCESS
        if not isinstance(self.previous_result, dict):
            return None
        return PreviousSuccess(self.previous_id, self.previous_result)


# What the attempt needs of its row, read by the claim's own statement.
CLAIMED = ("page__url", "page_id", "trigger", "callback_url", "client", PREVIOUS_SUCCESS_ID)


def claim_audit(audit_id: str, *, attempt: int | None = None) -> ClaimedAudit | None:
    """Begin the audit's attempt (AUDIT_JOB.claim) and return its page, in one statement;
    None if it is finished, gone, or checking its links (a redelivery leaves that be).

    Every claim reads the id of its page's previous success, for the finish to compare
    with; a nightly re-audit's also reads what it may revalidate: that success's result
    (`revalidation`), with conditional re-audits on."""
    returning = CLAIMED
    if settings.AUDIT_CONDITIONAL_REAUDITS:
        returning = (*CLAIMED, PREVIOUS_RESULT_OF_REAUDIT)
    try:
        claimed = AUDIT_JOB.claim(audit_id, attempt=attempt, error="", returning=returning)
    except ValidationError:
        log.error("audit.malformed_id", extra={"audit_id": audit_id})
        return None
    if not claimed:
        log.info("audit.skipped", extra={"audit_id": audit_id, "reason": "finished or missing"})
        return None
    return ClaimedAudit(*claimed)


def revalidation(claimed: ClaimedAudit) -> tuple[Validators, dict] | None:
    """What a nightly re-audit may revalidate: the validators its page's last succeeded
    audit stored, with that result (carried forward on a 304), if the result was made by
    this analysis (RESULT_FORMAT). Read by the claim; None for an audit a client
    submitted, which always fetches in full: it asked to see the page as it is now."""
    if not settings.AUDIT_CONDITIONAL_REAUDITS or claimed.trigger != Audit.Trigger.REAUDIT:
        return None
    previous = claimed.previous_result
    stored = previous.get("validators") if isinstance(previous, dict) else None
    if not isinstance(stored, dict) or stored.get("format") != RESULT_FORMAT:
        return None
    validators = Validators.from_json(stored)
    return None if validators is None else (validators, previous)


def with_validators(result: dict, page: FetchedPage) -> dict:
    validators = page.validators
    if validators is not None:
        result["validators"] = {**validators.as_json(), "format": RESULT_FORMAT}
    return result


def not_modified_result(previous: dict, page: FetchedPage, sent: Validators) -> dict:
    """The previous result carried forward through a 304 (RFC 9111 4.3.4: the stored
    response, freshened by the 304's headers). What the page says is unchanged; the
    fetch's own figures are this one's; the link checks run again (audits.linkcheck).

    Security headers the 304 sends are read from it; one it leaves out (a 304 need only
    send its validators and caching headers) keeps its previous state, never "missing".
    So does X-Robots-Tag: sent on the 304, it replaces the page's (`noindex` and
    is-crawlable judged again, `crawl_again`); left out, they are carried.
    """
    result = {key: value for key, value in previous.items() if key not in ("links", "link_check")}
    result.update(
        requested_url=page.requested_url,
        redirects=page.redirects,
        ttfb_ms=page.ttfb_ms,
        total_ms=page.total_ms,
        not_modified=True,
        revalidated_status_code=page.status_code,
        missing_security_headers=[
            name
            for name in previous.get("missing_security_headers") or []
            if name not in page.headers
        ],  # fmt: skip
    )
    renewed = Validators.of(sent.url, page.headers)
    validators = Validators(
        sent.url,
        renewed.etag if renewed and renewed.etag else sent.etag,
        renewed.last_modified if renewed and renewed.last_modified else sent.last_modified,
    )
    result["validators"] = {**validators.as_json(), "format": RESULT_FORMAT}
    x_robots_tag = page.headers.get_list("x-robots-tag")
    if x_robots_tag:
        crawl_again(result, x_robots_tag)
    return result


def crawl_again(result: dict, x_robots_tag: list[str]) -> None:
    """`noindex` and is-crawlable of a carried-forward result, judged again with the
    X-Robots-Tag lines a 304 sent (they win over the page's earlier ones) and what the
    page itself says (`result["crawl_directives"]`: its robots metas, unchanged since
    the page is). is-crawlable reads the host's robots.txt too, so it is read now (the
    one store, audits.robots) and the robots-txt finding follows it. A page whose
    is-crawlable could not be judged (too large for a tree) keeps its finding."""
    directives = result.get("crawl_directives") or {}
    result["noindex"] = bool(directives.get("meta_noindex")) or says_noindex(x_robots_tag)
    metas = directives.get("metas")
    findings = result.get("findings")
    if not isinstance(metas, list) or not isinstance(findings, list):
        return
    robots = page_robots_txt(result["final_url"])
    page = PageInfo(
        final_url=result["final_url"],
        status_code=result["status_code"],
        headers=[("x-robots-tag", value) for value in x_robots_tag],
    )
    judged = {
        "is-crawlable": is_crawlable([(name, content) for name, content in metas], page, robots),
        "robots-txt": robots_txt(robots),
    }
    result["findings"] = [judged.get(item.get("id"), item) for item in findings]


def page_robots_txt(url: str) -> RobotsInfo | None:
    """The page's host's robots.txt, for the robots-txt and is-crawlable findings: from
    the one robots.txt store link checks use (audits.robots), read once per host per
    freshness window under the host's politeness; None when it cannot be known now."""
    return robots_store.robots_for(url)


def execute_audit(
    audit_id: str, *, resume: dict | None = None, attempt: int | None = None
) -> list[QueuedCheck]:
    """Run one attempt of an audit; return the link checks to enqueue.

    Transient fetch errors propagate for the task to retry, and so does RateLimited
    (the page's host asked us to wait, or a redirect's target host is busy), for the
    task to defer; `resume` is where a deferred run's redirects had got to. A page with external
    links moves on to `checking_links`; the last check (or the deadline sweep)
    finishes the audit.
    """
    claimed = claim_audit(audit_id, attempt=attempt)
    if claimed is None:
        return []
    revalidating = revalidation(claimed)
    validators, previous = revalidating or (None, None)
    try:
        fetched = fetch(claimed.url, resume=resume, validators=validators)
    except Permanent as exc:
        Audit.objects.finish(audit_id, status=Audit.Status.FAILED, error=str(exc))
        return []
    if previous is not None and fetched.not_modified:
        result = not_modified_result(previous, fetched, validators)
    else:
        robots = page_robots_txt(fetched.final_url)
        result = with_validators(
            audit_result(fetched, robots=robots, client=claimed.client), fetched
        )
    started, queued = start_link_checks(audit_id, result)
    if not started:
        Audit.objects.finish(
            audit_id,
            status=Audit.Status.SUCCEEDED,
            result=result,
            previous=claimed.previous,
            owes_callback=bool(claimed.callback_url),
        )
    return queued


def fetch(url: str, *, resume: dict | None, validators: Validators | None) -> FetchedPage:
    return fetch_page(
        url,
        timeout=settings.AUDIT_FETCH_TIMEOUT_SECONDS,
        max_bytes=settings.AUDIT_MAX_PAGE_BYTES,
        user_agent=settings.AUDIT_USER_AGENT,
        allow_private=settings.AUDIT_ALLOW_PRIVATE_TARGETS,
        resume=resume,
        validators=validators,
    )


def end_rate_limited(audit_id: str, error: WaitTooLong) -> None:
    """The page's host asked for a longer wait than RATELIMIT_MAX_WAIT_SECONDS: the audit
    fails now, saying it was rate limited and until when, instead of waiting in the
    backlog. Failed, not succeeded: there is no page to report, and a failed audit can be
    submitted again (or replayed) once that time has passed."""
    Audit.objects.finish(audit_id, status=Audit.Status.FAILED, error=str(error))


def reset_failed_audit(audit_id: str) -> Audit | None:
    """Make a failed audit queued again with a new task id (a dead-letter replay).

    None if the audit is gone or not failed: a replay never re-runs a finished
    success or an audit that is still alive.
    """
    with transaction.atomic():
        requeued = AUDIT_JOB.requeue(
            audit_id, task_id=str(uuid.uuid4()), from_status=Audit.Status.FAILED,
            error="", result=None, finished_at=None,
        )  # fmt: skip
        if not requeued:
            return None
        return Audit.objects.get(id=audit_id)
