"""Checking an audited page's outbound links: one check per distinct link, shared.

The audit fetches its page, then creates one `LinkCheck` row per external link, each
pointing at the link's `SharedLink` (its normalized URL), and waits in
`checking_links`. A link whose shared outcome is fresh (LINKCHECK_FRESH_SECONDS; a
broken one LINKCHECK_BROKEN_FRESH_SECONDS) is copied in at once. A stale one is claimed
by exactly one audit (a conditional update of the shared row), which publishes the
link's one check task; every other audit listing it meanwhile only waits: no second
request, and nothing held in a worker thread. When the check records its outcome it
copies it into every check waiting on the link and finishes each of their audits that
has none left (once: `Audit.objects.finish` is conditional). A periodic sweep finishes
audits whose AUDIT_LINKCHECK_DEADLINE_SECONDS has passed, reporting the checks that
had not finished (rate-limited ones with their retry time).

A link that answers broken is checked once more LINKCHECK_BROKEN_RECHECK_SECONDS later
before its outcome is recorded: one bad answer is not a broken link.

Each check reads its host's robots.txt first (`audits.robots`: once per host per
ROBOTS_FRESH_SECONDS, shared; a disallowed link is `blocked_by_robots`, not requested),
then calls `outbound.integrations.links` (the GET or GitHub's API, the per-host
slots, admission) in the turn of a client waiting on it (client_turn); this module keeps
the rows and the audits' join. Nothing here loads
an audit's result but its finish.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import CharField, OuterRef, Q, Subquery, Value
from django.db.models.functions import Cast, Concat
from django.utils import timezone

from audits import robots
from audits.models import LINK_CHECK_JOB, Audit, LinkCheck, SharedLink
from jobs.errors import Transient, WaitTooLong
from jobs.sweeps import Sweep
from outbound import hostslots
from outbound.hostslots import SlotLimit
from outbound.integrations.github import GitHubClient, GitHubCredentials
from outbound.integrations.links import LinkOutcome, check_url, github_repository
from outbound.urls import InvalidURL, normalize_url

log = logging.getLogger(__name__)

# The outcome's fields, as the shared row and each audit's check both spell them.
OUTCOME_FIELDS = ("status", "status_code", "final_url", "github", "detail", "retry_at")

# A check nobody waits for any more (its audits finished at their deadline) still records
# the link for later audits, in this one turn shared by all such checks.
NOBODY_WAITING = "nobody-waiting"
# The waiting clients tried for a free turn: enough for any link listed by a few clients.
MAX_CLIENTS_TRIED = 8


def client_check_slots() -> SlotLimit:
    """LINKCHECK_PER_CLIENT_CONCURRENCY checks in flight per client, held for a whole check
    (its GitHub calls and host-slot waits included)."""
    return SlotLimit(
        "link-clients",
        concurrency=settings.LINKCHECK_PER_CLIENT_CONCURRENCY,
        lease=LINK_CHECK_JOB.deadline.lease,
    )


def shared_key(url: str) -> str:
    try:
        return normalize_url(url).url
    except InvalidURL:
        return url[:2048]


def fresh(now: datetime) -> Q:
    """Shared links whose outcome may be used now (on SharedLink)."""
    working_since = now - timedelta(seconds=settings.LINKCHECK_FRESH_SECONDS)
    broken_since = now - timedelta(seconds=settings.LINKCHECK_BROKEN_FRESH_SECONDS)
    # A rate-limited link was not checked at all, nor one robots.txt held back: asked again
    # as soon as a broken one (a blocked one's verdict comes from the stored robots.txt).
    unanswered = (
        LinkCheck.Status.BROKEN,
        LinkCheck.Status.RATE_LIMITED,
        LinkCheck.Status.BLOCKED_BY_ROBOTS,
    )
    return Q(checked_at__gte=working_since) & ~Q(status__in=unanswered) | Q(
        checked_at__gte=broken_since, status__in=unanswered
    )


# --- The audit's side --------------------------------------------------------


@dataclass(frozen=True)
class QueuedCheck:
    """A shared link's check to publish: the link and the task id its claim stored."""

    shared_link_id: int
    task_id: str


