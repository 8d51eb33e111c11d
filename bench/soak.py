#!/usr/bin/env python
"""Soak: steady submissions plus bursts, a flaky downstream, a worker SIGKILLed every minute.

    .venv/bin/python bench/soak.py                # 10 minutes of load, then the drain
    .venv/bin/python bench/soak.py --minutes 2    # a shorter run

What it starts, all on 127.0.0.1: a throwaway redis-server (or the Redis at REDIS_URL,
which it empties), a fresh PostgreSQL database next to DATABASE_URL's (the local server
when DATABASE_URL is not set; dropped afterwards), a downstream site, and the stack as
`make run` starts it (the same command lines, from `runstack`): gunicorn, beat and two
audits workers, so one can be killed while the other works.

The load, for --minutes:
  steady   --rate submissions per second through POST /api/audits, spread over
           --clients addresses (X-Forwarded-For behind one trusted proxy), a rate the
           workers can sustain;
  bursts   every --burst-every seconds, --burst-clients new addresses submitting at
           once (enough to fill the backlog: refused_backlog) and one address
           submitting --burst-per-client times in a row (refused_ip);
  faults   the downstream answers 503 to about 5 % of requests, hangs past the fetch
           timeout on about 1 %, and is down (503) for 20 s every 3 minutes, which
           opens the breaker; every --kill-every seconds one audits worker (its main
           process and pool children) is SIGKILLed and started again, as a supervisor
           would.

Then it stops the load and waits for every admitted audit to finish. Reported:
submitted, admitted, refused by reason, completed, failed (each dead-lettered),
lost (admitted, but neither finished nor dead-lettered: must be 0), p50/p99
submission latency (steady and burst), and the peak resident memory of each process of the stack.
Exit status 1 if anything was lost.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.services import (  # noqa: E402
    QuietHandler,
    SessionProcess,
    create_database,
    rss_kib,
    start_redis,
)
from config import devservices  # noqa: E402

# Settings of the stack under soak (each an environment variable of docs/configuration.md).
STACK_ENV = {
    "DEBUG": "true",
    "AUDIT_ALLOW_PRIVATE_TARGETS": "true",  # the downstream is on 127.0.0.1
    "TRUSTED_PROXY_COUNT": "1",  # the soak's clients arrive "through" one proxy
    "AUDIT_FETCH_TIMEOUT_SECONDS": "5",
    # A killed worker's audits come back after this long (kombu restores unacked
    # messages past their visibility timeout); the default is 300 s.
    "AUDITS_VISIBILITY_TIMEOUT_SECONDS": "60",
    # A message popped by a worker killed before it recorded it as unacked is gone
    # (kombu's Redis transport has that window): the reconciler publishes the audit
    # again after this long (default 600 s; above the 65 s hard time limit here).
    "RECONCILE_AFTER_SECONDS": "120",
    "AUDITS_WORKER_CONCURRENCY": "4",
    # Two, whatever the cores: one is killed while the other works.
    "AUDITS_WORKER_PROCESSES": "2",
    "WEB_CONCURRENCY": "2",
    "LOG_LEVEL": "INFO",
}
OUTAGE_EVERY, OUTAGE_SECONDS = 180.0, 20.0
FAIL_SHARE, HANG_SHARE, HANG_SECONDS = 0.05, 0.01, 8.0


# --- the downstream -----------------------------------------------------------------
class Downstream(ThreadingHTTPServer):
    """Pages without links; 503 now and then, a hang now and then, a regular outage."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(self):
        super().__init__(("127.0.0.1", 0), DownstreamHandler)
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.answers: Counter = Counter()
        self.rng = random.Random(11)

    def handle_error(self, request, client_address):
        pass  # a hung request's client gives up: expected

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def answer_for(self) -> str:
        elapsed = time.monotonic() - self.started
        with self.lock:
            draw = self.rng.random()
        if elapsed % OUTAGE_EVERY > OUTAGE_EVERY - OUTAGE_SECONDS:
            return "outage"
        if draw < FAIL_SHARE:
            return "503"
        if draw < FAIL_SHARE + HANG_SHARE:
            return "hang"
        return "200"


