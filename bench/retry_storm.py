#!/usr/bin/env python
"""Retry storm: the old fixed retry policy against the new one, on a downstream that slows, then fails.

    .venv/bin/python bench/retry_storm.py                 # old vs new, about 3 minutes
    .venv/bin/python bench/retry_storm.py --flush-redis --dashboard docs/images/retry-storm-dashboard.png

What it starts: a downstream HTTP server on 127.0.0.1 (healthy, then slow, then answering
503 for a while, then healthy again), a database of its own (DATABASE_URL's name plus
`_bench`, created and dropped like the test suite's), and real `celery worker`
subprocesses on the Redis at REDIS_URL. That Redis database is emptied between runs:
the script refuses one that holds keys unless given --flush-redis.

Each run submits the same N unique audits at a steady rate into the same downstream
timeline and waits until every audit has finished (succeeded or dead-lettered). Runs:

  old     1 s doubling, no jitter, no breaker, 5 attempts
          (RETRY_JITTER=false, BREAKER_ENABLED=false)
  new     the defaults: jittered backoff, breaker per task type and host, 5 attempts,
          PAGE_FETCH_PER_HOST_CONCURRENCY slots per host
  unslotted  new without the page-fetch slots (--runs old,unslotted,new)

--make-run starts the audits workers as `make run` does (AUDITS_WORKER_PROCESSES workers of
AUDITS_WORKER_POOL x AUDITS_WORKER_CONCURRENCY); without it, --workers x --concurrency of
the worker's default pool, as the earlier measurements ran.

Reported per run, all from the downstream's own request log and the database: requests
per unique job, retries (requests beyond each job's first) as their own count, jobs
that succeeded, time until the backlog drained, and the peak requests in any one second,
over the whole run and after the outage. Before the runs it also prints how each jitter
spreads a cohort of retries that failed at the same instant, without workers: Plumb's
own (jobs.policy.delay) and none, against the variants it did not choose (bench/jitter.py).

With --dashboard FILE the runs share one dashboard: the metrics (`metrics:*` keys) are
kept between runs, the runs are --gap seconds apart (default 240) so each has its own
minutes on the hour's plots, and at the end the script serves the app on 127.0.0.1,
logs in as a staff user it creates in the bench database and saves the top of the
dashboard (headline, completions vs retry attempts, downstream requests per unique job)
as a PNG. Needs Debian's chromium and the dev extra's playwright, as `make test` does.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Like `make test`: the development setup, with its generated SECRET_KEY.
os.environ.setdefault("DEBUG", "true")

import django  # noqa: E402

django.setup()

import redis  # noqa: E402
from django.conf import settings  # noqa: E402

from audits import submission  # noqa: E402
from audits.models import Audit, Page  # noqa: E402
from bench import jitter  # noqa: E402
from bench.inprocess import own_stores  # noqa: E402
from bench.services import QuietHandler  # noqa: E402
from jobs.models import CircuitBreaker, DeadLetter  # noqa: E402
from jobs.policy import RetryPolicy, delay, exponential  # noqa: E402
from observability.metrics import TASK_RETRIES, read_counter  # noqa: E402
from outbound.urls import normalize_url  # noqa: E402
from tests.screenshot import dashboard_page, missing_browser, screenshot  # noqa: E402
from tests.workers import WorkerProcess  # noqa: E402

POLICIES = {
    "old": {"RETRY_JITTER": "false", "BREAKER_ENABLED": "false"},
    "new": {},
    # The new policy without per-host slots for page fetches (as before they existed).
    "unslotted": {"PAGE_FETCH_PER_HOST_CONCURRENCY": "0"},
}
# Compared unless --only or --runs says otherwise.
DEFAULT_RUNS = ["old", "new"]
COMMON_WORKER_ENV = {
    "RETRY_BACKOFF_BASE_SECONDS": "1",
    "AUDIT_MAX_ATTEMPTS": "5",
    # Slow answers (up to --slow-max) time out part of the time.
    "AUDIT_FETCH_TIMEOUT_SECONDS": "2",
}


# --- the downstream -------------------------------------------------------------
class Downstream(ThreadingHTTPServer):
    """healthy -> slow -> failing (503) -> healthy, on a clock started by `begin()`."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(self, args):
        super().__init__(("127.0.0.1", 0), DownstreamHandler)
        self.args = args
        self.started: float | None = None
        self.lock = threading.Lock()
        self.requests: list[tuple[float, str]] = []
        self.rng = random.Random(7)

    def handle_error(self, request, client_address):
        pass  # clients time out on slow answers; that is the point

    def begin(self) -> None:
        self.started = time.monotonic()

    def phase(self, elapsed: float) -> str:
        if elapsed < self.args.slow_at:
            return "healthy"
        if elapsed < self.args.fail_at:
            return "slow"
        if elapsed < self.args.recover_at:
            return "failing"
        return "healthy"

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class DownstreamHandler(QuietHandler):
    def do_GET(self):
        server: Downstream = self.server
        elapsed = time.monotonic() - server.started
        with server.lock:
            server.requests.append((elapsed, self.path))
            latency = server.rng.uniform(server.args.slow_min, server.args.slow_max)
        phase = server.phase(elapsed)
        if phase == "failing":
            self.send_html(503, b"down for now")
            return
        if phase == "slow":
            time.sleep(latency)
        self.send_html(
            200, b"<!doctype html><html><head><title>Job</title></head><body>ok</body></html>"
        )


