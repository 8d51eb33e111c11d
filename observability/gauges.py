"""The gauges: readings of the product's state, registered by the apps that own them.

Observability reads the product only through this registry, so it imports no
product app: `audits` registers its queue's backlog and the pages that changed,
`reaudit` the scheduled re-audits and the night's progress, `jobs` its breakers and
the delayed stores' overdue entries, each from its AppConfig.ready(). A reading is a
mapping of sample field names to numbers; /metrics exposes them and the minute
sampler keeps them for the dashboard.

Fields the readers know: backlog, waiting, retrying, running, scheduled,
breakers:<state>, pages_changed, pages_worse, max_depth, delayed_overdue:<queue>,
reaudit_fanout_timestamp, reaudit_placements, reaudit_placements_due,
reaudit_placements_fired.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

Reading = Callable[[], dict[str, int | float]]
_readings: dict[str, Reading] = {}


def register(name: str, reading: Reading) -> None:
    """Add (or replace) the reading called `name`."""
    _readings[name] = reading


def read(name: str) -> dict[str, int | float]:
    """One registered reading; raises whatever reading it raises."""
    return _readings[name]()


def read_all() -> dict[str, int | float]:
    """Every registered reading, merged. One that cannot be read is left out and logged:
    the others are still worth having."""
    values: dict[str, int | float] = {}
    for name, reading in sorted(_readings.items()):
        try:
            values.update(reading())
        except Exception:
            log.exception("metrics.gauge_unavailable", extra={"gauge": name})
    return values


# Readings only the dashboard asks for, when a staff user opens it: too costly to take
# every minute and at every /metrics scrape (a scan of the pages), so never in read_all.
_reports: dict[str, Callable[[], object]] = {}


def register_report(name: str, reading: Callable[[], object]) -> None:
    """Add (or replace) the dashboard-only reading called `name`."""
    _reports[name] = reading


def read_report(name: str):
    """One dashboard-only reading; raises whatever it raises (KeyError if not registered)."""
    return _reports[name]()
