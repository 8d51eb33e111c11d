"""The jitters Plumb did not choose (bench/jitter.py): their bounds, and why not decorrelated.

They back the comparison in bench/retry_storm.py and DECISIONS.md ("Retries"); the
product's own jitter is tested in tests/test_retry.py.
"""

from __future__ import annotations

import random

import pytest

from bench import jitter

DRAWS = 2000


def draws(step: int, name: str, *, base=1.0, cap=60.0, previous=None) -> list[float]:
    rng = random.Random(step)
    variant = jitter.VARIANTS[name]
    return [variant(step, base=base, cap=cap, previous=previous, rng=rng) for _ in range(DRAWS)]


@pytest.mark.parametrize(("name", "low", "high"), [("full", 0.0, 60.0), ("equal", 30.0, 60.0)])
def test_full_and_equal_jitter_stay_within_their_bounds_at_the_cap(name, low, high):
    delays = draws(30, name)
    assert min(delays) >= low
    assert max(delays) <= high


def test_decorrelated_jitter_piles_up_on_the_cap():
    # Why it was not chosen (DECISIONS.md): min(cap, uniform(base, 3 * previous))
    # clamps about two thirds of the draws to exactly the cap once previous is there.
    delays = draws(30, "decorrelated", previous=60.0)
    at_cap = sum(1 for d in delays if d == 60.0)
    assert 0.6 < at_cap / DRAWS < 0.73
    assert min(delays) >= 1.0
