#!/usr/bin/env python
"""The capacity model at 1/100 scale: 100,000 pages across 1,000 domains in a compressed night.

    .venv/bin/python bench/capacity_sim.py                 # ~22 minutes here
    .venv/bin/python bench/capacity_sim.py --pages 20000 --domains 200 --window 300  # ~8

docs/capacity.md predicts, from figures measured on the machine, how long a night
takes and what it asks of Redis and PostgreSQL. This runs such a night and compares:

1. Calibrate (the model's inputs, measured here), two bursts drained flat out, each
   timed between its 5th and 95th percent finished: `--calibration` audits published at
   once (the audits/s `Ca` of a machine doing nothing else), then as many placements
   (`reaudit.place`, each creating and queueing its audit: the re-audits/s `Cb`). A
   placement costs `p` = Ca / Cb - 1 audits' worth of the machine. Each burst also
   gives Redis commands and PostgreSQL commits per audit and per placement.
2. Predict, before the night runs, from the fan-out's own slice sizes, second by
   second: a slice's placements arrive at slice_size / slice_seconds and fire as they
   arrive (at most Ca / p a second); the audits take what the placements leave, Ca -
   p x placements/s, and the rest queues until the window's placements are done.
   Predicted: the drain time (window opened to last audit finished), the audits/s
   during the window and after it, the peak audits/s, Redis commands/s and
   PostgreSQL commits/s (10 s means).
3. Run the night: `reaudit.fan_out` with a `--window` second window, 60 s slices, each
   domain's pages one window/pages-per-domain apart (its politeness), the stack as in
   production: the workers from `make run`'s own command lines (audits: one process per
   core, 32 threads each; reaudit: one process of 8 threads), on PostgreSQL. Sampled
   every second: audits finished, Redis commands (INFO), PostgreSQL commits and
   connections (pg_stat_database); CPU per role read from /proc over the whole night.

Every page is on a local site answering at once: `Page.domain` carries the domain the
night spaces and the breakers key on (d0.sim ... d999.sim), the URL the local port.
Needs PostgreSQL (DATABASE_URL, or the local server); Redis is a throwaway server.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from bench.services import (  # noqa: E402
    SessionProcess,
    cpu_seconds,
    create_database,
    machine_busy_seconds,
    pids_named,
    start_redis,
)
from bench.throughput import stack_commands, start_site  # noqa: E402
from tests.workers import wait_for  # noqa: E402

DAY = date(2031, 3, 1)
CALIBRATION_DAY = date(2031, 2, 28)
SLICE_SECONDS = 60


class Sampler(threading.Thread):
    """Once a second: finished audits, Redis commands, PostgreSQL commits and connections."""

    def __init__(self, redis_url: str, database_url: str):
        super().__init__(daemon=True)
        import psycopg

        self.redis = redis.Redis.from_url(redis_url)
        self.db = psycopg.connect(database_url, autocommit=True)
        self.samples: list[dict] = []
        self.stopped = threading.Event()

    def read(self) -> dict:
        commands = self.redis.info("stats")["total_commands_processed"]
        commits, backends = self.db.execute(
            "SELECT xact_commit, numbackends FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        # Every placement creates its audit: rows created are placements fired.
        finished, created = self.db.execute(
            "SELECT count(*) FILTER (WHERE status IN ('succeeded', 'failed')), count(*) "
            "FROM audits_audit"
        ).fetchone()
        return {"t": time.time(), "redis_commands": commands, "commits": commits,
                "connections": backends, "finished": finished, "created": created}  # fmt: skip

    def run(self) -> None:
        while not self.stopped.wait(1.0):
            self.samples.append(self.read())

    def stop(self) -> list[dict]:
        self.stopped.set()
        self.join()
        return self.samples


def rates(samples: list[dict], key: str) -> list[float]:
    return [
        (b[key] - a[key]) / (b["t"] - a["t"]) for a, b in zip(samples, samples[1:], strict=False)
    ]


def peak(values: list[float], seconds: int = 10) -> float:
    """The highest mean over `seconds` consecutive samples: a peak, not a one-second spike."""
    if len(values) < seconds:
        return max(values, default=0.0)
    return max(sum(values[i : i + seconds]) / seconds for i in range(len(values) - seconds + 1))


class CpuMeter:
    """CPU-seconds spent so far by each role of the stack, and by the whole machine."""

    def __init__(self, workers: list[SessionProcess], redis_pid: int | None):
        self.workers, self.redis_pid = workers, redis_pid

    def read(self) -> dict[str, float]:
        def role(prefix: str) -> float:
            return sum(p.cpu_seconds() for p in self.workers if p.name.startswith(prefix))

        return {
            "audits workers": role("worker-audits"),
            "reaudit workers": role("reaudit"),
            "postgres": cpu_seconds(pids_named("postgres")),
            "redis": cpu_seconds([self.redis_pid]) if self.redis_pid else 0.0,
            "machine (every process)": machine_busy_seconds(),
        }

    def per_job_ms(self, before: dict[str, float], jobs: int) -> dict[str, float]:
        now = self.read()
        return {key: (now[key] - before[key]) * 1000 / jobs for key in now}


def burst(env: dict, sampler: Sampler, cpu: CpuMeter, code: str, count: int) -> dict:
    """Run `code` (which queues `count` audits) and time the drain between its 5th and 95th
    percent finished: neither the subprocess's start nor the last stragglers count."""
    before = sampler.read()
    cpu_before = cpu.read()
    readings: list[tuple[float, int]] = []

    def finished() -> bool:
        reading = sampler.read()
        readings.append((reading["t"], reading["finished"] - before["finished"]))
        return readings[-1][1] >= count

    thread = threading.Thread(target=django, args=(env, code))
    thread.start()
    wait_for(finished, timeout=900, message="a calibration burst", interval=0.25)
    thread.join()
    after = sampler.read()
    first = next(t for t, n in readings if n >= count * 0.05)
    last = next(t for t, n in readings if n >= count * 0.95)
    return {
        "per_second": count * 0.9 / (last - first),
        "redis_commands": (after["redis_commands"] - before["redis_commands"]) / count,
        "commits": (after["commits"] - before["commits"]) / count,
        "cpu_ms": cpu.per_job_ms(cpu_before, count),
    }


