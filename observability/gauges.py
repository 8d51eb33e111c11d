"""The state the gauges show, read when /metrics is scraped and once a minute for the dashboard.

One function per reading, so the code that owns each number (admission's backlog,
the breakers, the outbound rate limits) can become the body of the function here
and every reader follows.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from kombu.transport.redis import PRIORITY_STEPS, Channel

from audits.models import Audit
from observability.metrics import redis_connection


@dataclass(frozen=True)
class QueueSnapshot:
    waiting: int
    retrying: int
    running: int
    scheduled: int

    @property
    def backlog(self) -> int:
        """Admitted work not yet done and not running: what admission control weighs."""
        return self.waiting + self.retrying

    def as_dict(self) -> dict[str, int]:
        return {
            "backlog": self.backlog,
            "waiting": self.waiting,
            "retrying": self.retrying,
            "running": self.running,
            "scheduled": self.scheduled,
        }


def broker_queue_keys(queue: str) -> list[str]:
    """The Redis lists kombu keeps for `queue`: the queue itself and one per priority step."""
    return [queue] + [f"{queue}{Channel.sep}{step}" for step in PRIORITY_STEPS if step]


def queue_snapshot() -> QueueSnapshot:
    """Audits waiting in the broker, in retry backoff, running, and scheduled for later.

    `waiting` counts messages in the `audits` lists. An audit in backoff is held by a
    worker as an unacknowledged ETA message, not in those lists, and its row says
    `retrying`: the two never count one audit twice. Nothing schedules audits for
    later yet (the nightly re-audit issue does), so `scheduled` is 0.
    """
    client = redis_connection()
    pipe = client.pipeline(transaction=False)
    for key in broker_queue_keys(settings.AUDIT_QUEUE):
        pipe.llen(key)
    waiting = sum(pipe.execute())
    counts = {Audit.Status.RETRYING: 0, Audit.Status.RUNNING: 0}
    for status in counts:
        counts[status] = Audit.objects.filter(status=status).count()
    return QueueSnapshot(
        waiting=waiting,
        retrying=counts[Audit.Status.RETRYING],
        running=counts[Audit.Status.RUNNING],
        scheduled=0,
    )


def audits_in_backoff() -> bool:
    """Whether any audit is waiting out a retry delay right now."""
    return Audit.objects.filter(status=Audit.Status.RETRYING).exists()


def breaker_states() -> dict[str, int]:
    """How many circuit breakers are in each state (BREAKER_STATES). No breakers exist yet."""
    return {}


def rate_limit_remaining() -> dict[str, float]:
    """Remaining requests per *watched* outbound key (a bounded, configured set). None yet."""
    return {}