# --- one run ----------------------------------------------------------------------
@dataclass
class RunResult:
    name: str
    jobs: int
    requests: int
    retries: int
    requests_per_job: float
    succeeded: int
    failed: int
    drain_seconds: float
    peak_per_second: int
    peak_per_second_after_outage: int
    parked: int
    breaker_opened: int
    succeeded_jobs: list[int] = field(repr=False)
    requests_by_second: list[int] = field(repr=False)


def reset_state(client: redis.Redis, *, keep_metrics: bool = False) -> None:
    if keep_metrics:
        # Everything but the dashboard's minutes and the metric totals.
        doomed = [key for key in client.scan_iter(count=1000) if not key.startswith(b"metrics:")]
        for start in range(0, len(doomed), 500):
            client.delete(*doomed[start : start + 500])
    else:
        client.flushdb()
    for model in (DeadLetter, CircuitBreaker, Audit, Page):
        model.objects.all().delete()


def breaker_parks() -> float:
    """Audits parked by an open breaker so far (plumb_task_retries_total{reason=breaker_parked})."""
    return read_counter(TASK_RETRIES).get(("audits.run_audit", "breaker_parked"), 0.0)


def run(name: str, env: dict, args, client: redis.Redis) -> RunResult:
    reset_state(client, keep_metrics=bool(args.dashboard))
    parks_before = breaker_parks()
    downstream = Downstream(args)
    threading.Thread(target=downstream.serve_forever, daemon=True).start()
    workers = [
        WorkerProcess(
            "audits",
            concurrency=args.concurrency,
            pool=args.pool,
            env={**COMMON_WORKER_ENV, **env},
        )
        for _ in range(args.workers)
    ]
    try:
        for worker in workers:
            worker.start(timeout=60)
        print(f"[{name}] workers up; submitting {args.jobs} audits at {args.rate}/s", flush=True)
        downstream.begin()
        audit_ids: dict[str, int] = {}
        for index in range(args.jobs):
            due = index / args.rate
            time.sleep(max(0.0, due - (time.monotonic() - downstream.started)))
            audit = submission.submit_audit(normalize_url(f"{downstream.base_url}/job/{index}"))
            audit_ids[str(audit.id)] = index
        deadline = time.monotonic() + args.timeout
        while Audit.objects.exclude(status__in=Audit.FINISHED).exists():
            if time.monotonic() > deadline:
                left = Audit.objects.exclude(status__in=Audit.FINISHED).count()
                raise SystemExit(f"[{name}] {left} audits unfinished after {args.timeout}s")
            time.sleep(0.2)
        drained = time.monotonic() - downstream.started
    finally:
        for worker in workers:
            worker.stop()
            if args.worker_log:
                with args.worker_log.open("a") as log_file:
                    log_file.write(f"===== {name} {worker.name}\n" + "".join(worker.lines))
        downstream.shutdown()
        downstream.server_close()

    requests = downstream.requests
    per_second = Counter(int(elapsed) for elapsed, _ in requests)
    after = [count for second, count in per_second.items() if second >= args.recover_at]
    succeeded = sorted(
        audit_ids[str(audit_id)]
        for audit_id in Audit.objects.filter(status="succeeded").values_list("id", flat=True)
    )
    unique_paths = {path for _, path in requests}
    return RunResult(
        name=name,
        jobs=args.jobs,
        requests=len(requests),
        retries=len(requests) - len(unique_paths),
        requests_per_job=round(len(requests) / args.jobs, 2),
        succeeded=len(succeeded),
        failed=Audit.objects.filter(status="failed").count(),
        drain_seconds=round(drained, 1),
        peak_per_second=max(per_second.values()),
        peak_per_second_after_outage=max(after, default=0),
        parked=int(breaker_parks() - parks_before),
        breaker_opened=sum(
            CircuitBreaker.objects.filter(task_name="audits.run_audit").values_list(
                "times_opened", flat=True
            )
        ),
        succeeded_jobs=succeeded,
        requests_by_second=[per_second.get(s, 0) for s in range(max(per_second) + 1)],
    )


