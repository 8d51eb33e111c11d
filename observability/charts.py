"""Line charts as server-rendered SVG: no JavaScript, nothing to vendor, readable in any browser.

Each series is a `<g data-series="name">` of polylines; a missing value (no
sample in that step) breaks the line instead of drawing a fake zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 560, 190
LEFT, RIGHT, TOP, BOTTOM = 46, 18, 10, 24


@dataclass(frozen=True)
class Series:
    name: str
    label: str
    values: list[float | None]
    color: str
    dashed: bool = False
    total: str = ""


def nice_ceiling(value: float, *, ticks: int = 4) -> float:
    """The top of an axis with `ticks` equal steps of 1, 2, 2.5 or 5 x 10^k covering `value`."""
    needed = max(value, 1.0) / ticks
    magnitude = 10 ** math.floor(math.log10(needed))
    for factor in (1, 2, 2.5, 5, 10):
        if factor * magnitude >= needed:
            return factor * magnitude * ticks
    raise AssertionError("unreachable: 10 x magnitude always covers it")


def _number(value: float) -> str:
    return f"{value:g}" if value < 10_000 else f"{value / 1000:g}k"


def _tick_interval(span_seconds: int) -> int:
    return 600 if span_seconds <= 2 * 3600 else 3 * 3600


def line_chart(
    chart_id: str,
    title: str,
    t: list[int],
    series: list[Series],
    *,
    reference: tuple[float, str] | None = None,
) -> SafeString:
    """An SVG line chart of `series` over the step start times `t` (epoch seconds)."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    values = [v for s in series for v in s.values if v is not None]
    top = nice_ceiling(max([*values, reference[0] if reference else 0, 0]))

    # Coordinates to a tenth of a pixel: enough for the eye, short in the markup.
    def x(i: int) -> float:
        return round(LEFT + (plot_w * i / (len(t) - 1) if len(t) > 1 else plot_w / 2), 1)

    def y(v: float) -> float:
        return round(TOP + plot_h - plot_h * v / top, 1)

    parts: list[str] = [
        format_html(
            '<svg class="chart" data-chart="{}" viewBox="0 0 {} {}" role="img" '
            'aria-label="{}" xmlns="http://www.w3.org/2000/svg"><title>{}</title>',
            chart_id,
            WIDTH,
            HEIGHT,
            title,
            title,
        )
    ]
    for k in range(5):
        v = top * k / 4
        parts.append(
            format_html(
                '<line class="grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                '<text class="axis" x="{}" y="{}" text-anchor="end">{}</text>',
                LEFT,
                WIDTH - RIGHT,
                y(v),
                y(v),
                LEFT - 6,
                round(y(v) + 4, 1),
                _number(v),
            )
        )
    if t:
        interval = _tick_interval(t[-1] - t[0])
        for i, stamp in enumerate(t):
            if stamp % interval == 0:
                label = datetime.fromtimestamp(stamp, UTC).strftime("%H:%M")
                parts.append(
                    format_html(
                        '<line class="tick" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                        '<text class="axis" x="{}" y="{}" text-anchor="middle">{}</text>',
                        x(i),
                        x(i),
                        TOP + plot_h,
                        TOP + plot_h + 4,
                        x(i),
                        HEIGHT - 6,
                        label,
                    )
                )
    if reference is not None:
        level, label = reference
        parts.append(
            format_html(
                '<line class="reference" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                '<text class="axis" x="{}" y="{}">{}</text>',
                LEFT,
                WIDTH - RIGHT,
                y(level),
                y(level),
                LEFT + 4,
                round(y(level) - 4, 1),
                label,
            )
        )
    for s in series:
        parts.append(
            format_html(
                '<g class="series" data-series="{}" stroke="{}" fill="{}"{}>',
                s.name,
                s.color,
                s.color,
                mark_safe(' stroke-dasharray="5 3"') if s.dashed else "",
            )
        )
        for run in _runs(s.values):
            if len(run) == 1:
                i, v = run[0]
                parts.append(format_html('<circle cx="{}" cy="{}" r="2.5"/>', x(i), y(v)))
            else:
                points = " ".join(f"{x(i)},{y(v)}" for i, v in run)
                parts.append(format_html('<polyline fill="none" points="{}"/>', points))
        parts.append("</g>")
    parts.append("</svg>")
    return mark_safe("".join(parts))


def legend(series: list[Series]) -> SafeString:
    return format_html(
        '<ul class="legend">{}</ul>',
        format_html_join(
            "",
            '<li data-series="{}"><span class="swatch{}" style="background:{}"></span>'
            "{} <b>{}</b></li>",
            ((s.name, " dashed" if s.dashed else "", s.color, s.label, s.total) for s in series),
        ),
    )


def _runs(values: list[float | None]) -> list[list[tuple[int, float]]]:
    """Consecutive non-missing points, each run drawn as one line."""
    runs: list[list[tuple[int, float]]] = []
    current: list[tuple[int, float]] = []
    for i, v in enumerate(values):
        if v is None:
            if current:
                runs.append(current)
            current = []
        else:
            current.append((i, v))
    if current:
        runs.append(current)
    return runs
