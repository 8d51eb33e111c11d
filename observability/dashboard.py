"""Which plots the dashboard shows, in which order, from the series of `observability.series`.

The first row is the one that shows a retry policy's waste: completions against
retry attempts as separate series, then downstream requests per unique job.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils.safestring import SafeString

from observability.charts import Series, legend, line_chart
from observability.series import WINDOWS

GREEN, ORANGE, RED, PURPLE, BLUE, GREY, AMBER = (
    "#2e7d32",
    "#e65100",
    "#c62828",
    "#6a1b9a",
    "#1565c0",
    "#757575",
    "#f9a825",
)


@dataclass(frozen=True)
class Plot:
    chart_id: str
    title: str
    svg: SafeString
    legend: SafeString


@dataclass(frozen=True)
class Row:
    title: str
    explanation: str
    plots: list[Plot]  # one per window, in the order given


def _total(value) -> str:
    if value is None:
        return "–"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _series_for(row: str, stats: dict) -> tuple[list[Series], tuple[float, str] | None]:
    s, totals = stats["series"], stats["totals"]
    if row == "work":
        return [
            Series(
                "completions",
                "Completions",
                s["completions"],
                GREEN,
                total=_total(totals["completions"]),
            ),
            Series(
                "retry_attempts",
                "Retry attempts",
                s["retry_attempts"],
                ORANGE,
                total=_total(totals["retry_attempts"]),
            ),
            Series(
                "failures",
                "Failures (no retry left)",
                s["failures"],
                PURPLE,
                dashed=True,
                total=_total(totals["failures"]),
            ),
        ], None
    if row == "amplification":
        return [
            Series(
                "amplification",
                "Downstream requests per unique job",
                s["amplification"],
                BLUE,
                total=_total(totals["amplification"]),
            ),
        ], (1.0, "1 request per job")
    if row == "backlog":
        latest = stats["latest_backlog"]
        return [
            Series(
                "waiting", "Waiting", s["backlog"]["waiting"], BLUE, total=_total(latest["waiting"])
            ),
            Series(
                "retrying",
                "Retrying (in backoff)",
                s["backlog"]["retrying"],
                ORANGE,
                total=_total(latest["retrying"]),
            ),
            Series(
                "scheduled",
                "Scheduled",
                s["backlog"]["scheduled"],
                GREY,
                total=_total(latest["scheduled"]),
            ),
        ], None
    if row == "admissions":
        admissions = s["admissions"]
        return [
            Series(
                "admitted",
                "Admitted",
                admissions["admitted"],
                GREEN,
                total=_total(totals["admissions"]["admitted"]),
            ),
            Series(
                "refused_ip",
                "Refused: per-IP limit",
                admissions["refused_ip"],
                AMBER,
                total=_total(totals["admissions"]["refused_ip"]),
            ),
            Series(
                "refused_client",
                "Refused: client's share",
                admissions["refused_client"],
                AMBER,
                total=_total(totals["admissions"]["refused_client"]),
            ),
            Series(
                "refused_backlog",
                "Refused: backlog full",
                admissions["refused_backlog"],
                RED,
                total=_total(totals["admissions"]["refused_backlog"]),
            ),
        ], None
    if row == "breakers":
        breakers = s["breakers"]
        return [
            Series("open", "Open", breakers["open"], RED),
            Series("half_open", "Half-open", breakers["half_open"], AMBER),
            Series("closed", "Closed", breakers["closed"], GREEN),
        ], None
    if row == "dead_letters":
        return [
            Series(
                "dead_letters",
                "Dead letters",
                s["dead_letters"],
                PURPLE,
                total=_total(totals["dead_letters"]),
            ),
        ], None
    raise ValueError(row)


ROWS = [
    (
        "work",
        "Completions vs retry attempts",
        "Retry attempts are their own series: a bad retry policy hides here while the success rate "
        "stays green.",
    ),
    (
        "amplification",
        "Downstream requests per unique job",
        "Requests sent to downstreams divided by the distinct jobs attempted in the same step. "
        "1 is one request per job; a retry storm multiplies it.",
    ),
    (
        "backlog",
        "Backlog",
        "Audits waiting in the queue, waiting out a retry delay, and "
        "scheduled for later (the highest sample in each step).",
    ),
    ("admissions", "Admissions and refusals", "Submissions admitted and refused, by reason."),
    ("breakers", "Circuit breakers", "Breakers in each state (the highest sample in each step)."),
    ("dead_letters", "Dead letters", "Jobs set aside for an operator."),
]


def rows(windows: list[dict]) -> list[Row]:
    result = []
    for row_id, title, explanation in ROWS:
        plots = []
        for stats in windows:
            series, reference = _series_for(row_id, stats)
            chart_id = f"{row_id}-{stats['window']}"
            label = f"{title}, {_window_label(stats)}"
            plots.append(
                Plot(
                    chart_id=chart_id,
                    title=label,
                    svg=line_chart(chart_id, label, stats["t"], series, reference=reference),
                    legend=legend(series),
                )
            )
        result.append(Row(title, explanation, plots))
    return result


def _window_label(stats: dict) -> str:
    window = WINDOWS[stats["window"]]
    return f"{window.label}, {window.step_label}"