# --- the dashboard after the runs ---------------------------------------------------
def photograph_dashboard(out: Path) -> Path:
    """Serve the app from this process, log in as staff and save the dashboard."""
    from django.contrib.auth import get_user_model
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.test.testcases import LiveServerThread

    password = uuid.uuid4().hex
    get_user_model().objects.create_user("bench", password=password, is_staff=True)
    server = LiveServerThread("127.0.0.1", StaticFilesHandler, port=0)
    server.daemon = True
    server.start()
    server.is_ready.wait()
    if server.error:
        raise server.error
    try:
        with dashboard_page(f"http://127.0.0.1:{server.port}", "bench", password) as page:
            return screenshot(page, out, rows=2)
    finally:
        server.terminate()


# --- jitter spread without workers --------------------------------------------------
def cohort_spread(cohort: int = 1000) -> list[dict]:
    """How each jitter spreads `cohort` retries of tasks that failed at the same instant."""
    rows = []
    rng = random.Random(42)
    base, cap = 1.0, 60.0
    policy = RetryPolicy(backoff_base=lambda: base, backoff_max=lambda: cap)
    jitters = {
        "none": lambda step, **_: exponential(step, base=base, cap=cap),
        **jitter.VARIANTS,
        "multiplicative": lambda step, rng, **_: delay(policy, step=step, rng=rng),
    }
    for attempt, label in [(3, "attempt 3 (4 s)"), (5, "attempt 5 (16 s)"), (30, "at the cap")]:
        for name, draw in jitters.items():
            previous = min(cap, base * 2 ** (attempt - 2))
            delays = [
                draw(attempt, base=base, cap=cap, previous=previous, rng=rng) for _ in range(cohort)
            ]
            buckets = Counter(int(wait) for wait in delays)
            rows.append(
                {
                    "when": label,
                    "jitter": name,
                    "peak_in_one_second": max(buckets.values()),
                    "mean_delay": round(sum(delays) / cohort, 1),
                    "shortest": round(min(delays), 2),
                }
            )
    return rows


# --- report -------------------------------------------------------------------------
def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(str(row[c])) for row in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row[c]).ljust(widths[c]) for c in columns))