def start_link_checks(audit_id: str, result: dict) -> tuple[bool, list[QueuedCheck]]:
    """Move the audit to `checking_links` with one check per external link.

    Returns whether it moved (False: nothing to check, the caller finishes the audit)
    and the shared checks this audit claimed, to publish. Links over
    AUDIT_MAX_LINK_CHECKS are recorded as skipped.
    """
    links = result.get("external_links") or []
    if not links:
        return False, []
    cap = settings.AUDIT_MAX_LINK_CHECKS
    keys = {url: shared_key(url) for url in links[:cap]}
    # Sorted, and committed on their own: two audits inserting the same links in
    # different orders inside longer transactions could deadlock on the unique index.
    SharedLink.objects.bulk_create(
        [SharedLink(url=key) for key in sorted(set(keys.values()))], ignore_conflicts=True
    )
    link_ids = dict(SharedLink.objects.filter(url__in=set(keys.values())).values_list("url", "id"))
    rows = [
        LinkCheck(audit_id=audit_id, url=url, link_id=link_ids[key]) for url, key in keys.items()
    ] + [
        LinkCheck(
            audit_id=audit_id,
            url=url,
            status=LinkCheck.Status.SKIPPED,
            detail=f"over the limit of {cap} checked links per page",
            finished_at=timezone.now(),
        )
        for url in links[cap:]
    ]
    with transaction.atomic():
        moved = Audit.objects.filter(id=audit_id, status=Audit.Status.RUNNING).update(
            status=Audit.Status.CHECKING_LINKS,
            result=result,
            link_checks_deadline=timezone.now()
            + timedelta(seconds=settings.AUDIT_LINKCHECK_DEADLINE_SECONDS),
        )
        if not moved:
            return True, []  # finished or taken over meanwhile: nothing more to do here
        # A redelivered audit finds its rows already there.
        LinkCheck.objects.bulk_create(rows, ignore_conflicts=True)
    # After the rows commit: a check that recorded its outcome before they were there
    # did not reach them, and this sees its outcome (it commits before it fans out).
    copy_fresh_outcomes(audit_id)
    queued = claim_stale_links(audit_id)
    if not queued:
        finish_audit_if_checked(audit_id)
    log.info(
        "audit.checking_links",
        extra={"audit_id": audit_id, "links": len(links), "claimed": len(queued)},
    )
    return True, queued


def copy_fresh_outcomes(audit_id: str, *, now: datetime | None = None) -> int:
    """Copy every fresh shared outcome into the audit's unfinished checks (one UPDATE)."""
    now = now or timezone.now()
    shared = SharedLink.objects.filter(id=OuterRef("link_id"))
    return (
        LinkCheck.objects.filter(audit_id=audit_id, status__in=LinkCheck.UNFINISHED)
        .filter(link__in=SharedLink.objects.filter(fresh(now)))
        .update(
            **{name: Subquery(shared.values(name)[:1]) for name in OUTCOME_FIELDS},
            finished_at=now,
        )
    )


def claim_stale_links(audit_id: str) -> list[QueuedCheck]:
    """Claim each link of the audit that nobody is checking; the claimed ones, to publish.

    A claim is a conditional update of the shared rows: of two audits claiming one link
    together, one changes it and publishes the check, the other waits for its outcome.
    One UPDATE claims them all, each under its own task id (this claim's prefix and the
    link's id), read back by the prefix. A check in flight is never claimed again: its
    job is the reconciler's to publish again if its message is lost (jobs.lifecycle).
    """
    now = timezone.now()
    claim = uuid.uuid4().hex
    waiting = LinkCheck.objects.filter(audit_id=audit_id, status__in=LinkCheck.UNFINISHED).values(
        "link_id"
    )
    claimed = (
        SharedLink.objects.filter(id__in=waiting, check_status=SharedLink.CheckStatus.IDLE)
        .exclude(fresh(now))
        .update(
            check_status=SharedLink.CheckStatus.QUEUED,
            task_id=Concat(Value(f"{claim}-"), Cast("id", CharField())),
            attempts=0,
            attempt_started_at=None,
            next_attempt_at=None,
            published_at=now,
            suspect_since=None,
        )
    )
    if not claimed:
        return []
    return [
        QueuedCheck(link_id, task_id)
        for link_id, task_id in SharedLink.objects.filter(
            id__in=waiting, task_id__startswith=f"{claim}-"
        ).values_list("id", "task_id")
    ]


# --- The check's side --------------------------------------------------------


