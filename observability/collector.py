"""GET /metrics: the totals kept in Redis and the gauges read now, in Prometheus text format."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterator

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest

from config.redis import lua, queue_script, redis_client
from observability import gauges
from observability.metrics import (
    BREAKER_STATES,
    BREAKERS,
    COUNTERS,
    DELAYED_OVERDUE,
    HISTOGRAMS,
    KNOWN_LABEL_VALUES,
    PAGES_CHANGED,
    PAGES_WORSE,
    QUEUE_BACKLOG,
    QUEUE_DEFERRED_BEYOND_HORIZON,
    QUEUE_MAX_DEPTH,
    QUEUE_RETRYING,
    QUEUE_RUNNING,
    QUEUE_SCHEDULED,
    QUEUE_WAITING,
    REAUDIT_FANOUT_TIMESTAMP,
    REAUDIT_PLACEMENTS,
    REAUDIT_PLACEMENTS_DUE,
    REAUDIT_PLACEMENTS_FIRED,
    bucket_label,
    counter_key,
    exported_key,
    histogram_key,
)

log = logging.getLogger(__name__)


# A counter's totals as /metrics exports them: each series at the highest total exported so
# far, which is then kept. Prometheus reads any decrease as a restart of the counter, and
# rate() counts the whole total again. One decrease is by design: a submission the admission
# script counted as admitted and its client's share then refused is moved to refused_client
# (audits.admission.refuse_client), and a scrape between the two saw it admitted. Exported at
# its highest, that series stays level until the next admission. A counter whose hash is
# gone (a Redis that came back empty, or only that key lost) forgets its highest totals too:
# it restarts from zero, as Prometheus expects.
# KEYS: the counter's hash, its exported highest totals. Answers field, total, field, ...
EXPORTED_TOTALS = lua(
    """
local totals = redis.call('HGETALL', KEYS[1])
if #totals == 0 then
  redis.call('DEL', KEYS[2])
  return totals
end
local highest = {}
local exported = redis.call('HGETALL', KEYS[2])
for i = 1, #exported, 2 do
  highest[exported[i]] = exported[i + 1]
end
for i = 1, #totals, 2 do
  local field, total = totals[i], totals[i + 1]
  local high = highest[field]
  if high and tonumber(high) > tonumber(total) then
    totals[i + 1] = high
  elseif high ~= total then
    redis.call('HSET', KEYS[2], field, total)
  end
end
return totals
"""
)


class PlumbCollector:
    """Reads every counter and histogram in one Redis round trip, then the gauges."""

    def describe(self) -> list:
        # Nothing to describe up front: registering must not query Redis.
        return []

    def collect(self) -> Iterator[Metric]:
        pipe = redis_client().pipeline(transaction=False)
        for metric in COUNTERS:
            keys = [counter_key(metric), exported_key(metric)]
            queue_script(pipe, EXPORTED_TOTALS, keys=keys, args=[])
        for metric in HISTOGRAMS:
            pipe.hgetall(histogram_key(metric))
        results = pipe.execute()
        for metric, flat in zip(COUNTERS, results[: len(COUNTERS)], strict=True):
            yield _counter(metric, dict(zip(flat[::2], flat[1::2], strict=True)))
        for metric, stored in zip(HISTOGRAMS, results[len(COUNTERS) :], strict=True):
            yield _histogram(metric, stored)
        yield from _gauges()


def _counter(metric, stored: dict[bytes, bytes]) -> CounterMetricFamily:
    family = CounterMetricFamily(metric.name, metric.help, labels=metric.labels)
    values = {tuple(json.loads(field)): float(value) for field, value in stored.items()}
    for labels in KNOWN_LABEL_VALUES.get(metric.name, []):
        values.setdefault(tuple(labels), 0.0)
    for labels, value in sorted(values.items()):
        family.add_metric(list(labels), value)
    return family


def _histogram(metric, stored: dict[bytes, bytes]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(metric.name, metric.help, labels=metric.labels)
    series: dict[tuple, dict[str, float]] = defaultdict(dict)
    for field, value in stored.items():
        *labels, part = json.loads(field)
        series[tuple(labels)][part] = float(value)
    for labels, parts in sorted(series.items()):
        cumulative = 0.0
        buckets = []
        for bound in [bucket_label(b) for b in metric.buckets] + ["+Inf"]:
            cumulative += parts.get(bound, 0.0)
            buckets.append((bound, cumulative))
        family.add_metric(list(labels), buckets, parts.get("sum", 0.0))
    return family


PLAIN_GAUGES = (
    (QUEUE_BACKLOG, "backlog"),
    (QUEUE_WAITING, "waiting"),
    (QUEUE_RETRYING, "retrying"),
    (QUEUE_RUNNING, "running"),
    (QUEUE_DEFERRED_BEYOND_HORIZON, "deferred_beyond_horizon"),
    (QUEUE_SCHEDULED, "scheduled"),
    (PAGES_CHANGED, "pages_changed"),
    (PAGES_WORSE, "pages_worse"),
    (QUEUE_MAX_DEPTH, "max_depth"),
    (REAUDIT_FANOUT_TIMESTAMP, "reaudit_fanout_timestamp"),
    (REAUDIT_PLACEMENTS, "reaudit_placements"),
    (REAUDIT_PLACEMENTS_DUE, "reaudit_placements_due"),
    (REAUDIT_PLACEMENTS_FIRED, "reaudit_placements_fired"),
)


def _gauges() -> Iterator[Metric]:
    values = gauges.read_all()
    for metric, field in PLAIN_GAUGES:
        if field in values:
            yield GaugeMetricFamily(metric.name, metric.help, value=values[field])
    if any(f"breakers:{state}" in values for state in BREAKER_STATES):
        family = GaugeMetricFamily(BREAKERS.name, BREAKERS.help, labels=BREAKERS.labels)
        for state in BREAKER_STATES:
            family.add_metric([state], values.get(f"breakers:{state}", 0))
        yield family
    overdue = {f.split(":", 1)[1]: v for f, v in values.items() if f.startswith("delayed_overdue:")}
    if overdue:
        family = GaugeMetricFamily(
            DELAYED_OVERDUE.name, DELAYED_OVERDUE.help, labels=DELAYED_OVERDUE.labels
        )
        for queue, age in sorted(overdue.items()):
            family.add_metric([queue], age)
        yield family


def exposition() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PlumbCollector())
    return generate_latest(registry)
