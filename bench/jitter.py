"""The retry jitters Plumb measured and did not choose, for bench/retry_storm.py's comparison.

Plumb retries with multiplicative jitter (jobs.policy.delay); DECISIONS.md ("Retries")
and BENCHMARKS.md ("Retry storm") have the measurements that chose it over these.
Each takes the retry's step (1 for the first retry), the policy's base and cap, the
previous delay (decorrelated jitter only) and a random source.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from jobs.policy import exponential


def full(
    step: int, *, base: float, cap: float, previous: float | None, rng: random.Random
) -> float:
    """Anywhere from 0 to the exponential delay."""
    return rng.uniform(0, exponential(step, base=base, cap=cap))


def equal(
    step: int, *, base: float, cap: float, previous: float | None, rng: random.Random
) -> float:
    """Half the exponential delay, plus up to the other half."""
    wait = exponential(step, base=base, cap=cap)
    return wait / 2 + rng.uniform(0, wait / 2)


def decorrelated(
    step: int, *, base: float, cap: float, previous: float | None, rng: random.Random
) -> float:
    """AWS's "decorrelated jitter": min(cap, uniform(base, 3 x the previous delay))."""
    return min(cap, rng.uniform(base, max(base, previous or base) * 3))


Jitter = Callable[..., float]
VARIANTS: dict[str, Jitter] = {"full": full, "equal": equal, "decorrelated": decorrelated}