def run_shared_check(
    shared_link_id: int, task_id: str, *, resume: dict | None = None
) -> LinkOutcome | None:
    """One attempt at one shared link, by the task its claim names; RateLimited and
    Transient propagate to the task. None when this task no longer holds the claim.

    `resume` is where a deferred run of this check had got to (a redirect's next hop):
    the check goes on from there, in whichever client's turn is free now."""
    claimed = LINK_CHECK_JOB.claim(
        shared_link_id, task_id=task_id, returning=("url", "suspect_since")
    )
    if not claimed:
        return None  # a duplicate, or its outcome is recorded already
    url, suspect_since = claimed
    credentials = GitHubCredentials.from_settings()
    github = GitHubClient(credentials) if credentials else None
    try:
        with client_turn(shared_link_id):
            outcome = check_link(url, github=github, resume=resume)
    finally:
        if github is not None:
            github.close()
    recheck = settings.LINKCHECK_BROKEN_RECHECK_SECONDS
    # A second look guards against a site's passing hiccup. GitHub's API saying a
    # repository is missing (or private) is its answer, not a hiccup: asking twice
    # only spent the shared credential's turn (issue 31: 200 calls for 100 links).
    if (
        outcome.status == LinkCheck.Status.BROKEN
        and outcome.github is None
        and suspect_since is None
        and recheck > 0
    ):
        SharedLink.objects.filter(id=shared_link_id, task_id=task_id).update(
            suspect_since=timezone.now()
        )
        raise Transient(
            f"{url} answered broken ({outcome.detail or outcome.status_code}): checking again",
            retry_after=recheck,
        )
    record_shared_outcome(shared_link_id, task_id, outcome)
    return outcome


def check_link(url: str, *, github: GitHubClient | None, resume: dict | None) -> LinkOutcome:
    """The link's origin's robots.txt first (audits.robots): a link it disallows is
    reported `blocked_by_robots`, not requested; one it allows is checked at its
    Crawl-delay. A repository GitHub's API answers for asks the site nothing."""
    if github is not None and github_repository(url) is not None:
        return check_url(url, github=github, resume=resume)
    verdict = robots.link_verdict(url)
    if verdict is not None and not verdict.allowed:
        return LinkOutcome(LinkCheck.Status.BLOCKED_BY_ROBOTS, detail=verdict.detail)
    return check_url(
        url,
        github=github,
        resume=resume,
        crawl_delay=verdict.crawl_delay if verdict is not None else None,
        verdict_for=robots.link_verdict,  # each redirect target's own robots.txt
    )


def waiting_clients(shared_link_id: int) -> list[str]:
    """The clients whose audits wait on the link now ("" for the system's own work)."""
    return list(
        Audit.objects.filter(
            status=Audit.Status.CHECKING_LINKS,
            link_checks__link_id=shared_link_id,
            link_checks__status__in=LinkCheck.UNFINISHED,
        )
        .values_list("client", flat=True)
        .order_by("client")
        .distinct()[: MAX_CLIENTS_TRIED + 1]
    )


@contextlib.contextmanager
def client_turn(shared_link_id: int) -> Iterator[None]:
    """Run the link's check in the turn of a client waiting on it.

    Each client has LINKCHECK_PER_CLIENT_CONCURRENCY checks in flight at most (a slot per
    client in outbound.hostslots), so one client's page of many links defers its own
    excess (RateLimited: no attempt spent, the thread moves on) while another client's
    check takes a worker at once. A link several clients wait on runs in the turn of
    any of them with one free: one client's backlog never holds another's shared link.
    The system's own work (a nightly re-audit waiting on the link) takes no client's turn.
    """
    clients = waiting_clients(shared_link_id)
    if "" in clients:
        yield
        return
    names = clients[:MAX_CLIENTS_TRIED] or [NOBODY_WAITING]
    with hostslots.slot_of_any(
        client_check_slots(),
        names,
        key=f"link:{shared_link_id}",
        reason="every client waiting on this link has "
        f"{settings.LINKCHECK_PER_CLIENT_CONCURRENCY} check(s) in flight",
    ):
        yield


