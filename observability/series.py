"""Reading the per-minute buckets back as aligned time series: GET /api/stats and the dashboard.

The last hour is shown minute by minute; the last day in ten-minute steps (a
count per step, a gauge's highest sample in the step), so a day's plot stays
readable and a short storm is not averaged away.
"""

from __future__ import annotations

from dataclasses import dataclass

from config.redis import redis_client
from observability.metrics import (
    ADMISSION_DECISIONS,
    BREAKER_STATES,
    RETRY_REASONS,
    TASK_DEAD_LETTERS,
    Field,
    counter_key,
    jobs_key,
    minute_key,
    minute_of,
)

BACKLOG_PARTS = ("waiting", "retrying", "scheduled", "running")


@dataclass(frozen=True)
class Window:
    name: str
    minutes: int
    step_minutes: int

    @property
    def label(self) -> str:
        return {"1h": "last hour", "1d": "last day"}[self.name]

    @property
    def step_label(self) -> str:
        return "per minute" if self.step_minutes == 1 else f"per {self.step_minutes} minutes"


WINDOWS = {"1h": Window("1h", 60, 1), "1d": Window("1d", 24 * 60, 10)}


def _number(raw: bytes) -> int | float:
    # Counts are integers (HINCRBY); a sampled gauge may not be.
    try:
        return int(raw)
    except ValueError:
        return float(raw)


def _ratio(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 3) if denominator else None


def stats(window_name: str, *, now: float | None = None) -> dict:
    """Every dashboard series for the window ending with the current minute."""
    window = WINDOWS[window_name]
    last = minute_of(now)
    first = last - window.minutes + 1
    # Steps aligned to the clock, so the same minute always falls in the same step.
    first -= first % window.step_minutes
    minutes = list(range(first, last + 1))
    steps = [
        minutes[i : i + window.step_minutes] for i in range(0, len(minutes), window.step_minutes)
    ]

    client = redis_client()
    pipe = client.pipeline(transaction=False)
    for minute in minutes:
        pipe.hgetall(minute_key(minute))
    for step in steps:
        pipe.pfcount(*[jobs_key(m) for m in step])
    pipe.pfcount(*[jobs_key(m) for m in minutes])
    pipe.hvals(counter_key(TASK_DEAD_LETTERS))
    results = pipe.execute()
    buckets = {
        minute: {k.decode(): _number(v) for k, v in raw.items()}
        for minute, raw in zip(minutes, results[: len(minutes)], strict=True)
    }
    unique_jobs = results[len(minutes) : len(minutes) + len(steps)]
    window_unique_jobs = results[-2]
    dead_letters_total = int(sum(float(v) for v in results[-1]))

    def total(field: str) -> list[int]:
        return [int(sum(buckets[m].get(field, 0) for m in step)) for step in steps]

    def peak(field: str) -> list[float | None]:
        series = []
        for step in steps:
            samples = [buckets[m][field] for m in step if field in buckets[m]]
            series.append(max(samples) if samples else None)
        return series

    attempts = total(Field.ATTEMPTS)
    first_attempts = total(Field.FIRST_ATTEMPTS)
    downstream = total(Field.DOWNSTREAM_REQUESTS)
    series = {
        "completions": total(Field.COMPLETIONS),
        "retry_attempts": [a - f for a, f in zip(attempts, first_attempts, strict=True)],
        "first_attempts": first_attempts,
        "failures": total(Field.FAILURES),
        "dead_letters": total(Field.DEAD_LETTERS),
        "retries_scheduled": {reason: total(Field.retries(reason)) for reason in RETRY_REASONS},
        "downstream_requests": downstream,
        "unique_jobs": unique_jobs,
        "amplification": [_ratio(d, u) for d, u in zip(downstream, unique_jobs, strict=True)],
        "backlog": {part: peak(Field.sample(part)) for part in BACKLOG_PARTS},
        "admissions": {d: total(Field.admissions(d)) for d in ADMISSION_DECISIONS},
        "admissions_in_backoff": {
            d: total(Field.admissions_in_backoff(d)) for d in ADMISSION_DECISIONS
        },
        "breakers": {s: peak(Field.sample(f"breakers:{s}")) for s in BREAKER_STATES},
        "breaker_transitions": {s: total(Field.breaker_transitions(s)) for s in BREAKER_STATES},
    }
    latest_backlog = {
        part: next((v for v in reversed(series["backlog"][part]) if v is not None), None)
        for part in BACKLOG_PARTS
    }
    totals = {
        "completions": sum(series["completions"]),
        "retry_attempts": sum(series["retry_attempts"]),
        "first_attempts": sum(first_attempts),
        "failures": sum(series["failures"]),
        "dead_letters": sum(series["dead_letters"]),
        "downstream_requests": sum(downstream),
        "unique_jobs": window_unique_jobs,
        "amplification": _ratio(sum(downstream), window_unique_jobs),
        "admissions": {d: sum(v) for d, v in series["admissions"].items()},
        "admissions_in_backoff": {d: sum(v) for d, v in series["admissions_in_backoff"].items()},
    }
    return {
        "window": window.name,
        "step_seconds": window.step_minutes * 60,
        "from": steps[0][0] * 60,
        "to": (last + 1) * 60,
        "t": [step[0] * 60 for step in steps],
        "series": series,
        "totals": totals,
        "latest_backlog": latest_backlog,
        "dead_letters_all_time": dead_letters_total,
    }
