#!/usr/bin/env python
"""A burst of webhook deliveries to a receiver that is down for its first seconds.

    DATABASE_URL=postgres://... REDIS_URL=redis://127.0.0.1:6379/9 .venv/bin/python bench/webhook_burst.py

Reproduces, scaled to one machine, the incident where a burst of failed
deliveries came back as waves and starved the database: N deliveries (default
6,000) are published within 20 s to one receiver on 127.0.0.1 that answers 503
for the first 20 s and 200 after. It runs three phases in one go, each with a
fresh `celery worker -Q webhooks -P threads` it starts itself and the same
database pool (10 connections, 10 s acquire timeout, as in the incident):

  healthy  the receiver always answers 200 (Plumb's settings): the throughput
           that defines the ideal drain time, outage + N / throughput
  naive    no concurrency cap (WEBHOOK_MAX_CONCURRENCY=0, no per-host limit),
           exact 2x backoff without jitter, no circuit breaker
  plumb    Plumb's defaults: 16 deliveries per process, 32 per host, ±25 % jitter,
           the receiver's breaker (its deliveries are parked while it is open)

and prints, per phase: deliveries completed, database pool timeouts, peak
concurrent requests at the receiver, arrivals per 5 s (first attempts, retries
and parked deliveries coming due) and the drain time.
Use a Redis database and a PostgreSQL database no running stack uses: the
bench deletes the webhooks queue keys and its own rows there (it migrates the
database first). `--deliveries 600` runs a smaller burst.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DEBUG", "true")

import django  # noqa: E402

from bench.services import ensure_database  # noqa: E402

ensure_database()
django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from audits.models import Audit, Page  # noqa: E402
from config.celery_app import app  # noqa: E402
from config.redis import redis_client  # noqa: E402
from jobs import breakers, delayed  # noqa: E402
from tests.receiver import Receiver  # noqa: E402
from webhooks.models import Delivery  # noqa: E402
from webhooks.tasks import deliver_webhook  # noqa: E402

BENCH_PAGE = "https://bench.invalid/webhook-burst"
SECRET = "whsec_" + "YmVuY2gtc2VjcmV0LWZvci13ZWJob29rLWJ1cnN0"  # base64 of 30 bytes
BUCKET_SECONDS = 5
# The incident's database side: 10 connections per process, a 10 s wait for one.
POOL = {"DB_POOL_MAX_SIZE": "10", "DB_POOL_TIMEOUT_SECONDS": "10"}
PHASES = {
    "healthy": {},
    "naive": {
        "WEBHOOK_MAX_CONCURRENCY": "0",
        "WEBHOOK_PER_HOST_CONCURRENCY": "0",
        "RETRY_JITTER": "false",
        "BREAKER_ENABLED": "false",
    },
    "plumb": {},
}
POOL_TIMEOUT_MARK = "couldn't get a connection"
RETRY_LINE = re.compile(r"^(\S+) INFO jobs\.task task\.retry .*? delay_seconds=([\d.]+)", re.M)
# A delivery parked by the destination's open breaker comes back when its delay is up.
PARKED_LINE = re.compile(r"^(\S+) INFO jobs\.task task\.parked .*? delay_seconds=([\d.]+)", re.M)


def reset() -> None:
    Audit.objects.filter(page__url=BENCH_PAGE).delete()  # cascades to deliveries
    client = redis_client()
    queue = settings.WEBHOOK_QUEUE
    keys = [queue, delayed.delayed_key(queue), delayed.leased_key(queue)]
    keys += [f"{k}:{queue}" for k in ("unacked", "unacked_index", "unacked_mutex")]
    keys += list(client.scan_iter("hostslots:webhooks:*"))
    keys += list(client.scan_iter(f"{breakers.KEY_PREFIX}{deliver_webhook.name}:*"))
    client.delete(*keys)


def create_deliveries(count: int, url: str) -> list[Delivery]:
    page, _ = Page.objects.get_or_create(
        url=BENCH_PAGE, defaults={"domain": "bench.invalid", "reaudit_nightly": False}
    )
    now = timezone.now()
    audits = Audit.objects.bulk_create(
        Audit(
            page=page,
            status=Audit.Status.SUCCEEDED,
            finished_at=now,
            result={"status_code": 200},
            callback_url=url,
            callback_secret=SECRET,
        )
        for _ in range(count)
    )
    return Delivery.objects.bulk_create(
        Delivery(audit=audit, url=url, task_id=str(uuid.uuid4())) for audit in audits
    )


class ReceiverProcess:
    """The receiver in its own process, so the publisher and it do not share one GIL.

    It answers 503 until `outage` seconds after `go()`, then 200; `finish()`
    returns its requests as (seconds since go, webhook-id, status) and its peak.
    """

    def __init__(self, *, outage: float, latency: float):
        context = multiprocessing.get_context("fork")
        self.pipe, child = context.Pipe()
        self.process = context.Process(target=self._serve, args=(child, outage, latency))
        self.process.start()
        self.url = self.pipe.recv()

    @staticmethod
    def _serve(pipe, outage: float, latency: float) -> None:
        server = Receiver(lambda at, number: 503 if at < outage else 200, hold_seconds=latency)
        pipe.send(server.url)
        pipe.recv()  # go
        server.start()
        pipe.recv()  # finish
        server.shutdown()
        with server.lock:
            requests = [(r.at, r.webhook_id, r.status) for r in server.requests]
        pipe.send((requests, server.peak_in_flight))

    def go(self) -> None:
        self.pipe.send("go")

    def finish(self) -> tuple[list[tuple[float, str, int]], int]:
        self.pipe.send("finish")
        result = self.pipe.recv()
        self.process.join(timeout=10)
        return result


class Worker:
    def __init__(self, env: dict[str, str], log_path: Path):
        self.log_path = log_path
        self.log = log_path.open("w")
        command = [
            sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", settings.WEBHOOK_QUEUE,
            "-n", f"bench-{uuid.uuid4().hex[:6]}@%h", "-P", "threads", "--loglevel", "INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, cwd=ROOT, env={**os.environ, **env}, stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 60
        while " ready." not in log_path.read_text(errors="replace"):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"worker did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> str:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        return self.log_path.read_text(errors="replace")


def run_phase(
    name: str, *, count: int, burst: float, outage: float, latency: float, limit: float, logs: Path
) -> dict:
    reset()
    receiver = ReceiverProcess(outage=outage if name != "healthy" else 0.0, latency=latency)
    rows = create_deliveries(count, receiver.url)
    env = {**POOL, **PHASES[name], "REDIS_URL": settings.REDIS_URL, "DEBUG": "true",
           "AUDIT_ALLOW_PRIVATE_TARGETS": "true", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    worker = Worker(env, logs / f"{name}.log")
    held = HeldSampler()
    receiver.go()  # t = 0: the burst starts now
    started, started_wall = time.monotonic(), time.time()
    spread = burst if name != "healthy" else 0.0
    first = Counter()  # first attempts published, per 5 s
    with app.producer_or_acquire() as producer:
        for index, row in enumerate(rows):
            due = started + spread * index / count
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            deliver_webhook.apply_async(args=[str(row.id)], task_id=row.task_id, producer=producer)
            first[int((time.monotonic() - started) // BUCKET_SECONDS)] += 1
            held.sample()
    published = time.monotonic() - started
    ids = [row.id for row in rows]
    drained = None
    while time.monotonic() - started < limit:
        held.sample()
        finished = Delivery.objects.filter(id__in=ids, status__in=Delivery.FINISHED).count()
        if finished == count:
            break
        time.sleep(0.5)
    delivered = Delivery.objects.filter(id__in=ids, status=Delivery.Status.DELIVERED).count()
    output = worker.stop()
    requests, peak = receiver.finish()
    if delivered == count:
        drained = max(at for at, _, status in requests if status == 200)
    return {
        "name": name,
        "delivered": delivered,
        "count": count,
        "requests": len(requests),
        "pool_timeouts": output.count(POOL_TIMEOUT_MARK),
        "peak": peak,
        "held": held.most,
        "first": first,
        "published": published,
        "retries": coming_due(RETRY_LINE, output, since=started_wall),
        "parked": coming_due(PARKED_LINE, output, since=started_wall),
        "served": Counter(int(at // BUCKET_SECONDS) for at, _, _ in requests),
        "drained": drained,
    }


class HeldSampler:
    """The most messages the worker held (taken, not yet acknowledged) at once, sampled."""

    def __init__(self):
        self.most = 0
        self.next_at = 0.0
        self.key = f"unacked:{settings.WEBHOOK_QUEUE}"

    def sample(self) -> None:
        if time.monotonic() >= self.next_at:
            self.most = max(self.most, redis_client().hlen(self.key))
            self.next_at = time.monotonic() + 0.1


def coming_due(line: re.Pattern, worker_log: str, *, since: float) -> Counter:
    """Retries (or parked deliveries) per 5 s by when they came due: each log line's time
    plus its delay."""
    due = Counter()
    for stamp, delay in line.findall(worker_log):
        at = datetime.fromisoformat(stamp).timestamp() + float(delay) - since
        due[int(at // BUCKET_SECONDS)] += 1
    return due


def healthy_throughput(result: dict) -> float:
    """Deliveries per second a healthy receiver gets: the median full 5 s of the backlog.

    The median, not N / total time: it leaves out the worker's first seconds and
    the last partial bucket, and a few seconds when another process took the CPU.
    """
    served = result["served"]
    full = [served[b] for b in range(max(served)) if b > 0] or list(served.values())
    return statistics.median(full) / BUCKET_SECONDS


def wave_ratio(result: dict, *, after: float) -> float:
    """The most attempts arriving in one 5 s after `after` seconds, over the mean per 5 s.

    Arrivals are attempts becoming runnable: first attempts as published,
    retries and parked deliveries as they come due. The mean runs from the burst's
    start to its drain.
    """
    arrivals = result["first"] + result["retries"] + result["parked"]
    if not arrivals:
        return 0.0
    end = result["drained"] or (max(arrivals) + 1) * BUCKET_SECONDS
    mean = sum(arrivals.values()) / (end / BUCKET_SECONDS)
    later = [n for bucket, n in arrivals.items() if (bucket + 1) * BUCKET_SECONDS > after]
    return max(later, default=0) / mean


def report(results: dict, *, count: int, outage: float, burst: float, cap: int) -> None:
    throughput = healthy_throughput(results["healthy"])
    ideal = outage + count / throughput
    # The first retries of the burst have all come due by then.
    first_step = burst + settings.WEBHOOK_BACKOFF_BASE_SECONDS * 1.25
    print(f"\nhealthy receiver: {throughput:.0f} deliveries/s (median 5 s);"
          f" ideal drain after a {outage:.0f} s outage: {outage:.0f} + {count} / {throughput:.0f}"
          f" = {ideal:.1f} s\n")  # fmt: skip
    rows = [
        ("burst published within", lambda r: f"{r['published']:.1f} s"),
        ("deliveries completed", lambda r: f"{r['delivered']} / {r['count']}"),
        ("requests at the receiver", lambda r: f"{r['requests']}"),
        ("deliveries parked by the open breaker", lambda r: f"{sum(r['parked'].values())}"),
        ("database pool timeouts", lambda r: f"{r['pool_timeouts']}"),
        ("peak concurrent deliveries (at the receiver)", lambda r: f"{r['peak']}"),
        ("most deliveries held by the worker", lambda r: f"{r['held']}"),
        ("busiest 5 s after the first backoff step / mean", lambda r: f"{wave_ratio(r, after=first_step):.2f}x"),
        ("time until all were delivered", lambda r: f"{r['drained']:.1f} s" if r["drained"] else "not reached"),
        ("drain time / ideal", lambda r: f"{r['drained'] / ideal:.2f}x" if r["drained"] else "-"),
    ]  # fmt: skip
    print(f"{'':50} {'naive':>14} {'plumb':>14}")
    for label, cell in rows:
        print(f"{label:50} {cell(results['naive']):>14} {cell(results['plumb']):>14}")
    print(f"(plumb's cap: {cap} per process)\n")
    print(
        "per 5 s: first attempts published + retries coming due + parked coming due"
        " | requests served by the receiver"
    )
    print(f"{'t (s)':>6} {'naive':>30} {'plumb':>30}")
    last = max(
        max(r["first"] + r["retries"] + r["parked"] + r["served"], default=0)
        for r in results.values()
    )
    for bucket in range(last + 1):
        cells = [
            f"{results[n]['first'][bucket]:>5} + {results[n]['retries'][bucket]:<5}"
            f" + {results[n]['parked'][bucket]:<5} | {results[n]['served'][bucket]:<5}"
            for n in ("naive", "plumb")
        ]
        print(f"{bucket * BUCKET_SECONDS:>6} {cells[0]:>30} {cells[1]:>30}")
    plumb = results["plumb"]
    goals = {
        "100 % delivered": plumb["delivered"] == count,
        "no pool timeouts": plumb["pool_timeouts"] == 0,
        "peak concurrency within the cap": plumb["peak"] <= cap,
        "no wave over 2x the mean after the first backoff step": wave_ratio(plumb, after=first_step) <= 2,
        "drain within 1.5x of ideal": bool(plumb["drained"]) and plumb["drained"] <= 1.5 * ideal,
    }  # fmt: skip
    print(
        "\nplumb's goals: "
        + ", ".join(f"{g}: {'met' if ok else 'MISSED'}" for g, ok in goals.items())
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=6000)
    parser.add_argument("--burst-seconds", type=float, default=20.0)
    parser.add_argument("--outage-seconds", type=float, default=20.0)
    parser.add_argument("--receiver-latency", type=float, default=0.02, help="seconds per request")
    parser.add_argument("--phase-limit", type=float, default=600.0, help="give up a phase after")
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        print("bench/webhook_burst.py measures a PostgreSQL pool: set DATABASE_URL=postgres://...")
        return 2
    call_command("migrate", interactive=False, verbosity=0)
    # The bench is the load, not the system under test: no task-sent event per publish.
    app.conf.task_send_sent_event = False
    began = time.monotonic()
    logs = Path(tempfile.mkdtemp(prefix="plumb-webhook-burst-"))
    results = {}
    for name in PHASES:
        print(f"phase {name} ...", flush=True)
        results[name] = run_phase(
            name, count=args.deliveries, burst=args.burst_seconds, outage=args.outage_seconds,
            latency=args.receiver_latency, limit=args.phase_limit, logs=logs,
        )  # fmt: skip
    reset()
    report(
        results, count=args.deliveries, outage=args.outage_seconds, burst=args.burst_seconds,
        cap=settings.WEBHOOK_MAX_CONCURRENCY,
    )  # fmt: skip
    print(f"\nworker logs: {logs}; whole run {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
