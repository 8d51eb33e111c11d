#!/usr/bin/env python
"""Throughput: Plumb end to end against the references a user would compare it with.

    .venv/bin/python bench/throughput.py                  # every phase, about 6 minutes
    .venv/bin/python bench/throughput.py --phases fast slow
    .venv/bin/python bench/throughput.py --database postgres

Everything runs on 127.0.0.1 in one run, so each goal is a ratio of figures taken
minutes apart on the same machine. `fast`, `slow` and `submit` run in rounds (`--rounds`,
3), each its references and Plumb; a goal's figure is the median of its rounds' ratios:

  fast        600 audits submitted over HTTP from 16 client threads, pages answered at
              once; against a plain Celery app (Redis broker, acks late, prefetch 1,
              4 prefork processes, task = urllib fetch + html.parser).  Goal >= 0.5x.
  slow        the same against pages answered after 200 ms; against a bare loop of the
              same fetch + parse in 64 threads.  Goal >= 0.5x.  Also the audit
              workers' peak resident memory (goal <= 1 GB).
  submit      POST /api/audits alone (no worker), 16 client threads: against a
              minimal Django view on the same gunicorn command line that validates the
              URL, inserts one row and publishes one message (goal >= 0.7x), and
              against the audits/s of `fast` (goal >= 1.5x).
  links       one audit of a page with 50 external links on one host (each answered
              after 200 ms): the time to finished, link checks included, against the
              page fetch plus one round of 50 checks at the host's politeness limit
              (LINKCHECK_PER_HOST_RATE, LINKCHECK_PER_HOST_CONCURRENCY).  Goal <= 2x.

The stack is the one `make run` starts, with its default settings: the same command
lines (devstack runstack's `stack_commands`) for the web and the audits worker, on the
embedded default database (a fresh SQLite file; `--database postgres` for a fresh
PostgreSQL database next to DATABASE_URL's) and a throwaway Redis (or REDIS_URL,
which it empties). Only the submission bucket and backlog cap are raised, so the
benchmark measures the machinery rather than admission refusing a burst.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx2  # noqa: E402
import psycopg  # noqa: E402
import redis  # noqa: E402

from bench.reference import plain_celery as reference  # noqa: E402
from bench.reference.plain_celery import fetch_and_parse  # noqa: E402
from bench.services import (  # noqa: E402
    SessionProcess,
    create_database,
    family_cpu_seconds,
    machine_busy_seconds,
    pids_named,
    postgres_server_pid,
    redis_server_pid,
    start_redis,
    stop_on_signals,
    thread_cpu_seconds,
)
from config import devservices  # noqa: E402
from tests.workers import wait_for  # noqa: E402

PYTHON = sys.executable
BIN = Path(PYTHON).parent
CLIENT_THREADS = 16
BARE_LOOP_THREADS = 64
SLOW_DELAY = 0.2
LINKS = 50
# Pages are spread over this many hosts (127.0.0.1 to 127.0.0.16, one site answering on
# each), so the per-host cap (OUTBOUND_PER_HOST_CONCURRENCY) is not what is measured.
HOSTS = 16
# Audits run (and not timed) before each end-to-end run: a few per worker process.
WARM_UP_AUDITS = 16

# Only what the benchmark must change from `make run`'s defaults.
STACK_ENV = {
    # As `make run` starts its processes (devstack runstack): DEBUG off, a real key.
    "DEBUG": "false",
    "SECRET_KEY": "throughput-benchmark-" + "k" * 50,
    "AUDIT_ALLOW_PRIVATE_TARGETS": "true",  # the site is on 127.0.0.1
    "AUDIT_SUBMIT_BURST": "1000000",
    "AUDIT_SUBMIT_RATE_PER_MINUTE": "1000000",
    "AUDIT_QUEUE_MAX_DEPTH": "1000000",
}


# --- processes -------------------------------------------------------------------------
class PeakRSS(threading.Thread):
    """The peak of the processes' resident memory taken together."""

    def __init__(self, processes: list[SessionProcess]):
        super().__init__(daemon=True)
        self.processes, self.peak, self.stopped = processes, 0, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            self.peak = max(self.peak, sum(p.rss_bytes() for p in self.processes))

    def stop(self) -> int:
        self.stopped.set()
        self.join()
        return self.peak


