"""Rate-limited tasks deferred until their bucket admits them again.

Unlike `ratelimit.parking` (due-time parking for retries and open breakers), a
task here wakes only when admission for its own (key, resource) clears.

A worker holds an ETA message unacknowledged until it runs; held past the
queue's visibility timeout, the broker hands it to another worker as well. So
`ratelimit.retry.defer` publishes short waits with a countdown and parks long
ones here: a Redis sorted set scored by due time. `wake_due` (the periodic
`ratelimit.wake_parked` task) publishes what falls due, each at its own jittered
due time, after asking admission about the exact bucket the task waits on.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field

from django.conf import settings

from config.redis import redis_client
from ratelimit.admission import admit

log = logging.getLogger(__name__)

PARKED_KEY = "ratelimit:deferred"
# Message header counting how often a task was deferred (attempts are not spent).
DEFERRALS_HEADER = "plumb_deferrals"
# How far ahead the waker publishes (as short countdowns) so the jittered due
# times survive instead of collapsing onto the waker's ticks.
WAKE_LOOKAHEAD_SECONDS = 10.0
WAKE_BATCH = 500


@dataclass(frozen=True)
class ParkedTask:
    name: str
    task_id: str
    queue: str
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    retries: int = 0
    deferrals: int = 1
    key: str = ""
    resource: str = ""
    reason: str = ""

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def loads(cls, raw: bytes | str) -> ParkedTask:
        return cls(**json.loads(raw))


def longest_eta(queue: str) -> float:
    """The longest countdown a worker of `queue` may hold: half its visibility timeout,
    leaving the other half for the run itself and the restore scan's slack."""
    timeout = settings.QUEUE_VISIBILITY_TIMEOUTS.get(
        queue, settings.AUDITS_VISIBILITY_TIMEOUT_SECONDS
    )
    return timeout / 2


def publish(parked: ParkedTask, *, countdown: float = 0.0) -> None:
    """Send the task again: same id, same retries count (no attempt spent)."""
    from config.celery_app import app

    app.send_task(
        parked.name,
        args=parked.args,
        kwargs=parked.kwargs,
        task_id=parked.task_id,
        queue=parked.queue,
        retries=parked.retries,
        countdown=countdown if countdown > 0 else None,
        headers={DEFERRALS_HEADER: parked.deferrals},
    )


def park(parked: ParkedTask, *, due: float) -> None:
    redis_client().zadd(PARKED_KEY, {parked.dumps(): due})


def parked_count() -> int:
    return redis_client().zcard(PARKED_KEY)


def wake_due(*, now: float | None = None) -> int:
    """Publish parked tasks due within the lookahead; re-park those still refused.

    Each task is taken with ZREM, so two wakers running at once publish it once.
    Admission is asked about the bucket the task waits on, by its own key and
    resource: a healthy row of another bucket (the App JWT's) cannot wake it.
    """
    from ratelimit.retry import retry_after_delay

    client = redis_client()
    now = time.time() if now is None else now
    woken = 0
    for raw, due in client.zrangebyscore(
        PARKED_KEY, "-inf", now + WAKE_LOOKAHEAD_SECONDS, start=0, num=WAKE_BATCH, withscores=True
    ):
        if not client.zrem(PARKED_KEY, raw):
            continue  # another waker has it
        parked = ParkedTask.loads(raw)
        if parked.key:
            admission = admit(parked.key, parked.resource, now=now)
            if admission.until is not None and admission.until > due:
                again = now + retry_after_delay(admission.until - now)
                park(parked, due=again)
                log.info(
                    "ratelimit.reparked",
                    extra={"task_id": parked.task_id, "key": parked.key,
                           "resource": parked.resource, "due": round(again, 3)},
                )  # fmt: skip
                continue
        countdown = min(max(0.0, due - now), longest_eta(parked.queue))
        publish(parked, countdown=countdown)
        woken += 1
    if woken:
        log.info("ratelimit.woken", extra={"count": woken})
    return woken
