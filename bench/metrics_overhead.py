"""What keeping the Prometheus totals in Redis costs, against prometheus-client's multiprocess mode.

    .venv/bin/python bench/metrics_overhead.py

Starts its own throwaway redis-server on a free port (nothing else is touched) and
measures, in one run:

1. per event: the per-minute dashboard bucket alone (needed whichever way the totals
   are kept); Plumb's `record_completion` (bucket + Redis total in the same pipeline);
   and the bucket plus a multiprocess-mode `Counter.inc()` (an mmap'd file per process);
2. per scrape: Plumb's collector reading the totals from Redis, and the multiprocess
   collector merging one file per process that ever recorded (pool children that were
   recycled leave theirs behind until the directory is cleaned at the next start).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Multiprocess mode is chosen when prometheus_client is first imported.
MULTIPROC_DIR = tempfile.mkdtemp(prefix="plumb-bench-multiproc-")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = MULTIPROC_DIR

from config import devservices  # noqa: E402

EVENTS = 5000
ROUNDS = 9
PROCESS_FILES = (4, 40)


def per_event_us(actions: dict) -> dict[str, float]:
    """Median over ROUNDS of one action's mean time, in microseconds. The actions take
    turns within each round, so a busy moment on the machine hits them all alike."""
    for action in actions.values():  # warm up connections and code paths
        for _ in range(200):
            action()
    results: dict[str, list[float]] = {name: [] for name in actions}
    for _ in range(ROUNDS):
        for name, action in actions.items():
            started = time.perf_counter()
            for _ in range(EVENTS):
                action()
            results[name].append((time.perf_counter() - started) / EVENTS * 1e6)
    return {name: statistics.median(times) for name, times in results.items()}


def per_scrape_ms(scrape, repeat: int = 30) -> float:
    results = []
    for _ in range(repeat):
        started = time.perf_counter()
        scrape()
        results.append((time.perf_counter() - started) * 1000)
    return statistics.median(results)


def main() -> int:
    port = devservices.free_port()
    data_dir = Path(tempfile.mkdtemp(prefix="plumb-bench-redis-"))
    redis_process = devservices.start_redis(port, data_dir)
    os.environ.update(
        {"REDIS_URL": f"redis://127.0.0.1:{port}/0", "DEBUG": "true", "LOG_LEVEL": "ERROR"}
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    try:
        import django

        django.setup()
        return run()
    finally:
        redis_process.terminate()
        redis_process.wait(timeout=10)


def run() -> int:
    from prometheus_client import CollectorRegistry, Counter, multiprocess
    from prometheus_client.exposition import generate_latest

    from config.redis import redis_client
    from observability import collector, gauges, metrics
    from observability.metrics import Field, minute_of

    # The gauges read the database; this compares only the stored totals.
    gauges.queue_snapshot = lambda: gauges.QueueSnapshot(0, 0, 0, 0)

    client = redis_client()

    def bucket_only():
        minute = minute_of()
        pipe = client.pipeline(transaction=False)
        pipe.hincrby(metrics.minute_key(minute), Field.COMPLETIONS, 1)
        pipe.expireat(metrics.minute_key(minute), (minute + 1) * 60 + 48 * 3600)
        pipe.execute()

    def redis_totals():
        metrics.record_completion("audits.run_audit")

    mp_counter = Counter("bench_completions", "bench", ["task"], registry=None)

    def bucket_and_multiprocess():
        bucket_only()
        mp_counter.labels("audits.run_audit").inc()

    timings = per_event_us(
        {"bucket": bucket_only, "chosen": redis_totals, "multiproc": bucket_and_multiprocess}
    )
    bucket, chosen, multiproc = timings["bucket"], timings["chosen"], timings["multiproc"]
    print(f"per event, median of {ROUNDS} x {EVENTS} (microseconds):")
    print(f"  dashboard bucket alone             {bucket:8.1f}")
    print(f"  bucket + Redis total (chosen)      {chosen:8.1f}   {chosen / bucket:.2f}x the bucket")
    print(
        f"  bucket + multiprocess Counter.inc  {multiproc:8.1f}   {multiproc / bucket:.2f}x the bucket"
    )

    # A realistic spread of series: every counter and histogram with a few label sets.
    for reason in metrics.RETRY_REASONS:
        metrics.record_retry("audits.run_audit", reason)
    for outcome in metrics.DOWNSTREAM_OUTCOMES:
        metrics.record_downstream_request("host", 200, outcome, 0.3)
    metrics.record_task_attempt("audits.run_audit", first=True, job_id="j", queue_wait=0.2)
    metrics.record_audit_duration(1.2, outcome="succeeded")
    redis_scrape = per_scrape_ms(collector.exposition)
    print("per scrape, median of 30 (milliseconds):")
    print(f"  Redis totals (chosen)              {redis_scrape:8.2f}")

    # One file per process that ever recorded: fork children that each count a spread
    # of series like the ones above, then time the merge.
    families = [
        Counter(f"bench_family_{i}", "bench", ["task", "reason"], registry=None) for i in range(12)
    ]
    made = 0
    for target in PROCESS_FILES:
        while made < target:
            pid = os.fork()
            if pid == 0:
                for family in families:
                    for reason in ("error", "rate_limited", "breaker_parked"):
                        family.labels("audits.run_audit", reason).inc()
                os._exit(0)
            os.waitpid(pid, 0)
            made += 1
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        files = len(os.listdir(MULTIPROC_DIR))
        mp_scrape = per_scrape_ms(lambda registry=registry: generate_latest(registry))
        print(
            f"  multiprocess, {files:3d} process files     {mp_scrape:8.2f}"
            f"   {mp_scrape / redis_scrape:.2f}x Redis"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