class DownstreamHandler(QuietHandler):
    def do_GET(self):
        server: Downstream = self.server
        answer = server.answer_for()
        with server.lock:
            server.answers[answer] += 1
        if answer == "hang":
            time.sleep(HANG_SECONDS)
        if answer in ("503", "outage"):
            self.send_html(503, b"unavailable for now")
        else:
            self.send_html(200, b"<!doctype html><html lang=en><head><title>Page</title></head>"
                            b"<body><h1>Page</h1><p>Soak.</p></body></html>")  # fmt: skip


# --- the stack ------------------------------------------------------------------------
class MemorySampler(threading.Thread):
    """The peak RSS per role: of its main process, of any one other process, of the group."""

    def __init__(self, processes: list[SessionProcess], extra: dict[str, int]):
        super().__init__(daemon=True)
        self.processes, self.extra = processes, extra
        self.peaks: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(1.0):
            for process in self.processes:
                main = process.popen.pid
                sizes = {pid: rss_kib(pid) for pid in process.pids()}
                peak = self.peaks[process.name]
                peak["main"] = max(peak["main"], sizes.get(main, 0))
                children = [size for pid, size in sizes.items() if pid != main]
                peak["child"] = max(peak["child"], max(children, default=0))
                peak["group"] = max(peak["group"], sum(sizes.values()))
            for role, pid in self.extra.items():
                peak = self.peaks[role]
                peak["main"] = peak["group"] = max(peak["main"], rss_kib(pid))


# --- the load -------------------------------------------------------------------------
class Load:
    """Submits audits and records every answer: outcome, latency, the audit id if admitted."""

    def __init__(self, api: str, downstream: Downstream):
        import httpx

        self.api, self.downstream = api, downstream
        self.client = httpx.Client(timeout=30, limits=httpx.Limits(max_connections=64))
        self.pool = ThreadPoolExecutor(max_workers=48)
        self.lock = threading.Lock()
        self.outcomes: Counter = Counter()
        self.latencies: dict[str, list[float]] = {"steady": [], "burst": []}
        self.admitted: list[str] = []
        self.number = 0

    def submit(self, client_ip: str, *, kind: str = "steady") -> None:
        with self.lock:
            self.number += 1
            number = self.number
        url = f"{self.downstream.base_url}/page/{number}"
        self.pool.submit(self._submit, client_ip, url, kind)

    def _submit(self, client_ip: str, url: str, kind: str) -> None:
        began = time.perf_counter()
        try:
            response = self.client.post(
                f"{self.api}/api/audits", json={"url": url}, headers={"X-Forwarded-For": client_ip}
            )
        except Exception as exc:  # a refused connection is an outcome, not a crash
            outcome, audit_id = f"error: {exc.__class__.__name__}", None
        else:
            outcome, audit_id = classify(response)
        elapsed = time.perf_counter() - began
        with self.lock:
            self.outcomes[outcome] += 1
            self.latencies[kind].append(elapsed)
            if audit_id:
                self.admitted.append(audit_id)

    def drain(self) -> None:
        self.pool.shutdown(wait=True)
        self.client.close()


def classify(response) -> tuple[str, str | None]:
    if response.status_code == 202:
        return "admitted", response.json()["id"]
    if response.status_code == 429:
        return "refused_ip", None
    try:
        code = response.json().get("error", "")
    except ValueError:
        code = ""
    if response.status_code == 503 and code == "backlog_full":
        return "refused_backlog", None
    return f"error: HTTP {response.status_code} {code}".rstrip(), None


def run_load(load: Load, args, workers: list[SessionProcess], stop_at: float) -> list[float]:
    """Steady submissions, bursts and kills until `stop_at`; returns when each kill happened."""
    started = time.monotonic()
    next_submit = started
    next_burst = started + args.burst_every / 2
    next_kill = started + args.kill_every
    kills: list[float] = []
    victim = 0
    burst_number = 0
    steady = 0
    while (now := time.monotonic()) < stop_at:
        if now >= next_submit:
            load.submit(f"10.0.{steady % args.clients // 250}.{steady % args.clients % 250 + 1}")
            steady += 1
            next_submit += 1 / args.rate
        if now >= next_burst:
            burst_number += 1
            for index in range(args.burst_clients):
                ip = f"10.{burst_number % 250 + 1}.{index // 250}.{index % 250 + 1}"
                load.submit(ip, kind="burst")
            for _ in range(args.burst_per_client):
                load.submit(f"172.16.{burst_number % 250}.1", kind="burst")
            next_burst += args.burst_every
        if now >= next_kill:
            worker = workers[victim % len(workers)]
            worker.kill()
            kills.append(now - started)
            print(f"  {now - started:6.0f} s  SIGKILL {worker.name}", flush=True)
            # Started again by a supervisor a moment later; the load does not wait for it.
            threading.Timer(args.restart_after, worker.start).start()
            victim += 1
            next_kill += args.kill_every
        time.sleep(max(0.0, min(next_submit, next_burst, next_kill) - time.monotonic()))
    return kills