def answers(url: str) -> bool:
    try:
        return httpx2.get(url, timeout=1).status_code < 500
    except httpx2.HTTPError:
        return False


def start_site(logs: Path, delay: float) -> tuple[SessionProcess, str]:
    port = devservices.free_port()
    command = [PYTHON, "-m", "bench.fast_site", "--port", str(port), "--delay", str(delay),
               "--link-host", f"localhost:{port}", "--hosts", str(HOSTS)]  # fmt: skip
    site = SessionProcess(f"site-{delay:g}", command, dict(os.environ), logs).start()
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: answers(f"{base}/"), timeout=20, message="the site")
    return site, base


def spread(site: str, path: str, count: int) -> list[str]:
    """`count` page URLs under `path`, spread over the site's HOSTS hosts in turn."""
    return [
        site.replace("127.0.0.1", f"127.0.0.{n % HOSTS + 1}") + f"/{path}/{n}" for n in range(count)
    ]


def in_threads(count: int, threads: int, work) -> list:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(work, range(count)))


def submit(api: str, urls: list[str]) -> tuple[float, float]:
    """POST every URL to `api`/api/audits from 16 threads; (first sent, last answered), epoch s."""
    local = threading.local()

    def post(n: int) -> None:
        client = getattr(local, "client", None) or httpx2.Client(timeout=60)
        local.client = client
        response = client.post(f"{api}/api/audits", json={"url": urls[n]})
        if response.status_code != 202:
            raise SystemExit(f"submission refused: {response.status_code} {response.text}")

    started = time.time()
    in_threads(len(urls), CLIENT_THREADS, post)
    return started, time.time()


# --- references ------------------------------------------------------------------------
def plain_celery(
    site: str, count: int, redis_url: str, logs: Path, *, api: str | None = None
) -> dict:
    """The plain Celery reference's audits/s: published by 16 threads, or POSTed to `api`
    (the minimal view, publishing the same task) when given."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    worker = SessionProcess(
        "plain-celery",
        f"{BIN / 'celery'} -A bench.reference.plain_celery -b {redis_url} worker --pool prefork "
        "--concurrency 4 --loglevel WARNING -Q plain",
        dict(os.environ), logs,
    ).start()  # fmt: skip
    try:
        reference.app.conf.broker_url = redis_url
        # Ready when it has run a warm-up task on each of its processes.
        for n in range(4):
            reference.audit.apply_async(args=[f"{site}/warm/{n}"], queue="plain")
        wait_for(lambda: int(client.get(reference.DONE_KEY) or 0) >= 4, timeout=60,
                 message="the plain Celery worker")  # fmt: skip
        client.delete(reference.DONE_KEY)
        urls = spread(site, "plain", count)
        if api:
            started, _ = submit(api, urls)
        else:
            started = time.time()
            in_threads(count, CLIENT_THREADS,
                       lambda n: reference.audit.apply_async(args=[urls[n]], queue="plain"))  # fmt: skip
        wait_for(lambda: int(client.get(reference.DONE_KEY) or 0) >= count,
                 timeout=600, message="the plain Celery tasks", interval=0.01)  # fmt: skip
        elapsed = time.time() - started
    finally:
        worker.stop()
        client.flushdb()
    return {"per_second": count / elapsed, "seconds": elapsed}


class ReferenceView:
    """The minimal submission view, on the web process's own gunicorn command line."""

    def __init__(self, args, redis_url: str, logs: Path, *, queue: str):
        if args.database == "postgres":
            self.database, self.drop = create_database(sqlite_fallback=False)
        else:
            folder = tempfile.mkdtemp(prefix="plumb-ref-")
            self.database = f"sqlite:///{folder}/ref.sqlite3"
            self.drop = lambda: shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(
            [PYTHON, "-c", "import sys; from bench.reference import minimal_submit as m; "
             "m.create_table(sys.argv[1])", self.database],
            cwd=ROOT, check=True,
        )  # fmt: skip
        port = devservices.free_port()
        # Behind the same server as Plumb's web: its command line, and as many threads a
        # process as Plumb's runs on this database (2 on PostgreSQL, 1 on SQLite).
        web_command, threads = web_server(
            {**os.environ, **STACK_ENV, "DATABASE_URL": self.database}
        )
        factory = (f"bench.reference.minimal_submit:asgi_application({self.database!r}, "
                   f"{redis_url!r}, {queue!r}, threads={threads})")  # fmt: skip
        command = shlex.split(re.sub(r"--bind \S+", f"--bind 127.0.0.1:{port}", web_command))
        command[command.index("config.asgi:application")] = factory
        self.web = SessionProcess(f"reference-web-{queue}", command, dict(os.environ), logs).start()
        self.api = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: answers(f"{self.api}/api/audits"), timeout=60, message="the reference view"
        )

    def stop(self) -> None:
        self.web.stop()
        self.drop()


