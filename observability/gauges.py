"""The state the gauges show, read when /metrics is scraped and once a minute for the dashboard.

One function per reading, so the code that owns each number (admission's backlog,
the breakers, the outbound rate limits) can become the body of the function here
and every reader follows.
"""

from __future__ import annotations

from dataclasses import dataclass

from config.redis import redis_client


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


def queue_snapshot() -> QueueSnapshot:
    """The backlog exactly as admission control weighs it, and the scheduled re-audits."""
    from audits.backlog import backlog_snapshot
    from reaudit.services import count_scheduled

    client = redis_client()
    backlog = backlog_snapshot(client)
    return QueueSnapshot(
        waiting=backlog.waiting,
        retrying=backlog.retrying,
        running=backlog.running,
        scheduled=count_scheduled(),
    )


def breaker_states() -> dict[str, int]:
    """How many circuit breakers are in each state (BREAKER_STATES). No breakers exist yet."""
    return {}


def rate_limit_remaining() -> dict[str, float]:
    """Remaining requests per *watched* outbound key (a bounded, configured set). None yet."""
    return {}