# --- the accounting -----------------------------------------------------------------
def account(admitted: list[str]) -> dict:
    from audits.models import Audit
    from jobs.models import DeadLetter

    rows = {
        str(audit_id): status
        for audit_id, status in Audit.objects.filter(id__in=admitted).values_list("id", "status")
    }
    statuses = Counter(rows.get(audit_id) for audit_id in admitted)
    dead = set(
        DeadLetter.objects.filter(task_name="audits.run_audit").values_list("task_id", flat=True)
    )
    dead_audits = {
        str(audit_id)
        for audit_id in Audit.objects.filter(id__in=admitted, task_id__in=dead).values_list(
            "id", flat=True
        )
    }
    unfinished = [
        audit_id
        for audit_id in admitted
        if rows.get(audit_id) not in Audit.FINISHED and audit_id not in dead_audits
    ]
    return {
        "completed": statuses.get("succeeded", 0),
        "failed": statuses.get("failed", 0),
        "dead_lettered": len(dead_audits),
        "lost": len(unfinished),
        "lost_ids": unfinished[:20],
        "attempts": sum(Audit.objects.filter(id__in=admitted).values_list("attempts", flat=True)),
        "run_more_than_once": Audit.objects.filter(id__in=admitted, attempts__gt=1).count(),
    }


def wait_for_drain(admitted: list[str], timeout: float) -> float:
    from audits.models import Audit

    began = time.monotonic()
    while time.monotonic() - began < timeout:
        left = Audit.objects.filter(id__in=admitted).exclude(status__in=Audit.FINISHED).count()
        missing = len(admitted) - Audit.objects.filter(id__in=admitted).count()
        if not left and not missing:
            break
        time.sleep(2)
    return time.monotonic() - began


def percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def report(results: dict) -> None:
    outcomes = results["outcomes"]
    print()
    rows = [
        ("load", f"{results['minutes']:g} min; {results['kills']} SIGKILLs"),
        ("submitted", results["submitted"]),
        ("admitted", outcomes.get("admitted", 0)),
        ("refused: ip bucket (429)", outcomes.get("refused_ip", 0)),
        ("refused: backlog full (503)", outcomes.get("refused_backlog", 0)),
    ]
    rows += [(f"other answer: {k}", v) for k, v in outcomes.items() if k.startswith("error")]
    rows += [
        ("completed (succeeded)", results["completed"]),
        ("failed, each dead-lettered", f"{results['failed']} ({results['dead_lettered']} dead letters)"),
        ("lost", results["lost"]),
        ("audits run more than once (redelivered, retried)", results["run_more_than_once"]),
        ("attempts per admitted audit", f"{results['attempts_per_audit']:.2f}"),
        ("drain after the load stopped", f"{results['drain_seconds']:.0f} s"),
        ("submission latency p50 / p99, steady", "{:.0f} ms / {:.0f} ms".format(*results["latency_ms"]["steady"])),
        ("submission latency p50 / p99, bursts", "{:.0f} ms / {:.0f} ms".format(*results["latency_ms"]["burst"])),
        ("submission latency p50 / p99, all", "{:.0f} ms / {:.0f} ms".format(*results["latency_ms"]["all"])),
        ("downstream answers", ", ".join(f"{k} {v}" for k, v in sorted(results["downstream"].items()))),
    ]  # fmt: skip
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    print("\npeak resident memory (MiB): main process / largest other process / whole group")
    for role, peak in sorted(results["memory_kib"].items()):
        cells = [f"{peak.get(k, 0) / 1024:6.1f}" for k in ("main", "child", "group")]
        print(f"  {role:<16} {' / '.join(cells)}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the load runs")
    parser.add_argument("--rate", type=float, default=4.0, help="steady submissions per second")
    parser.add_argument("--clients", type=int, default=100, help="addresses of the steady load")
    parser.add_argument("--burst-every", type=float, default=60.0, help="seconds between bursts")
    parser.add_argument("--burst-clients", type=int, default=300)
    parser.add_argument("--burst-per-client", type=int, default=40)
    parser.add_argument("--backlog-max", type=int, default=100, help="AUDIT_QUEUE_MAX_DEPTH")
    parser.add_argument("--kill-every", type=float, default=60.0, help="seconds between SIGKILLs")
    parser.add_argument(
        "--restart-after", type=float, default=2.0, help="seconds a killed worker stays down"
    )
    parser.add_argument("--drain-timeout", type=float, default=600.0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()  # fmt: skip

    redis_process, redis_url = start_redis()
    database_url, drop_database = create_database(sqlite_fallback=False)
    logs = Path(tempfile.mkdtemp(prefix="plumb-soak-"))
    env = {
        **os.environ, **STACK_ENV, "REDIS_URL": redis_url, "DATABASE_URL": database_url,
        "AUDIT_QUEUE_MAX_DEPTH": str(args.backlog_max), "WEB_PORT": str(devservices.free_port()),
    }  # fmt: skip
    os.environ.update(env)
    processes: list[SessionProcess] = []
    downstream = Downstream()
    threading.Thread(target=downstream.serve_forever, daemon=True).start()
    try:
        import django

        django.setup()
        import redis
        from django.conf import settings
        from django.core.management import call_command

        from devstack.management.commands.runstack import stack_commands

        redis.Redis.from_url(redis_url).flushdb()
        call_command("migrate", interactive=False, verbosity=0)
        commands = stack_commands()
        wanted = {
            name: command
            for name, command in commands.items()
            if name in ("web", "beat") or name.startswith("worker-audits")
        }
        processes = [SessionProcess(role, command, env, logs) for role, command in wanted.items()]
        for process in processes:
            process.start()
        api = f"http://{settings.WEB_HOST}:{settings.WEB_PORT}"
        wait_until_up(api, logs)
        extra = {"soak (this script)": os.getpid()}
        if redis_process is not None:
            extra["redis-server"] = redis_process.pid
        sampler = MemorySampler(processes, extra)
        sampler.start()
        print(f"stack up (logs in {logs}); load for {args.minutes:g} min", flush=True)

        load = Load(api, downstream)
        workers = [p for p in processes if p.name.startswith("worker-audits")]
        kills = run_load(load, args, workers, time.monotonic() + args.minutes * 60)
        load.drain()
        print(f"load done: {len(load.admitted)} admitted; waiting for the drain", flush=True)
        drained = wait_for_drain(load.admitted, args.drain_timeout)
        sampler.stopped.set()
        sampler.join()

        results = {
            "minutes": args.minutes,
            "kills": len(kills),
            "submitted": sum(load.outcomes.values()),
            "outcomes": dict(load.outcomes),
            **account(load.admitted),
            "drain_seconds": drained,
            "latency_ms": {
                kind: [percentile(values, 0.5) * 1000, percentile(values, 0.99) * 1000]
                for kind, values in {
                    **load.latencies,
                    "all": load.latencies["steady"] + load.latencies["burst"],
                }.items()
            },
            "downstream": dict(downstream.answers),
            "memory_kib": {role: dict(peak) for role, peak in sampler.peaks.items()},
        }
        results["attempts_per_audit"] = results["attempts"] / max(1, len(load.admitted))
        report(results)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return 1 if results["lost"] else 0
    finally:
        for process in processes:
            if process.popen is not None:
                process.stop()
        downstream.shutdown()
        from django.db import connections

        connections.close_all()
        drop_database()
        if redis_process is not None:
            redis_process.terminate()
            redis_process.wait(timeout=10)


def wait_until_up(api: str, logs: Path, timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{api}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the stack did not come up within {timeout:g} s; see {logs}")


if __name__ == "__main__":
    sys.exit(main())