RESULT_COLUMNS = [
    "name", "requests", "requests_per_job", "retries", "succeeded", "failed",
    "drain_seconds", "peak_per_second", "peak_per_second_after_outage", "parked",
    "breaker_opened",
]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=200, help="unique audits per run")
    parser.add_argument("--rate", type=float, default=5.0, help="submissions per second")
    parser.add_argument("--slow-at", type=float, default=4.0)
    parser.add_argument("--fail-at", type=float, default=10.0)
    parser.add_argument("--recover-at", type=float, default=34.0)
    parser.add_argument("--slow-min", type=float, default=0.5, help="slow answer, seconds")
    parser.add_argument("--slow-max", type=float, default=3.0)
    parser.add_argument("--workers", type=int, default=1, help="worker processes groups")
    parser.add_argument("--concurrency", type=int, default=8, help="pool processes per worker")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to drain, per run")
    parser.add_argument("--only", choices=sorted(POLICIES), help="run one policy (no comparison)")
    parser.add_argument(
        "--runs", default=",".join(DEFAULT_RUNS), help="policies to run, in order (old,new)"
    )
    parser.add_argument("--pool", help="the audits workers' pool (default: the worker's own)")
    parser.add_argument(
        "--make-run", action="store_true", help="audits workers as make run starts them"
    )
    parser.add_argument("--flush-redis", action="store_true", help="empty a Redis that has keys")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--worker-log", type=Path, help="append the workers' output here")
    parser.add_argument("--dashboard", type=Path, help="save the dashboard after the runs here")
    parser.add_argument(
        "--gap", type=float, default=240.0, help="seconds between runs (--dashboard)"
    )
    args = parser.parse_args()
    if args.make_run:
        args.workers = settings.AUDITS_WORKER_PROCESSES
        args.pool = settings.AUDITS_WORKER_POOL
        args.concurrency = settings.AUDITS_WORKER_CONCURRENCY
    if args.dashboard and (reason := missing_browser()):
        print(f"--dashboard needs a browser: {reason}")
        return 2

    logging.getLogger("audits").setLevel(logging.WARNING)  # one line per submission otherwise
    # Emptied, so the dashboard shows these runs only.
    with own_stores("bench", flush=args.flush_redis, flag="--flush-redis") as client:
        print("Jitter spread of 1000 retries that failed at the same instant (base 1 s, cap 60 s):")
        spread = cohort_spread()
        print_table(spread, ["when", "jitter", "peak_in_one_second", "mean_delay", "shortest"])
        print()

        names = [args.only] if args.only else args.runs.split(",")
        runs = {name: POLICIES[name] for name in names}
        results: list[RunResult] = []
        for number, (name, env) in enumerate(runs.items()):
            if number and args.dashboard:
                print(f"(a {args.gap:g} s gap, so the dashboard shows the runs apart)", flush=True)
                time.sleep(args.gap)
            results.append(run(name, env, args, client))
            print_table([asdict(results[-1])], RESULT_COLUMNS)
        if args.dashboard:
            print(f"dashboard saved to {photograph_dashboard(args.dashboard)}")

    print(
        f"\n{args.jobs} jobs at {args.rate}/s; downstream slow from {args.slow_at:g} s, "
        f"503 from {args.fail_at:g} s to {args.recover_at:g} s; "
        f"{args.workers} worker(s) x {args.concurrency} {args.pool or 'pool'} slots.\n"
    )
    print_table([asdict(r) for r in results], RESULT_COLUMNS)
    if args.json:
        args.json.write_text(
            json.dumps({"spread": spread, "runs": [asdict(r) for r in results]}, indent=2)
        )
    by_name = {result.name: result for result in results}
    if "old" not in by_name or "new" not in by_name:
        return 0
    old, new = by_name["old"], by_name["new"]
    lost = sorted(set(old.succeeded_jobs) - set(new.succeeded_jobs))
    peak_ratio = new.peak_per_second_after_outage / max(1, old.peak_per_second_after_outage)
    goals = [
        ("new policy: at most 1.3 requests per unique job", new.requests_per_job <= 1.3),
        ("no job the old policy completed is lost", not lost),
        (f"peak after the outage at most half the old one's ({peak_ratio:.2f})", peak_ratio <= 0.5),
    ]
    print(
        f"\nratios: requests per job new/old {new.requests_per_job / old.requests_per_job:.2f}, "
        f"retries new/old {new.retries / max(1, old.retries):.2f}, "
        f"peak after outage new/old {peak_ratio:.2f}, "
        f"drain time new/old {new.drain_seconds / old.drain_seconds:.2f}"
    )
    for goal, met in goals:
        print(f"  [{'x' if met else ' '}] {goal}")
    if lost:
        print(f"  lost jobs: {lost}")
    return 0 if all(met for _, met in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
