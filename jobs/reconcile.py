"""The one reconciler: PostgreSQL is the record of what Plumb owes, Redis only carries it.

Every message, held retry and delayed-store entry lives in Redis, and Redis may come
back empty (a restart without persistence) or behind (a failover to a replica that
had not caught up: Sentinel does not keep every acknowledged write). Each app says
what it owes as rows in its own tables: a kind of job registers its declaration
(`register_job`, jobs.lifecycle: one rule for every job row), and other work its own
`OwedWork` (a night's slices and placements), in its AppConfig.ready(). A tick (`reconcile`, run by every worker's `jobs.bootsteps.Reconciler`, one
worker per RECONCILE_INTERVAL_SECONDS cluster-wide) asks every source, in two ways:

- Redis lost data: the tick finds the mark it left at the last tick gone (Redis came
  back empty) or written by another server (`run_id`: a restart or a failover, which
  may have kept only a prefix of the writes). Every row owed since the mark's time
  (since ever, if the mark is gone) is published again, each at its own due time: a
  wait still to run goes back to the delayed store, not to the queue at once. Recovery
  comes within one interval of Redis answering again.
- Redis kept its data, but one message may still be gone (a web process died between
  commit and publish, a worker was SIGKILLed between taking a message and recording
  it unacked): a row still owed RECONCILE_AFTER_SECONDS after it was due is published
  again, at once. Found by age, never by searching Redis (O(messages) a row).

A row published again whose message was not really lost runs once anyway: every job
claims its row (jobs.lifecycle.Job.claim, a placement's idempotency key,
jobs.delayed.claim for the store's own publishes), and a copy that meets its original
in flight is dropped (jobs.task.PlumbTask._take_flight), so a duplicate costs one claim
that finds the work done, or at worst one repeated downstream call (DECISIONS.md,
"Redis holds nothing that PostgreSQL cannot rebuild").
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import kombu.exceptions
import redis
from celery import current_app
from django.conf import settings
from django.utils import timezone

from jobs import delayed
from jobs.lifecycle import Job, Owed, Window
from jobs.models import ReconcileMark
from observability import metrics

log = logging.getLogger(__name__)

# Left by every tick: which Redis server (run_id) held it, and when (this host's clock,
# the clock the rows' times are written with).
MARK_KEY = "jobs:reconcile:mark"
LOCK_KEY = "jobs:reconcile:lock"
# A Redis that kept the mark of time T kept every write before T (replication and
# persistence keep a prefix of the writes); the margin covers clock skew between hosts.
MARK_MARGIN_SECONDS = 60.0
# A due time this close is not worth a trip through the delayed store.
PUBLISH_NOW_WITHIN_SECONDS = 1.0
# Held while a tick runs; a tick that ends early lets the lock lapse at the interval.
LOCK_LONGEST_SECONDS = 600.0


@dataclass(frozen=True)
class OwedWork:
    """One kind of job an app owes, as its rows record it.

    owed(window) returns the rows to publish again (at most `window.limit` of them);
    republish(row) publishes one and says whether the broker took it (False ends the
    tick: the broker is down, the next tick tries again).
    """

    name: str
    owed: Callable[[Window], Iterable[Any]]
    republish: Callable[[Any], bool]


_sources: dict[str, OwedWork] = {}


def register(source: OwedWork) -> None:
    """Called from an AppConfig.ready(); registering a name again replaces it."""
    _sources[source.name] = source


def register_job(job: Job) -> None:
    """A kind of job (jobs.lifecycle) as a source: its rows say what is owed, by the one rule."""

    def republish(owed: Owed) -> bool:
        if not publish_owed(
            job.task, args=[job.message_arg(owed.pk)], task_id=owed.task_id, queue=job.queue,
            due_at=owed.due_at, retries=owed.attempts,
        ):  # fmt: skip
            return False
        job.published(owed.pk)
        return True

    register(OwedWork(job.name, job.owed, republish))


def sources() -> list[OwedWork]:
    return list(_sources.values())


# --- Publishing one owed job ----------------------------------------------------------

# What a publish raises while the broker is away.
PUBLISH_ERRORS = (kombu.exceptions.OperationalError, redis.RedisError, OSError)


def publish_owed(
    task_name: str,
    *,
    args: list,
    task_id: str,
    queue: str,
    due_at: datetime | None = None,
    retries: int = 0,
    app=None,
) -> bool:
    """Publish a job again under its own task id: at once, or, if it is due later, into
    the delayed store until then (a backoff is kept, not cut short). `retries`: the
    attempts its row counted, so a recovered job keeps its budget. False if Redis
    cannot take it now."""
    seconds = 0.0 if due_at is None else (due_at - timezone.now()).total_seconds()
    try:
        if seconds > PUBLISH_NOW_WITHIN_SECONDS:
            entry = delayed.Entry(
                task=task_name, queue=queue, task_id=task_id, args=list(args),
                retries=retries, wait="retry", reason="republished by the reconciler",
            )  # fmt: skip
            delayed.schedule(entry, delay=seconds)
        else:
            (app or current_app).send_task(
                task_name, args=args, task_id=task_id, queue=queue, retries=retries
            )
    except PUBLISH_ERRORS as exc:
        log.warning("reconcile.publish_failed", extra={"task": task_name, "error": repr(exc)})
        return False
    return True


# --- Did Redis lose data? ---------------------------------------------------------------


def _server_id(client: redis.Redis) -> str:
    try:
        return str(client.info("server").get("run_id", ""))
    except redis.ResponseError:
        return ""  # INFO renamed away (some managed services): only a missing mark tells


def read_mark(client: redis.Redis) -> tuple[bool, datetime | None]:
    """(lost, since): whether Redis lost writes since a mark was last left, and after when
    (None: all of them). A first tick ever (no mark in PostgreSQL either) lost nothing."""
    if not ReconcileMark.objects.exists():
        return False, None
    raw = client.get(MARK_KEY)
    if raw is None:
        return True, None
    mark = json.loads(raw)
    if mark.get("server") == _server_id(client):
        return False, None
    return True, datetime.fromtimestamp(mark["at"] - MARK_MARGIN_SECONDS, tz=UTC)


def write_mark(client: redis.Redis, *, at: datetime) -> None:
    server = _server_id(client)
    client.set(MARK_KEY, json.dumps({"server": server, "at": at.timestamp()}))
    ReconcileMark.objects.update_or_create(pk=1, defaults={"server": server, "at": at})


# --- A tick -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reconciled:
    redis_lost: bool
    republished: dict[str, int]
    complete: bool


def reconcile(
    *, client: redis.Redis, now: datetime | None = None, overdue_after: float | None = None
) -> Reconciled:
    """One pass over every registered source (see the module's docstring)."""
    now = now or timezone.now()
    if overdue_after is None:
        overdue_after = settings.RECONCILE_AFTER_SECONDS
    lost, since = read_mark(client)
    window = Window(
        now=now,
        redis_lost=lost,
        lost_since=since,
        overdue_before=now - timedelta(seconds=overdue_after),
    )
    republished: dict[str, int] = {}
    complete = True
    for source in sources():
        count, done = _republish(source, window)
        if count:
            republished[source.name] = count
            metrics.record_republished(source.name, count)
        complete = complete and done
    # Only once everything owed is out: a tick cut short finds the loss again.
    if complete:
        write_mark(client, at=now)
    if republished:
        log.warning(
            "reconcile.republished",
            extra={"redis_lost": lost, "lost_since": since and since.isoformat(),
                   "republished": republished},
        )  # fmt: skip
    return Reconciled(redis_lost=lost, republished=republished, complete=complete)


def _republish(source: OwedWork, window: Window) -> tuple[int, bool]:
    count = 0
    for row in source.owed(window):
        if not source.republish(row):
            return count, False
        count += 1
    return count, True


def tick(client: redis.Redis) -> Reconciled | None:
    """A worker thread's tick: reconcile unless another worker did in this interval."""
    interval = settings.RECONCILE_INTERVAL_SECONDS
    # Held for the whole tick (a large loss takes a while to publish), then left to lapse
    # by the next interval, so the cluster ticks about once an interval.
    if not client.set(LOCK_KEY, uuid.uuid4().hex, nx=True, px=int(LOCK_LONGEST_SECONDS * 1000)):
        return None
    started = time.monotonic()
    try:
        return reconcile(client=client)
    finally:
        remaining = 0.9 * interval - (time.monotonic() - started)
        if remaining > 0.001:
            client.pexpire(LOCK_KEY, int(remaining * 1000))
        else:
            client.delete(LOCK_KEY)
