"""A task's deadline budget, declared once; every bound on one attempt is derived from it.

A task names the longest its own work can take (`work`: its outbound exchanges' whole
deadlines, outbound.bounded, and the waits it makes inline). The runtime adds its own:

    soft   = work + GRACE_SECONDS      the attempt is told to stop (SoftTimeLimitExceeded)
    hard   = soft + HARD_AFTER_SOFT    the attempt is ended (TimeLimitExceeded)
    lease  = hard + LEASE_MARGIN       what an attempt holds lapses on its own after this
                                       (its running-registry entry, a delivery's attempt
                                       lease, a client's link-check slot)
    dead after = lease                 a row still `running` this long after its attempt
                                       began has no live attempt (jobs.lifecycle)

Each is checked against the queue's visibility timeout at start-up (`deadline_problems`, run by
`manage.py check` as jobs.E001 and by every worker as it starts): soft < hard < lease <=
visibility timeout, or a slow attempt's message is handed to a second worker while the
first still runs it, or a lease outlives the message it guards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# The database's and Redis's waits around the work (the claim, the finish, the failure's
# record): their own socket and statement timeouts bound each.
GRACE_SECONDS = 30.0
# A task that caught SoftTimeLimitExceeded and went on.
HARD_AFTER_SOFT_SECONDS = 30.0
# Clock skew between a worker host and Redis never drops a live attempt's lease.
LEASE_MARGIN_SECONDS = 30.0


@dataclass(frozen=True)
class Deadline:
    """The longest one attempt's own work takes, in seconds; everything else derives."""

    work: float

    @property
    def soft(self) -> float:
        return self.work + GRACE_SECONDS

    @property
    def hard(self) -> float:
        return self.soft + HARD_AFTER_SOFT_SECONDS

    @property
    def lease(self) -> float:
        return self.hard + LEASE_MARGIN_SECONDS

    @property
    def dead_after(self) -> float:
        """An attempt begun this long ago is over: ended by its hard limit, or its worker died."""
        return self.lease


def deadline_problems(tasks: Iterable, visibility_timeouts: Mapping[str, float]) -> list[str]:
    """What is wrong with each task's deadline budget against its queue's visibility timeout:
    soft < hard < lease <= visibility timeout. `manage.py check` reports each as an error
    (jobs.checks), and a worker logs them as it starts (jobs.bootsteps.TimeLimitCheck)."""
    problems = []
    for task in sorted(tasks, key=lambda task: task.name):
        visibility = visibility_timeouts.get(task.queue)
        deadline = task.deadline
        if visibility is None:
            problems.append(f"{task.name}: its queue {task.queue!r} has no visibility timeout")
        elif deadline is None:
            problems.append(f"{task.name}: it declares no deadline budget (jobs.deadlines)")
        elif deadline.lease > visibility:
            problems.append(
                f"{task.name}: soft {deadline.soft:g} s < hard {deadline.hard:g} s < lease "
                f"{deadline.lease:g} s <= the {task.queue} queue's visibility timeout "
                f"{visibility:g} s does not hold, so a slow attempt would be handed to a "
                "second worker while it still runs"
            )
    return problems