def _log_size(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


def _celery_ready(log: Path, since: int) -> bool:
    """Has the worker logging to `log` said it is ready since the log was `since` bytes long?

    The logs of one run are appended to (a phase's worker writes after the previous
    phase's), so an earlier worker's "ready." must not count."""
    if not log.exists():
        return False
    with log.open("rb") as text:
        text.seek(since)
        return b"ready." in text.read()


def bare_loop(site: str, count: int) -> dict:
    started = time.time()
    urls = spread(site, "p", count)
    in_threads(count, BARE_LOOP_THREADS, lambda n: fetch_and_parse(urls[n]))
    elapsed = time.time() - started
    return {"per_second": count / elapsed, "seconds": elapsed}


# --- Plumb -----------------------------------------------------------------------------
def python_of(checkout: Path) -> str:
    """The interpreter that runs `checkout`: its own virtualenv when it has one (another
    commit's dependencies, say one without a package this checkout added), else this one."""
    own = checkout / ".venv" / "bin" / "python"
    return str(own) if checkout != ROOT and own.exists() else PYTHON


def read_from_django(statement: str, env: dict, checkout: Path = ROOT):
    """What `statement` prints as JSON in a process of `checkout` set up under `env`."""
    printed = subprocess.run(
        [python_of(checkout), "-c", f"import django, json; django.setup(); {statement}"],
        cwd=checkout, env={**env, "DJANGO_SETTINGS_MODULE": "config.settings"},
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(printed.stdout)


def stack_commands(env: dict, checkout: Path = ROOT) -> dict[str, str]:
    """The command line of each process `make run` starts from `checkout`, under `env`."""
    return read_from_django(
        "from devstack.management.commands.runstack import stack_commands; "
        "print(json.dumps(stack_commands()))",
        env, checkout,
    )  # fmt: skip


def web_server(env: dict) -> tuple[str, int]:
    """Plumb's web under `env`: its command line, and the threads each of its processes runs
    Django on (WEB_THREADS)."""
    command, threads = read_from_django(
        "from django.conf import settings; "
        "from devstack.management.commands.runstack import stack_commands; "
        "print(json.dumps([stack_commands()['web'], settings.WEB_THREADS]))",
        env,
    )  # fmt: skip
    return command, threads


def server_pids(redis_url: str, database_url: str) -> dict[str, int]:
    """The servers a stack talks to that run on this machine, by role: Redis, and
    PostgreSQL's postmaster (SQLite runs inside the stack's own processes). A server
    elsewhere is left out: the id it reports is no process of that name here."""
    found = {"Redis": (redis_server_pid(redis_url), "redis-server")}
    if not database_url.startswith("sqlite"):
        found["database server"] = (postgres_server_pid(database_url), "postgres")
    return {role: pid for role, (pid, command) in found.items() if pid in pids_named(command)}


class Stack:
    """Plumb's web and audits worker, as `make run` starts them from `checkout` (this one,
    or another commit's worktree run with this one's virtualenv), on a fresh database."""

    def __init__(self, args, logs: Path, redis_url: str, checkout: Path = ROOT):
        self.logs, self.redis_url, self.checkout = logs, redis_url, checkout
        if args.database == "postgres":
            self.database_url, self.drop = create_database(sqlite_fallback=False)
        else:
            path = Path(tempfile.mkdtemp(prefix="plumb-throughput-db-")) / "plumb.sqlite3"
            self.database_url = f"sqlite:///{path}"
            self.drop = lambda: shutil.rmtree(path.parent, ignore_errors=True)
        self.port = devservices.free_port()
        self.env = {
            **os.environ, **STACK_ENV, "REDIS_URL": redis_url, "DATABASE_URL": self.database_url,
            "WEB_PORT": str(self.port), "PLUMB_VAR_DIR": str(logs / "var"),
        }  # fmt: skip
        subprocess.run([python_of(checkout), "manage.py", "migrate", "--verbosity", "0"],
                       cwd=checkout, env=self.env, check=True)  # fmt: skip
        redis.Redis.from_url(redis_url).flushdb()
        self.commands = stack_commands(self.env, checkout)
        self.api = f"http://127.0.0.1:{self.port}"
        self.web = None
        self.workers: list[SessionProcess] = []

    def start_web(self) -> None:
        self.web = SessionProcess(
            "web", self.commands["web"], self.env, self.logs, self.checkout
        ).start()
        wait_for(lambda: answers(f"{self.api}/healthz"), timeout=60, message="the web process")

    def start_workers(self) -> None:
        """Every audits worker `make run` starts (AUDITS_WORKER_PROCESSES, one per core)."""
        names = [name for name in self.commands if name.startswith("worker-audits")]
        since = {name: _log_size(self.logs / f"{name}.log") for name in names}
        self.workers = [
            SessionProcess(name, self.commands[name], self.env, self.logs, self.checkout).start()
            for name in names
        ]
        for name in names:
            wait_for(lambda name=name: _celery_ready(self.logs / f"{name}.log", since[name]), timeout=60,
                     message=f"the audits worker {name}")  # fmt: skip

    def server_pids(self) -> dict[str, int]:
        return server_pids(self.redis_url, self.database_url)

    def submit(self, urls: list[str]) -> tuple[float, float]:
        return submit(self.api, urls)

    def finished(self) -> tuple[int, int, float | None]:
        """(finished audits, failed audits, latest finished_at as epoch seconds)."""
        query = (
            "SELECT count(*), sum(CASE WHEN status = 'failed' THEN 1 ELSE 0 END), "
            "max(finished_at) FROM audits_audit WHERE status IN ('succeeded', 'failed')"
        )
        if self.database_url.startswith("sqlite"):
            with sqlite3.connect(self.database_url.removeprefix("sqlite:///"), timeout=30) as db:
                count, failed, latest = db.execute(query).fetchone()
            latest = latest and datetime.fromisoformat(latest).replace(tzinfo=UTC).timestamp()
        else:
            with psycopg.connect(self.database_url) as db:
                count, failed, latest = db.execute(query).fetchone()
            latest = latest and latest.timestamp()
        return count, failed or 0, latest

    def stop(self) -> None:
        for process in (*self.workers, self.web):
            if process is not None:
                process.stop()
        self.drop()


def plumb_end_to_end(
    args,
    site: str,
    logs: Path,
    redis_url: str,
    *,
    tag: str,
    profiled: bool = False,
    checkout: Path = ROOT,
) -> dict:
    stack = Stack(args, logs, redis_url, checkout)
    try:
        stack.start_web()
        stack.start_workers()
        # Warmed up as the references are: each process has loaded what a first request or
        # task loads (the reference's worker runs a task on each process before it is timed).
        stack.submit(spread(site, f"{tag}-warm", WARM_UP_AUDITS))
        wait_for(lambda: stack.finished()[0] >= WARM_UP_AUDITS, timeout=120,
                 message="the warm-up audits", interval=0.2)  # fmt: skip
        memory = PeakRSS(stack.workers)
        memory.start()
        profilers = profile(args, stack, tag) if profiled else []
        roles = {"web": [stack.web], "audits workers": stack.workers}
        cpu_before = {role: cpu_seconds(processes) for role, processes in roles.items()}
        consumer_before = main_thread_cpu_seconds(stack.workers)
        servers = stack.server_pids()
        servers_before = {name: family_cpu_seconds(pid) for name, pid in servers.items()}
        commands_before = redis_commands(redis_url)
        reads_before = redis_reads(redis_url)
        busy_before, busy_since = machine_busy_seconds(), time.time()
        started, submitted = stack.submit(spread(site, tag, args.count))
        count, failed, latest = wait_for(
            lambda: (row := stack.finished())[0] >= WARM_UP_AUDITS + args.count and row,
            timeout=900, message="the audits", interval=0.2,
        )  # fmt: skip
        cpu_ms = {role: (cpu_seconds(processes) - cpu_before[role]) * 1000 / args.count
                  for role, processes in roles.items()}  # fmt: skip
        consumer_ms = (main_thread_cpu_seconds(stack.workers) - consumer_before) * 1000 / args.count
        servers_ms = {name: (family_cpu_seconds(pid) - servers_before[name]) * 1000 / args.count
                      for name, pid in servers.items()}  # fmt: skip
        commands = {name: (calls - commands_before.get(name, 0)) / args.count
                    for name, calls in redis_commands(redis_url).items()
                    if calls > commands_before.get(name, 0)}  # fmt: skip
        reads = (redis_reads(redis_url) - reads_before) / args.count
        # Every core's busy time over the run, every process included (Redis, the site, the
        # clients): how near the machine itself is to its limit.
        busy_seconds = machine_busy_seconds() - busy_before
        busy = busy_seconds / ((time.time() - busy_since) * os.cpu_count())
        peak = memory.stop()
        for profiler in profilers:
            profiler.send_signal(2)
            profiler.wait(timeout=60)
    finally:
        stack.stop()
    elapsed = latest - started
    return {
        "per_second": args.count / elapsed, "seconds": elapsed, "failed": failed,
        "submissions_per_second": args.count / (submitted - started), "worker_rss": peak,
        "audits_workers": len(stack.workers),
        "cpu_ms_per_audit": cpu_ms, "cpu_ms_per_audit_total": sum(cpu_ms.values()),
        "consumer_cpu_ms_per_audit": consumer_ms,
        # The servers' own CPU (those of this machine), and every process's together: the
        # site and the bench's clients are the machine's rest.
        "server_cpu_ms_per_audit": servers_ms,
        "machine_cpu_ms_per_audit": busy_seconds * 1000 / args.count,
        "redis_commands_per_audit": dict(sorted(commands.items(), key=lambda kv: -kv[1])),
        "redis_reads_per_audit": reads,
        "machine_busy": busy,
    }  # fmt: skip


def redis_commands(redis_url: str) -> dict[str, int]:
    """Calls of each command Redis has served since it started (INFO commandstats)."""
    stats = redis.Redis.from_url(redis_url).info("commandstats")
    return {name.removeprefix("cmdstat_"): fields["calls"] for name, fields in stats.items()}


def redis_reads(redis_url: str) -> int:
    """Reads Redis has made from its clients' sockets since it started (INFO stats): about one
    a round trip, a pipeline's commands arriving together."""
    return redis.Redis.from_url(redis_url).info("stats")["total_reads_processed"]


def cpu_seconds(processes: list[SessionProcess]) -> float:
    return sum(process.cpu_seconds() for process in processes)


def main_thread_cpu_seconds(processes: list[SessionProcess]) -> float:
    """CPU time of the main thread of every process of the sessions: in a threads worker, the
    one that runs kombu and Celery's consumer (the broker read, the unacked bookkeeping, the
    dispatch to a thread and the acknowledgement); the tasks run in the others."""
    return sum(thread_cpu_seconds(pid, pid) for process in processes for pid in process.pids())


def profile(args, stack: Stack, tag: str) -> list[subprocess.Popen]:
    """py-spy sampling the web and the audits worker (every process of each), as folded stacks."""
    args.profile.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [
                str(BIN / "py-spy"),
                "record",
                "--gil",
                "--format",
                "raw",
                "--subprocesses",
                "--rate",
                "250",
                "--output",
                str(args.profile / f"{tag}-{process.name}.txt"),
                "--pid",
                str(process.popen.pid),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for process in (stack.web, *stack.workers)
    ]


def first_then_second(round_index: int, baseline: Path | None) -> list[tuple[str, Path]]:
    """(stack, its checkout) in the order this checkout's stack ("plumb") and --baseline's
    run in a round: they take turns going first, since the first of a pair ran dearer in
    three rounds of four (BENCHMARKS.md, "Latest run on SQLite")."""
    if baseline is None:
        return [("plumb", ROOT)]
    pair = [("plumb", ROOT), ("baseline", baseline.resolve())]
    return pair if round_index % 2 == 0 else pair[::-1]


def submissions(args, site: str, logs: Path, redis_url: str, round_index: int = 0) -> dict:
    """POST /api/audits alone (and from --baseline's checkout, the two taking turns going
    first), then the minimal reference view on the same gunicorn line."""
    measured = {}
    for stack, checkout in first_then_second(round_index, args.baseline):
        measured[stack] = plumb_submissions(args, site, logs, redis_url, checkout=checkout)
    view = ReferenceView(args, redis_url, logs, queue="reference")
    try:
        measured["reference"] = submission_costs(
            view.api, view.web, server_pids(redis_url, view.database), site, args.count
        )
    finally:
        view.stop()
        redis.Redis.from_url(redis_url).flushdb()
    return measured


def plumb_submissions(
    args, site: str, logs: Path, redis_url: str, *, checkout: Path = ROOT
) -> dict:
    """Plumb's web from `checkout` taking `args.count` submissions (submission_costs)."""
    stack = Stack(args, logs, redis_url, checkout)
    try:
        stack.start_web()
        return submission_costs(stack.api, stack.web, stack.server_pids(), site, args.count)
    finally:
        stack.stop()
        redis.Redis.from_url(redis_url).flushdb()


def submission_costs(
    api: str, web: SessionProcess, servers: dict[str, int], site: str, count: int
) -> dict:
    """`count` submissions to `api` after 50 to warm it: their rate, and what each cost in
    CPU, from /proc: the web process (its workers included), each server of this machine
    it talks to (`servers`: Redis, PostgreSQL) and the whole machine (the bench's client
    threads too)."""
    submit(api, spread(site, "warm", 50))
    web_before = cpu_seconds([web])
    servers_before = {name: family_cpu_seconds(pid) for name, pid in servers.items()}
    busy_before = machine_busy_seconds()
    started, ended = submit(api, spread(site, "submit", count))
    return {
        "per_second": count / (ended - started),
        "web_cpu_ms_per_submission": (cpu_seconds([web]) - web_before) * 1000 / count,
        "server_cpu_ms_per_submission": {
            name: (family_cpu_seconds(pid) - servers_before[name]) * 1000 / count
            for name, pid in servers.items()
        },
        "machine_cpu_ms_per_submission": (machine_busy_seconds() - busy_before) * 1000 / count,
    }


def plain_celery_over_http(args, site: str, logs: Path, redis_url: str) -> dict:
    """The user's own end to end: the minimal view publishing the plain Celery task."""
    view = ReferenceView(args, redis_url, logs, queue="plain")
    try:
        return plain_celery(site, args.count, redis_url, logs, api=view.api)
    finally:
        view.stop()


def link_checks(args, site: str, logs: Path, redis_url: str) -> dict:
    stack = Stack(args, logs, redis_url)
    try:
        stack.start_web()
        stack.start_workers()
        probe = time.time()
        fetch_and_parse(f"{site}/probe")
        fetch_seconds = time.time() - probe
        started, _ = stack.submit([f"{site}/links/{LINKS}"])
        _, failed, latest = wait_for(lambda: (row := stack.finished())[0] >= 1 and row,
                                     timeout=900, message="the audit with links", interval=0.1)  # fmt: skip
    finally:
        stack.stop()
    rate = float(stack.env.get("LINKCHECK_PER_HOST_RATE", 1.0))
    concurrency = int(stack.env.get("LINKCHECK_PER_HOST_CONCURRENCY", 2))
    # One round at the host's limit: starts spaced 1/rate apart, at most `concurrency`
    # in flight, each taking one fetch.
    spacing = max(1 / rate, fetch_seconds / concurrency)
    ideal = fetch_seconds + (LINKS - 1) * spacing + fetch_seconds
    elapsed = latest - started
    return {"seconds": elapsed, "ideal_seconds": ideal, "failed": failed}


# --- report --------------------------------------------------------------------------------
def rounds_row(measure: str, rounds: list[dict], reference: str, name: str, goal: str) -> tuple:
    """One goal over the rounds: the medians of Plumb, of the reference and of the ratios
    (each round's ratio is of figures minutes apart), and every round's ratio."""
    plumb = [r["plumb"]["per_second"] for r in rounds]
    against = [r[reference]["per_second"] for r in rounds]
    ratios = [p / a for p, a in zip(plumb, against, strict=True)]
    each = " / ".join(f"{ratio:.2f}" for ratio in ratios)
    return (measure, median(plumb), f"{name} {median(against):.0f}/s", median(ratios), goal, each)


def submission_cpu(costs: dict) -> str:
    """A submission's CPU in ms, one figure per process: "web 2.90, Redis 0.13, ..."."""
    parts = {"web": costs["web_cpu_ms_per_submission"], **costs["server_cpu_ms_per_submission"],
             "the machine in all": costs["machine_cpu_ms_per_submission"]}  # fmt: skip
    return ", ".join(f"{name} {ms:.2f}" for name, ms in parts.items())


def report(results: dict, args) -> None:
    rows = []
    references = {
        phase: [r for r in results.get(phase, []) if "reference" in r] for phase in ("fast", "slow")
    }
    if references["fast"]:
        fast = references["fast"]
        rows.append(rounds_row("per-audit cost: audits/s, pages at once", fast, "reference",
                               "plain Celery", ">= 0.5x"))  # fmt: skip
        rows.append(rounds_row("the same, both submitted over HTTP", fast, "reference_over_http",
                               "minimal view + plain Celery", ">= 0.5x"))  # fmt: skip
    if references["slow"]:
        rows.append(rounds_row("concurrency: audits/s, pages after 200 ms", references["slow"],
                               "reference", "bare 64-thread loop", ">= 0.5x"))  # fmt: skip
    if "submit" in results:
        submit = results["submit"]
        rows.append(rounds_row("submissions/s, 16 threads", submit, "reference", "minimal view",
                               ">= 0.7x"))  # fmt: skip
        if references["fast"]:
            submissions = median(r["plumb"]["per_second"] for r in submit)
            audits = median(r["plumb"]["per_second"] for r in results["fast"])
            rows.append(("submissions/s against audits/s", submissions,
                         f"stack audits {audits:.0f}/s", submissions / audits, ">= 1.5x"))  # fmt: skip
    if "links" in results:
        links = results["links"]
        rows.append((f"an audit with {LINKS} links, seconds", links["seconds"],
                     f"fetch + one polite round {links['ideal_seconds']:.1f} s",
                     links["seconds"] / links["ideal_seconds"], "<= 2x"))  # fmt: skip
    print(f"\nthroughput, {args.count} audits, database {args.database}, {args.rounds} round(s)")
    print(
        f"| {'measure':<44} | {'Plumb':>7} | {'reference, same run':<34} | ratio | goal    | each round |"
    )
    print(f"| {'-' * 44} | {'-' * 7}: | {'-' * 34} | ----: | ------- | ---------- |")
    for measure, value, against, ratio, goal, *each in rows:
        print(
            f"| {measure:<44} | {value:7.1f} | {against:<34} | {ratio:.2f}x | {goal:<7} | {''.join(each)} |"
        )
    for n, measured in enumerate(results.get("submit", []), start=1):
        names = {"plumb": "Plumb", "baseline": str(args.baseline), "reference": "minimal view"}
        print(f"submit round {n}: " + "; ".join(
            f"{names[stack]} {measured[stack]['per_second']:.1f}/s, CPU ms a submission: "
            + submission_cpu(measured[stack]) for stack in names if stack in measured
        ))  # fmt: skip
    for phase in ("fast", "slow"):
        baseline = [r for r in results.get(phase, []) if "baseline" in r]
        if baseline:
            new = [r["plumb"]["cpu_ms_per_audit_total"] for r in baseline]
            old = [r["baseline"]["cpu_ms_per_audit_total"] for r in baseline]
            print(f"{phase}: CPU ms per audit, web + audits workers: this checkout "
                  f"{median(new):.1f}, {args.baseline} {median(old):.1f}, ratio "
                  f"{median(n / o for n, o in zip(new, old, strict=True)):.2f}x (goal <= 0.5x; "
                  f"each round {' / '.join(f'{n:.1f} vs {o:.1f}' for n, o in zip(new, old, strict=True))})")  # fmt: skip
        for n, measured in enumerate(results.get(phase, []), start=1):
            plumb = measured["plumb"]
            print(f"{phase} round {n}: {plumb['audits_workers']} audits worker(s), peak RSS together "
                  f"{plumb['worker_rss'] / 2**20:.0f} MB, "
                  f"{plumb['failed']} failed, submissions during the run "
                  f"{plumb['submissions_per_second']:.0f}/s; machine busy "
                  f"{plumb['machine_busy']:.0%}; CPU ms per audit: "
                  + ", ".join(f"{name} {ms:.1f}" for name, ms in plumb["cpu_ms_per_audit"].items())
                  + f" (of which the workers' main threads, kombu and Celery's consumer, "
                  f"{plumb['consumer_cpu_ms_per_audit']:.1f})")  # fmt: skip
            print(f"{phase} round {n}: CPU ms per audit elsewhere: "
                  + "".join(f"{name} {ms:.1f}, " for name, ms in plumb["server_cpu_ms_per_audit"].items())
                  + f"the machine in all {plumb['machine_cpu_ms_per_audit']:.1f} (every process: the "
                  "site and the bench's clients too)")  # fmt: skip
            print(f"{phase} round {n}: Redis reads (round trips) per audit {plumb['redis_reads_per_audit']:.1f}, "
                  f"commands per audit {sum(plumb['redis_commands_per_audit'].values()):.1f}: "
                  + ", ".join(f"{name} {calls:.1f}" for name, calls in plumb["redis_commands_per_audit"].items() if calls >= 0.1))  # fmt: skip
            if "baseline" in measured:
                old = measured["baseline"]
                print(f"{phase} round {n}, {args.baseline}: {old['per_second']:.1f} audits/s; CPU ms per "
                      "audit: " + ", ".join(f"{name} {ms:.1f}" for name, ms in old["cpu_ms_per_audit"].items())
                      + (f" (the workers' main threads {old['consumer_cpu_ms_per_audit']:.1f})"
                         if "consumer_cpu_ms_per_audit" in old else ""))  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--phases", nargs="+", default=["fast", "slow", "submit", "links"],
                        choices=["fast", "slow", "submit", "links"])  # fmt: skip
    parser.add_argument("--count", type=int, default=600, help="audits per run")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of `fast`, `slow` and `submit`, each its references and Plumb; "
                        "each goal is the median of its rounds' ratios")  # fmt: skip
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--profile", type=Path, help="py-spy the end-to-end runs into this folder")
    parser.add_argument(
        "--baseline", type=Path, metavar="CHECKOUT",
        help="also run Plumb's end to end from this checkout (another commit's worktree, run "
        "with this virtualenv) beside this one's, in each round of `fast` and `slow`, the two "
        "taking turns going first, "
        "and report both CPU costs per audit and their ratio; in `submit`, its web too, "
        "reporting both rates and both web CPU costs per submission",
    )  # fmt: skip
    parser.add_argument("--skip-references", action="store_true",
                        help="run only Plumb (and --baseline) in `fast` and `slow`")  # fmt: skip
    args = parser.parse_args()
    # A SIGTERM ends the run through every `finally`, so it stops the stacks it started.
    stop_on_signals()

    logs = Path(tempfile.mkdtemp(prefix="plumb-throughput-"))
    print(f"logs in {logs}", flush=True)
    redis_process, redis_url = start_redis()
    fast_site, fast = start_site(logs, 0.0)
    slow_site, slow = start_site(logs, SLOW_DELAY)
    results: dict = {}
    try:
        # Rounds alternate the references and Plumb, so a minute of load from elsewhere
        # moves one round's ratio, not the median.
        for phase, site in (("fast", fast), ("slow", slow)):
            if phase not in args.phases:
                continue
            results[phase] = []
            for n in range(args.rounds):
                if args.skip_references:
                    measured = {}
                elif phase == "fast":
                    measured = {
                        "reference": plain_celery(site, args.count, redis_url, logs),
                        "reference_over_http": plain_celery_over_http(args, site, logs, redis_url),
                    }
                else:
                    measured = {"reference": bare_loop(site, args.count)}
                for stack, checkout in first_then_second(n, args.baseline):
                    ours = stack == "plumb"
                    measured[stack] = plumb_end_to_end(
                        args, site, logs, redis_url,
                        tag=phase if ours else f"{phase}-baseline",
                        checkout=checkout,
                        # Only this checkout's first round is profiled: the profiler slows
                        # what it watches.
                        profiled=ours and bool(args.profile) and n == 0,
                    )  # fmt: skip
                results[phase].append(measured)
                print(f"{phase} round {n + 1}:", json.dumps(measured), flush=True)
        if "submit" in args.phases:
            results["submit"] = []
            for n in range(args.rounds):
                results["submit"].append(submissions(args, fast, logs, redis_url, n))
                print(f"submit round {n + 1}:", json.dumps(results["submit"][-1]), flush=True)
        if "links" in args.phases:
            results["links"] = link_checks(args, slow, logs, redis_url)
            print("links:", json.dumps(results["links"]), flush=True)
    finally:
        fast_site.stop()
        slow_site.stop()
        if redis_process is not None:
            redis_process.terminate()
            redis_process.wait(timeout=10)
    report(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