def record_shared_outcome(
    shared_link_id: int, task_id: str, outcome: LinkOutcome, *, retry_at: datetime | None = None
) -> bool:
    """Store the link's outcome (if this task still holds its claim), copy it into every
    check waiting on it, and finish the audits left with nothing to wait for. `retry_at`:
    a `rate_limited` outcome's time the host may be asked again."""
    now = timezone.now()
    recorded = LINK_CHECK_JOB.finish(
        shared_link_id,
        SharedLink.CheckStatus.IDLE,
        task_id=task_id,
        status=outcome.status,
        status_code=outcome.status_code,
        final_url=outcome.final_url,
        github=outcome.github,
        detail=outcome.detail,
        retry_at=retry_at,
        checked_at=now,
        suspect_since=None,
    )
    if not recorded:
        return False
    LinkCheck.objects.filter(link_id=shared_link_id, status__in=LinkCheck.UNFINISHED).update(
        status=outcome.status,
        status_code=outcome.status_code,
        final_url=outcome.final_url,
        github=outcome.github,
        detail=outcome.detail,
        retry_at=retry_at,
        finished_at=now,
    )
    # Read after the update: an audit whose rows it reached is here, and one whose rows
    # came later copies the outcome itself (start_link_checks).
    waiting = (
        Audit.objects.filter(
            status=Audit.Status.CHECKING_LINKS, link_checks__link_id=shared_link_id
        )
        .values_list("id", flat=True)
        .distinct()
    )
    for audit_id in waiting:
        finish_audit_if_checked(str(audit_id))
    return True


def mark_waiting(shared_link_id: int, *, why: str, seconds: float) -> None:
    """A rate limit holds the link's check back: its checks are pending, with when it
    will try again."""
    LinkCheck.objects.filter(link_id=shared_link_id, status__in=LinkCheck.UNFINISHED).update(
        status=LinkCheck.Status.RATE_LIMITED_PENDING,
        retry_at=timezone.now() + timedelta(seconds=seconds),
        detail=why,
    )


def end_rate_limited(shared_link_id: int, task_id: str, error: WaitTooLong) -> None:
    """The link's host asked for a longer wait than RATELIMIT_MAX_WAIT_SECONDS: the link is
    reported `rate_limited`, with when it may be asked again, and its audits go on."""
    record_shared_outcome(
        shared_link_id,
        task_id,
        LinkOutcome(
            LinkCheck.Status.RATE_LIMITED, status_code=error.status_code, detail=str(error)
        ),
        retry_at=datetime.fromtimestamp(error.retry_at, tz=UTC),
    )


def give_up(shared_link_id: int, task_id: str, error: str) -> None:
    """No attempt left: the link is reported broken with the last error."""
    record_shared_outcome(
        shared_link_id, task_id, LinkOutcome(LinkCheck.Status.BROKEN, detail=error)
    )


def finish_audit_if_checked(audit_id: str) -> bool:
    """Finish the audit when none of its checks is left. Runs after each outcome's own
    update has committed, so of two outcomes arriving together at least the later one
    sees zero left."""
    if LinkCheck.objects.filter(audit_id=audit_id, status__in=LinkCheck.UNFINISHED).exists():
        return False
    return finish_link_checks(audit_id)


def finish_link_checks(audit_id: str, *, deadline_passed: bool = False) -> bool:
    audit = Audit.objects.filter(id=audit_id, status=Audit.Status.CHECKING_LINKS).first()
    if audit is None:
        return False
    checks = list(audit.link_checks.order_by("url"))
    unfinished = [check for check in checks if not check.is_finished]
    result = {
        **(audit.result or {}),
        # One entry per kept link (AUDIT_MAX_LINKS at most: the rows are the kept links).
        "links": [check.as_result() for check in checks],
        "link_check": {
            "total": len(checks),
            "outcomes": dict(Counter(check.status for check in checks)),
            "unfinished": len(unfinished),
            "rate_limited_pending": sum(
                check.status == LinkCheck.Status.RATE_LIMITED_PENDING for check in unfinished
            ),
            "deadline_passed": deadline_passed,
        },
    }
    return Audit.objects.finish(audit_id, status=Audit.Status.SUCCEEDED, result=result)


def finish_overdue_link_checks(*, now: datetime | None = None) -> int:
    """Finish the audits whose link-check deadline has passed, up to 500 (the sweep)."""
    now = now or timezone.now()
    overdue = Audit.objects.filter(
        status=Audit.Status.CHECKING_LINKS, link_checks_deadline__lte=now
    ).values_list("id", flat=True)[:500]
    finished = sum(finish_link_checks(str(audit_id), deadline_passed=True) for audit_id in overdue)
    if finished:
        log.info("audit.link_check_deadline", extra={"audits": finished})
    return finished


# A tick of the workers' threads (jobs.sweeps), never a queued message: behind a backlog
# of `audits` messages it still runs, so an audit overdue is finished within about this.
DEADLINE_SWEEP = Sweep(
    name="audits.link_check_deadline",
    interval_seconds=10.0,
    run=finish_overdue_link_checks,
)
