#!/usr/bin/env python
"""A deploy under load: SIGTERM the whole stack with audits in flight, start it again.

    .venv/bin/python bench/restart.py                 # 400 audits, pages answering in 3 s
    .venv/bin/python bench/restart.py --audits 100

What it starts, all on 127.0.0.1: a throwaway redis-server (or REDIS_URL's, which it
empties), a fresh PostgreSQL database next to DATABASE_URL's (the local server when
unset; dropped afterwards), a downstream whose every page answers after --page-seconds,
and the stack as `make run` starts it (runstack's command lines): gunicorn and the audits
workers. It submits --audits audits (each its own page) before the workers start, starts
them, waits until --at pages have been fetched, sends SIGTERM to every process of the stack at once (each stops as a deploy
stops it: a worker warm, finishing what it runs), starts the same command lines again, and
waits for every audit to finish.

Reported: lost (accepted, never finished: must be 0) and refetched (pages fetched more
than once, as a share of the audits: goal at most 5 %), with the seconds the stack took
to stop. Exit status 1 if a goal is missed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.services import (  # noqa: E402
    SessionProcess,
    SlowPages,
    create_database,
    start_redis,
    wait_until,
)
from config import devservices  # noqa: E402

REFETCH_GOAL = 0.05


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--audits", type=int, default=400)
    parser.add_argument("--page-seconds", type=float, default=3.0)
    parser.add_argument("--at", type=int, default=60, help="fetches before the SIGTERM")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()

    redis_process, redis_url = start_redis()
    database_url, drop_database = create_database(sqlite_fallback=False)
    logs = Path(tempfile.mkdtemp(prefix="plumb-restart-"))
    env = {
        **os.environ, "DEBUG": "false", "SECRET_KEY": "bench-restart-" + "k" * 50,
        "REDIS_URL": redis_url, "DATABASE_URL": database_url, "AUDIT_ALLOW_PRIVATE_TARGETS": "true",
        "AUDIT_QUEUE_MAX_DEPTH": "100000", "AUDIT_SUBMIT_RATE_PER_MINUTE": "100000",
        "AUDIT_SUBMIT_BURST": "100000", "AUDIT_MAX_LINK_CHECKS": "0",
        "WEB_PORT": str(devservices.free_port()),
    }  # fmt: skip
    os.environ.update(env)
    site = SlowPages(args.page_seconds)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    processes: list[SessionProcess] = []
    try:
        import django

        django.setup()
        import httpx2
        import redis
        from django.conf import settings
        from django.core.management import call_command

        from audits.models import Audit
        from devstack.management.commands.runstack import stack_commands

        redis.Redis.from_url(redis_url).flushdb()
        call_command("migrate", interactive=False, verbosity=0)
        commands = stack_commands()
        wanted = {"web": commands["web"]} | {
            name: command for name, command in commands.items() if name.startswith("worker-audits")
        }
        processes = [SessionProcess(name, command, env, logs) for name, command in wanted.items()]
        web, workers = processes[0], processes[1:]
        # The web first: every audit is accepted and queued before a worker takes one, so
        # the SIGTERM finds the workers busy and the queue full.
        web.start()
        api = f"http://{settings.WEB_HOST}:{settings.WEB_PORT}"
        wait_until(lambda: answers(f"{api}/healthz"), 60, f"the stack (logs in {logs})")

        base = f"http://127.0.0.1:{site.server_address[1]}"
        with ThreadPoolExecutor(16) as pool:
            answers_ = list(
                pool.map(
                    lambda n: httpx2.post(
                        f"{api}/api/audits", json={"url": f"{base}/page-{n}"}, timeout=30
                    ),
                    range(args.audits),
                )
            )
        accepted = [r.json()["id"] for r in answers_ if r.status_code == 202]
        print(f"{len(accepted)} of {args.audits} accepted; starting the workers", flush=True)
        for worker in workers:
            worker.start()
        wait_until(lambda: sum(site.fetches.values()) >= args.at, 120, f"{args.at} fetches")

        in_flight = Audit.objects.filter(status=Audit.Status.RUNNING).count()
        queued = Audit.objects.filter(status=Audit.Status.QUEUED).count()
        stopping = time.monotonic()
        with ThreadPoolExecutor(len(processes)) as pool:
            list(pool.map(SessionProcess.stop, processes))
        stop_seconds = time.monotonic() - stopping
        done_before = Audit.objects.filter(status=Audit.Status.SUCCEEDED).count()
        print(
            f"SIGTERM with {in_flight} running and {queued} queued; {done_before} done once stopped, in"
            f" {stop_seconds:.1f} s; starting again",
            flush=True,
        )
        for process in processes:
            process.start()

        def finished() -> bool:
            return Audit.objects.filter(
                id__in=accepted, status__in=[Audit.Status.SUCCEEDED, Audit.Status.FAILED]
            ).count() == len(accepted)

        wait_until(finished, args.timeout, "every accepted audit", fail=False)
        succeeded = Audit.objects.filter(id__in=accepted, status=Audit.Status.SUCCEEDED).count()
        lost = (
            len(accepted)
            - Audit.objects.filter(
                id__in=accepted, status__in=[Audit.Status.SUCCEEDED, Audit.Status.FAILED]
            ).count()
        )
        refetched = sum(1 for count in site.fetches.values() if count > 1)
        fetches = sum(site.fetches.values())
        share = refetched / max(1, len(accepted))
        print(
            f"accepted {len(accepted)}; succeeded {succeeded}; lost {lost}; running at SIGTERM"
            f" {in_flight} (queued {queued}); fetches {fetches} ({fetches / max(1, len(accepted)):.3f} per audit);"
            f" refetched {refetched} ({share:.1%}, goal <= {REFETCH_GOAL:.0%}); stack stopped in"
            f" {stop_seconds:.1f} s"
        )
        return 0 if lost == 0 and share <= REFETCH_GOAL else 1
    finally:
        for process in processes:
            if process.popen is not None and process.popen.poll() is None:
                process.stop()
        site.shutdown()
        from django.db import connections

        connections.close_all()
        drop_database()
        if redis_process is not None:
            redis_process.terminate()
            redis_process.wait(timeout=10)


def answers(url: str) -> bool:
    import httpx2

    try:
        return httpx2.get(url, timeout=2).status_code == 200
    except httpx2.HTTPError:
        return False


if __name__ == "__main__":
    sys.exit(main())