def predict_night(sizes: list[int], *, audit_rate: float, placement_cost: float) -> list[tuple]:
    """(audits, placements) finished in each second of a night, from its slice sizes.

    Placements fire as they arrive (at most audit_rate / placement_cost a second); the
    audits get the rest of the machine: audit_rate - placement_cost x placements.
    """
    most_placements = audit_rate / placement_cost if placement_cost > 0 else float("inf")
    owed_placements = queued_audits = 0.0
    remaining, seconds = float(sum(sizes)), []
    while remaining > 0.5 and len(seconds) < 100 * SLICE_SECONDS * max(1, len(sizes)):
        index = len(seconds) // SLICE_SECONDS
        owed_placements += sizes[index] / SLICE_SECONDS if index < len(sizes) else 0.0
        placed = min(owed_placements, most_placements)
        owed_placements -= placed
        queued_audits += placed
        audited = min(queued_audits, max(0.0, audit_rate - placement_cost * placed))
        queued_audits -= audited
        remaining -= audited
        seconds.append((audited, placed))
    return seconds


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def django(env: dict, code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()\n" + code],
        cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE": "config.settings"},
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip


INSERT_PAGES = """
from audits.models import Page
pages, domains, site = {pages}, {domains}, {site!r}
per_domain = pages // domains
batch = []
for n in range(pages):
    domain = n % domains
    batch.append(Page(url=f"{{site}}/d{{domain}}/p{{n // domains}}", domain=f"d{{domain}}.sim", reaudit_nightly=True))
    if len(batch) == 10000:
        Page.objects.bulk_create(batch); batch = []
Page.objects.bulk_create(batch)
"""

CALIBRATE_PLACEMENTS = """
from audits.models import Page
from reaudit.tasks import place
for page_id in Page.objects.order_by("id").values_list("id", flat=True)[:{count}]:
    place.apply_async(args=[page_id, "{day}"])
"""

# Audits alone: the rows first, then their messages, as a placement would queue them.
CALIBRATE_AUDITS = """
import uuid
from audits.models import Audit, Page
from audits.tasks import enqueue_audit
pages = Page.objects.order_by("id").values_list("id", flat=True)[{count}:{count} * 2]
audits = Audit.objects.bulk_create(
    Audit(page_id=page_id, trigger=Audit.Trigger.REAUDIT, task_id=str(uuid.uuid4()))
    for page_id in pages
)
for audit in audits:
    enqueue_audit(audit)
"""

FAN_OUT = """
import json
from reaudit.models import FanOut
from reaudit.tasks import fan_out
fan_out.apply_async(kwargs={{"day": "{day}", "window_seconds": {window}}})
"""

NIGHT = """
import json
from reaudit.models import FanOut
night = FanOut.objects.filter(day="{day}").first()
print(json.dumps(night and {{"slice_sizes": night.slice_sizes,
                             "window_start": night.window_start.timestamp()}}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pages", type=int, default=100_000)
    parser.add_argument("--domains", type=int, default=1_000)
    parser.add_argument("--window", type=int, default=900, help="seconds in the night window")
    parser.add_argument("--calibration", type=int, default=3_000, help="audits in the burst")
    parser.add_argument("--reaudit-workers", type=int, default=1,
                        help="reaudit worker processes")  # fmt: skip
    parser.add_argument("--reaudit-pool",
                        help="another pool for make run's reaudit worker, as celery worker "
                             "options: 'prefork --concurrency 1'")  # fmt: skip
    parser.add_argument("--audit-workers", type=int, default=os.cpu_count() or 1,
                        help="audits worker processes (default: one per core)")  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    logs = Path(tempfile.mkdtemp(prefix="plumb-capacity-"))
    print(f"logs in {logs}", flush=True)
    redis_process, redis_url = start_redis()
    database_url, drop = create_database(sqlite_fallback=False)
    site, base = start_site(logs, 0.0)
    per_domain = args.pages // args.domains
    env = {
        **os.environ, "DEBUG": "false", "SECRET_KEY": "capacity-simulation-" + "k" * 50,
        "AUDIT_ALLOW_PRIVATE_TARGETS": "true", "REDIS_URL": redis_url,
        "DATABASE_URL": database_url,
        # A threads worker's connections come from a pool, as docker-compose.yml runs it.
        "DB_POOL_MAX_SIZE": "8",
        "REAUDIT_SLICE_SECONDS": str(SLICE_SECONDS),
        "REAUDIT_DOMAIN_SPACING_SECONDS": str(args.window / per_domain),
    }  # fmt: skip
    workers: list[SessionProcess] = []
    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"],
                       cwd=ROOT, env=env, check=True)  # fmt: skip
        started = time.time()
        django(env, INSERT_PAGES.format(pages=args.pages, domains=args.domains, site=base))
        print(f"{args.pages:,} pages inserted in {time.time() - started:.0f} s", flush=True)

        # The workers as `make run` starts them: audits one per core, its threads each,
        # and the reaudit worker's threads, each of these named apart.
        commands = stack_commands({**env, "AUDITS_WORKER_PROCESSES": str(args.audit_workers)})
        for name, command in commands.items():
            if name.startswith("worker-audits"):
                workers.append(SessionProcess(name, command, env, logs).start())
        for n in range(1, args.reaudit_workers + 1):
            command = commands["worker-reaudit"].replace(" -n reaudit@%h", f" -n reaudit-{n}@%h")
            if args.reaudit_pool:  # the last --pool and --concurrency are the ones celery takes
                command += f" --pool {args.reaudit_pool}"
            workers.append(SessionProcess(f"reaudit-{n}", command, env, logs).start())
        sampler = Sampler(redis_url, database_url)
        time.sleep(5)  # the workers connect

        # 0. What an idle stack asks of Redis (pollers, waiting consumers) and PostgreSQL.
        idle_start = sampler.read()
        time.sleep(10)
        idle_end = sampler.read()
        idle = {
            key: (idle_end[key] - idle_start[key]) / (idle_end["t"] - idle_start["t"])
            for key in ("redis_commands", "commits")
        }
        # 1. Calibrate: audits alone, then placements (each with its audit), flat out.
        cpu = CpuMeter(workers, redis_process.pid if redis_process else None)
        audits = burst(env, sampler, cpu, CALIBRATE_AUDITS.format(count=args.calibration),
                       args.calibration)  # fmt: skip
        placements = burst(
            env, sampler, cpu,
            CALIBRATE_PLACEMENTS.format(count=args.calibration, day=CALIBRATION_DAY.isoformat()),
            args.calibration,
        )  # fmt: skip
        audit_rate, reaudit_rate = audits["per_second"], placements["per_second"]
        placement_cost = max(0.0, audit_rate / reaudit_rate - 1)
        # A placement's own share: a re-audit's (placement + audit) less an audit's.
        per_audit = {key: audits[key] for key in ("redis_commands", "commits")}
        per_placement = {key: max(0.0, placements[key] - audits[key]) for key in per_audit}
        print(f"calibration: audits alone {audit_rate:.1f}/s (Ca), placements with their "
              f"audits {reaudit_rate:.1f}/s (Cb): a placement costs {placement_cost:.2f} of an "
              f"audit; per audit {per_audit['redis_commands']:.1f} Redis commands and "
              f"{per_audit['commits']:.1f} commits, per placement "
              f"{per_placement['redis_commands']:.1f} and {per_placement['commits']:.1f}; idle "
              f"{idle['redis_commands']:.0f} commands/s, {idle['commits']:.1f} commits/s",
              flush=True)  # fmt: skip

        # 2. The night: fan out, then predict from its slices before it runs.
        finished_before = sampler.read()["finished"]
        cpu_before = cpu.read()
        sampler.start()
        django(env, FAN_OUT.format(day=DAY.isoformat(), window=args.window))
        night = wait_for(lambda: json.loads(django(env, NIGHT.format(day=DAY.isoformat()))),
                         timeout=600, message="the fan-out", interval=1.0)  # fmt: skip
        sizes = night["slice_sizes"]
        window = len(sizes) * SLICE_SECONDS
        seconds = predict_night(sizes, audit_rate=audit_rate, placement_cost=placement_cost)
        audited = [a for a, _ in seconds]

        def load(key: str) -> list[float]:
            return [idle[key] + a * per_audit[key] + p * per_placement[key] for a, p in seconds]

        predicted = {
            "drain_seconds": len(seconds),
            "audits_per_second_in_window": mean(audited[:window]),
            "placements_per_second_in_window": mean([p for _, p in seconds[:window]]),
            "audits_per_second_after_window": mean(audited[window:]),
            "peak_audits_per_second": peak(audited),
            "peak_redis_commands_per_second": peak(load("redis_commands")),
            "peak_commits_per_second": peak(load("commits")),
        }
        print("predicted:", json.dumps({k: round(v, 1) for k, v in predicted.items()}), flush=True)

        target = finished_before + sum(sizes)
        wait_for(lambda: sampler.samples and sampler.samples[-1]["finished"] >= target,
                 timeout=args.window * 4 + 600, message="the night", interval=2.0)  # fmt: skip
        samples = sampler.stop()
        night_cpu_ms = cpu.per_job_ms(cpu_before, sum(sizes))
        opened = night["window_start"]
        last_finished = next(s["t"] for s in samples if s["finished"] >= target)
        at_open = min(samples, key=lambda s: abs(s["t"] - opened))
        at_close = next((s for s in samples if s["t"] >= opened + window), samples[-1])
        measured = {
            "drain_seconds": last_finished - opened,
            "audits_per_second_in_window": (at_close["finished"] - at_open["finished"])
            / max(1.0, at_close["t"] - at_open["t"]),
            "placements_per_second_in_window": (at_close["created"] - at_open["created"])
            / max(1.0, at_close["t"] - at_open["t"]),
            "audits_per_second_after_window": (target - at_close["finished"])
            / max(1.0, last_finished - at_close["t"]),
            "peak_audits_per_second": peak(rates(samples, "finished")),
            "peak_redis_commands_per_second": peak(rates(samples, "redis_commands")),
            "peak_commits_per_second": peak(rates(samples, "commits")),
            "peak_connections": max(s["connections"] for s in samples),
        }
        results = {"pages": args.pages, "domains": args.domains, "window": args.window,
                   "audit_workers": args.audit_workers,
                   "reaudit_workers": args.reaudit_workers,
                   "reaudit_pool": args.reaudit_pool, "audit_rate": audit_rate,
                   "reaudit_rate": reaudit_rate, "placement_cost": placement_cost,
                   "per_audit": per_audit, "per_placement": per_placement, "idle": idle,
                   "busiest_slice": max(sizes), "predicted": predicted, "measured": measured,
                   "cpu_ms": {"audits alone, per audit": audits["cpu_ms"],
                              "placements burst, per re-audit": placements["cpu_ms"],
                              "the night, per re-audit": night_cpu_ms}}  # fmt: skip
        report(results)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return 0
    finally:
        for process in workers:
            process.stop()
        site.stop()
        drop()
        if redis_process is not None:
            redis_process.terminate()
            redis_process.wait(timeout=10)


def report(results: dict) -> None:
    predicted, measured = results["predicted"], results["measured"]
    print(f"\n{results['pages']:,} pages, {results['domains']:,} domains, "
          f"{results['window']} s window, {results['audit_workers']} audits worker processes; "
          f"Ca {results['audit_rate']:.1f}/s, Cb {results['reaudit_rate']:.1f}/s, "
          f"p {results['placement_cost']:.2f}")  # fmt: skip
    print("| measure | predicted | measured | measured / predicted |")
    print("| --- | ---: | ---: | ---: |")
    for key, label in [
        ("drain_seconds", "drain time, s (window opens to last audit)"),
        ("placements_per_second_in_window", "placements/s while the window is open"),
        ("audits_per_second_in_window", "audits/s while the window is open"),
        ("audits_per_second_after_window", "audits/s after the window, to the drain"),
        ("peak_audits_per_second", "peak audits/s (10 s mean)"),
        ("peak_redis_commands_per_second", "peak Redis commands/s"),
        ("peak_commits_per_second", "peak PostgreSQL commits/s"),
    ]:
        ratio = f"{measured[key] / predicted[key]:.2f}" if predicted[key] else "-"
        print(f"| {label} | {predicted[key]:.0f} | {measured[key]:.0f} | {ratio} |")
    print(f"peak PostgreSQL connections: {measured['peak_connections']}")
    phases = results["cpu_ms"]
    print("\n| CPU ms | " + " | ".join(phases) + " |")
    print("| --- |" + " ---: |" * len(phases))
    for role in next(iter(phases.values())):
        print(f"| {role} | " + " | ".join(f"{phase[role]:.1f}" for phase in phases.values()) + " |")


if __name__ == "__main__":
    sys.exit(main())
