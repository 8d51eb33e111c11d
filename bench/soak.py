#!/usr/bin/env python
"""Soak: steady submissions plus bursts, a flaky downstream and a flaky webhook receiver, a
night of re-audits, and faults on a schedule: worker SIGKILLs, a Redis restart that comes
back empty, PostgreSQL restarting and failing over (and a Sentinel failover, `--sentinel`).

    .venv/bin/python bench/soak.py                # 10 minutes of load, then the drain
    .venv/bin/python bench/soak.py --minutes 5    # a shorter run: still every fault once
    .venv/bin/python bench/soak.py --minutes 60 --json soak.json

Run it as root or as the `postgres` user (it starts PostgreSQL servers of its own).
What it starts, all on 127.0.0.1: a redis-server of its own (restarted empty mid-run), a
PostgreSQL primary with a synchronous streaming replica (bench/pgcluster.py; the stack's
DATABASE_URL lists both, target_session_attrs=read-write), a downstream site, a webhook
receiver, and the stack as `make run` starts it (the same command lines, from
`runstack`): gunicorn, beat, two audits workers (one can be killed while the other
works), the reaudit worker and the webhooks worker.

The load, for --minutes (D seconds):
  steady   --rate submissions per second through POST /api/audits, spread over
           --clients addresses (X-Forwarded-For behind one trusted proxy), a rate the
           workers can sustain; --callback-share of them carry a callback_url to the
           receiver;
  bursts   every --burst-every seconds, --burst-clients new addresses submitting at
           once (enough to fill the backlog: refused_backlog) and one address
           submitting --burst-per-client times in a row (refused_ip);
  a night  --night-pages pages marked reaudit_nightly, fanned out at 0.1 D with a
           window of min(0.5 D, --night-window): their placements fire while the
           faults below happen;
  faults   the downstream answers 503 to about 5 % of requests, hangs past the fetch
           timeout on about 1 %, and is down (503) for 20 s every 3 minutes, which
           opens the breaker; the receiver is down (its port closed) for 30 s every
           150 s; every --kill-every seconds one audits worker (its main process and
           pool children) is SIGKILLed and started again, as a supervisor would; and
           --fault-rounds rounds of: Redis stopped and started again empty (at 0.2 D of
           the round's share), the PostgreSQL primary restarted (0.4), a Sentinel
           failover (0.8, `--sentinel` only); in the last round the primary dies and the
           replica is promoted (0.6); each 15 s past those fractions, between a
           SIGKILL and a burst. A 5-minute run sees every fault once.

Then it stops the load and waits for the drain (up to --drain-timeout: the periodic
reconciliation under beat publishes again what Redis lost). Reported: submitted,
admitted, refused by reason, completed, failed (each dead-lettered), lost (admitted,
but neither finished nor dead-lettered), webhook deliveries owed / arrived / lost, the
night's pages re-audited / not re-audited / re-audited more than once, p50/p99
submission latency (steady and burst), and the peak resident memory of each process.
Exit status 1 if an audit or a delivery was lost or a page of the night not re-audited.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date
from http.server import ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.pgcluster import PgCluster  # noqa: E402
from bench.services import (  # noqa: E402
    PrivateRedis,
    QuietHandler,
    SentinelRedis,
    SessionProcess,
    rss_kib,
)
from config import devservices  # noqa: E402
from tests.receiver import Receiver  # noqa: E402

# Settings of the stack under soak (each an environment variable of docs/configuration.md).
STACK_ENV = {
    "DEBUG": "true",
    "AUDIT_ALLOW_PRIVATE_TARGETS": "true",  # the downstream is on 127.0.0.1
    "TRUSTED_PROXY_COUNT": "1",  # the soak's clients arrive "through" one proxy
    "AUDIT_FETCH_TIMEOUT_SECONDS": "5",
    # A killed worker's audits come back after this long (kombu restores unacked
    # messages past their visibility timeout); the default is 300 s. Above every
    # audits-queue task's hard time limit (a link check's 85 s; manage.py check, jobs.E001).
    "AUDITS_VISIBILITY_TIMEOUT_SECONDS": "90",
    # A message popped by a worker killed before it recorded it as unacked is gone
    # (kombu's Redis transport has that window): the reconciler publishes the audit
    # again after this long (default 600 s; above the 65 s hard time limit here).
    "RECONCILE_AFTER_SECONDS": "120",
    "AUDITS_WORKER_CONCURRENCY": "4",
    # Two, whatever the cores: one is killed while the other works.
    "AUDITS_WORKER_PROCESSES": "2",
    "WEB_CONCURRENCY": "2",
    "LOG_LEVEL": "INFO",
    # A delivery's retries fit in the drain: 5, 10, 20, 40, 60, 60... s (default cap 1 h).
    "WEBHOOK_BACKOFF_MAX_SECONDS": "60",
    # Fewer threads than the default 16: a 2-core machine runs the whole stack.
    "WEBHOOK_MAX_CONCURRENCY": "4",
    "REAUDIT_WORKER_CONCURRENCY": "4",
    # The night's catch-up republishes placements Redis lost once they are overdue by
    # 1.5 of this (default 1800 s: 45 min); it must exceed the slice length.
    "REAUDIT_VISIBILITY_TIMEOUT_SECONDS": "120",
    "REAUDIT_SLICE_SECONDS": "60",
}
OUTAGE_EVERY, OUTAGE_SECONDS = 180.0, 20.0
FAIL_SHARE, HANG_SHARE, HANG_SECONDS = 0.05, 0.01, 8.0
RECEIVER_DOWN_EVERY, RECEIVER_DOWN_SECONDS = 150.0, 30.0
REDIS_DOWN_SECONDS = 10.0
CALLBACK_SECRET = "whsec_" + base64.b64encode(b"plumb-soak-secret-0123456789abcd").decode()


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


# --- the webhook receiver -------------------------------------------------------------
class CallbackReceiver:
    """The submissions' callback URL. Down now and then: its port closed (connection
    refused), then a new receiver on the same port; what arrived at each is kept."""

    def __init__(self):
        self.port = devservices.free_port()
        self.receivers: list[Receiver] = []
        self.current: Receiver | None = None
        self.downs = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def up(self) -> None:
        if self.current is None:
            self.current = Receiver(port=self.port).start()
            self.receivers.append(self.current)

    def down(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None
            self.downs += 1

    def requests(self) -> int:
        return sum(len(receiver.requests) for receiver in self.receivers)

    def delivered_audit_ids(self) -> set[str]:
        """Audits whose `audit.finished` was answered 2xx at least once."""
        delivered = set()
        for receiver in self.receivers:
            with receiver.lock:
                arrived = [r.body for r in receiver.requests if 200 <= r.status < 300]
            for body in arrived:
                message = json.loads(body)
                if message.get("type") == "audit.finished":
                    delivered.add(str(message["data"]["id"]))
        return delivered


# --- the stack ------------------------------------------------------------------------
class MemorySampler(threading.Thread):
    """The peak RSS per role: of its main process, of any one other process, of the group."""

    def __init__(self, processes: list[SessionProcess], extra: Callable[[], dict[str, int]]):
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
            for role, pid in self.extra().items():
                peak = self.peaks[role]
                peak["main"] = peak["group"] = max(peak["main"], rss_kib(pid))


# --- the load -------------------------------------------------------------------------
class Load:
    """Submits audits and records every answer: outcome, latency, the audit id if admitted."""

    def __init__(
        self, api: str, downstream: Downstream, receiver: CallbackReceiver, callback_share: float
    ):
        import httpx2

        self.api, self.downstream, self.receiver = api, downstream, receiver
        self.callback_share = callback_share
        self.client = httpx2.Client(timeout=30, limits=httpx2.Limits(max_connections=64))
        self.pool = ThreadPoolExecutor(max_workers=48)
        self.lock = threading.Lock()
        self.outcomes: Counter = Counter()
        self.latencies: dict[str, list[float]] = {"steady": [], "burst": []}
        self.admitted: list[str] = []
        self.with_callback: set[str] = set()
        self.number = 0

    def submit(self, client_ip: str, *, kind: str = "steady") -> None:
        with self.lock:
            self.number += 1
            number = self.number
        body = {"url": f"{self.downstream.base_url}/page/{number}"}
        # Every n-th steady submission, evenly spread: a share, the same on every run.
        if (
            kind == "steady"
            and self.callback_share
            and number % round(1 / self.callback_share) == 0
        ):
            body.update(callback_url=self.receiver.url, callback_secret=CALLBACK_SECRET)
        self.pool.submit(self._submit, client_ip, body, kind)

    def _submit(self, client_ip: str, body: dict, kind: str) -> None:
        began = time.perf_counter()
        try:
            response = self.client.post(
                f"{self.api}/api/audits", json=body, headers={"X-Forwarded-For": client_ip}
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
                if "callback_url" in body:
                    self.with_callback.add(audit_id)

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
    if response.status_code == 503 and code:
        # Redis or the database away (admission_unavailable, database_unavailable): a
        # clear refusal the client retries after Retry-After, never a 500.
        return f"unavailable: {code}", None
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


# --- the faults on a schedule ---------------------------------------------------------
@dataclass
class Fault:
    at: float  # seconds after the load started
    name: str
    action: Callable[[], object]


def fault_schedule(load_seconds: float, rounds: int, *, broker, cluster: PgCluster,
                   receiver: CallbackReceiver, sentinel: bool, night: Callable[[], object]) -> list[Fault]:  # fmt: skip
    """Each round (an equal share of the load) has a Redis restart, a PostgreSQL restart
    and, with --sentinel, a Sentinel failover; the last also a PostgreSQL failover (once:
    the promoted replica has no replica of its own). The night starts at 0.1 of the load,
    the receiver is down 30 s of every 150 s."""
    share = load_seconds / rounds
    faults = [Fault(0.1 * load_seconds, "night fanned out", night)]
    for number in range(rounds):
        # 15 s past the round's fractions: between a SIGKILL (each minute) and a burst (each
        # half past), so what each fault costs can be told apart in the logs.
        start = number * share + 15
        faults += [
            Fault(start + 0.2 * share, "Redis stopped, started again empty",
                  lambda: broker.restart_empty(REDIS_DOWN_SECONDS)),
            Fault(start + 0.4 * share, "PostgreSQL primary restarted", cluster.primary.restart),
        ]  # fmt: skip
        if number == rounds - 1:
            faults.append(Fault(start + 0.6 * share, "PostgreSQL primary killed, replica promoted",
                                cluster.fail_over))  # fmt: skip
        if sentinel:
            faults.append(
                Fault(start + 0.8 * share, "Sentinel failover", lambda: broker.fail_over())
            )
    down = RECEIVER_DOWN_EVERY - RECEIVER_DOWN_SECONDS
    while down < load_seconds:
        faults += [Fault(down, "receiver down", receiver.down),
                   Fault(down + RECEIVER_DOWN_SECONDS, "receiver up", receiver.up)]  # fmt: skip
        down += RECEIVER_DOWN_EVERY
    # The receiver comes back after the load in any case (main).
    return sorted(
        (fault for fault in faults if fault.at < load_seconds), key=lambda fault: fault.at
    )


class FaultRunner(threading.Thread):
    """Runs each fault at its time, beside the load; a fault that fails is reported, not fatal."""

    def __init__(self, faults: list[Fault], started: float):
        super().__init__(daemon=True)
        self.faults, self.started = faults, started
        self.done: list[tuple[float, str, float, str]] = []  # at, name, seconds it took, error
        self.stopped = threading.Event()

    def run(self) -> None:
        from django.db import connections

        for fault in self.faults:
            if self.stopped.wait(max(0.0, self.started + fault.at - time.monotonic())):
                return
            began = time.monotonic()
            try:
                fault.action()
                error = ""
            except Exception as exc:  # noqa: BLE001 - the soak goes on and reports it
                error = f"{exc.__class__.__name__}: {exc}"
            took = time.monotonic() - began
            self.done.append((began - self.started, fault.name, took, error))
            print(f"  {began - self.started:6.0f} s  {fault.name} ({took:.1f} s){'  FAILED ' + error if error else ''}",
                  flush=True)  # fmt: skip
            connections.close_all()  # the night's fan-out used this thread's connection


def sentinel_broker():
    """--sentinel: Redis behind Sentinel (bench.services.SentinelRedis), failed over in
    each round."""
    return SentinelRedis()


# --- the night ------------------------------------------------------------------------
def make_night_pages(downstream: Downstream, pages: int) -> None:
    """Pages marked for the nightly re-audit, five to a domain (domains are spaced)."""
    from audits.models import Page

    domains = max(1, pages // 5)
    Page.objects.bulk_create(
        Page(url=f"{downstream.base_url}/night/{n}", domain=f"night-{n % domains}.test", reaudit_nightly=True)
        for n in range(pages)
    )  # fmt: skip


def fan_out_night(day: date, window_seconds: float) -> None:
    """The night as beat starts it at REAUDIT_HOUR, with a window inside the soak."""
    from reaudit import services
    from reaudit.tasks import NIGHT_TASKS

    window = max(10, int(window_seconds))
    services.fan_out(
        day,
        night_tasks=NIGHT_TASKS,
        window_seconds=window,
        slice_seconds=max(5, min(int(STACK_ENV["REAUDIT_SLICE_SECONDS"]), window // 10)),
        spacing_seconds=min(10.0, window / 20),
    )


def account_night(day: date) -> dict:
    """Every page placed in the night: re-audited (its audit finished or dead-lettered), once."""
    from audits.models import Audit
    from jobs.models import DeadLetter
    from reaudit.models import FanOut, Placement
    from reaudit.services import placement_key

    night = FanOut.objects.filter(day=day).first()
    if night is None:
        return {"night_pages": 0, "night_reaudited": 0, "night_not_reaudited": 0,
                "night_more_than_once": 0, "night_not_reaudited_ids": [], "night_started": False}  # fmt: skip
    page_ids = list(Placement.objects.filter(fan_out=night).values_list("page_id", flat=True))
    keys = [placement_key(page_id, day) for page_id in page_ids]
    audits = {
        page_id: (status, task_id)
        for page_id, status, task_id in Audit.objects.filter(idempotency_key__in=keys).values_list(
            "page_id", "status", "task_id"
        )
    }
    dead = set(
        DeadLetter.objects.filter(task_name="audits.run_audit").values_list("task_id", flat=True)
    )
    not_reaudited = [
        page_id for page_id in page_ids
        if page_id not in audits or (audits[page_id][0] not in Audit.FINISHED and audits[page_id][1] not in dead)
    ]  # fmt: skip
    per_page = Counter(
        Audit.objects.filter(
            trigger=Audit.Trigger.REAUDIT, page_id__in=page_ids, created_at__gte=night.window_start
        ).values_list("page_id", flat=True)
    )
    return {
        "night_started": True,
        "night_pages": len(page_ids),
        "night_reaudited": len(page_ids) - len(not_reaudited),
        "night_not_reaudited": len(not_reaudited),
        "night_not_reaudited_ids": not_reaudited[:20],
        "night_more_than_once": sum(1 for count in per_page.values() if count > 1),
        "night_audits_run_more_than_once": Audit.objects.filter(idempotency_key__in=keys, attempts__gt=1).count(),
    }  # fmt: skip


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


def account_deliveries(with_callback: set[str], receiver: CallbackReceiver) -> dict:
    """Each finished audit with a callback owes one `audit.finished` delivery: arrived (a 2xx
    at the receiver), given up (failed after WEBHOOK_MAX_ATTEMPTS) or lost (neither)."""
    from audits.models import Audit
    from webhooks.models import Delivery

    owed = {
        str(audit_id)
        for audit_id in Audit.objects.filter(id__in=with_callback, status__in=Audit.FINISHED).values_list(
            "id", flat=True
        )
    }  # fmt: skip
    arrived = receiver.delivered_audit_ids() & owed
    gave_up = {
        str(audit_id)
        for audit_id in Delivery.objects.filter(
            audit_id__in=owed, event=Delivery.Event.FINISHED, status=Delivery.Status.FAILED
        ).values_list("audit_id", flat=True)
    } - arrived
    lost = owed - arrived - gave_up
    return {
        "deliveries_owed": len(owed),
        "deliveries_arrived": len(arrived),
        "deliveries_gave_up": len(gave_up),
        "deliveries_lost": len(lost),
        "deliveries_lost_ids": sorted(lost)[:20],
        "receiver_requests": receiver.requests(),
        "receiver_downs": receiver.downs,
    }


def wait_for_drain(load: Load, receiver: CallbackReceiver, day: date, timeout: float) -> float:
    """Until every admitted audit, every delivery owed and every page of the night is done."""
    from django.db import connections

    began = reported = time.monotonic()
    while time.monotonic() - began < timeout:
        # A script has no request to run Django's connection health checks: a connection
        # the PostgreSQL restart or failover killed would fail the next query.
        connections.close_all()
        audits = account(load.admitted)
        deliveries = account_deliveries(load.with_callback, receiver)
        night = account_night(day)
        if not (audits["lost"] or deliveries["deliveries_lost"] or night["night_not_reaudited"]):
            break
        if time.monotonic() - reported >= 60:
            reported = time.monotonic()
            print(f"  drain {reported - began:4.0f} s: audits unfinished {audits['lost']}, deliveries not arrived "
                  f"{deliveries['deliveries_lost']}, night pages not re-audited {night['night_not_reaudited']}",
                  flush=True)  # fmt: skip
        time.sleep(5)
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
        (
            "load",
            f"{results['minutes']:g} min; {results['kills']} SIGKILLs; {len(results['faults'])} other faults",
        ),
        ("submitted", results["submitted"]),
        ("admitted", outcomes.get("admitted", 0)),
        ("refused: ip bucket (429)", outcomes.get("refused_ip", 0)),
        ("refused: backlog full (503)", outcomes.get("refused_backlog", 0)),
    ]
    rows += [(f"refused: {k}", v) for k, v in outcomes.items() if k.startswith("unavailable")]
    rows += [(f"other answer: {k}", v) for k, v in outcomes.items() if k.startswith("error")]
    rows += [
        ("completed (succeeded)", results["completed"]),
        ("failed, each dead-lettered", f"{results['failed']} ({results['dead_lettered']} dead letters)"),
        ("lost", results["lost"]),
        ("webhook deliveries owed / arrived", f"{results['deliveries_owed']} / {results['deliveries_arrived']}"),
        ("webhook deliveries given up (failed) / lost", f"{results['deliveries_gave_up']} / {results['deliveries_lost']}"),
        ("receiver: requests, times down", f"{results['receiver_requests']}, {results['receiver_downs']}"),
        ("night: pages / re-audited / not re-audited", f"{results['night_pages']} / {results['night_reaudited']} / {results['night_not_reaudited']}"),
        ("night: pages re-audited more than once", results["night_more_than_once"]),
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
    print("\nfaults (seconds into the load, what, how long it took)")
    for at, name, took, error in results["faults"]:
        print(f"  {at:6.0f} s  {name} ({took:.1f} s){'  FAILED ' + error if error else ''}")
    for key in ("lost_ids", "deliveries_lost_ids", "night_not_reaudited_ids"):
        if results.get(key):
            print(f"{key}: {', '.join(map(str, results[key]))}")
    print("\npeak resident memory (MiB): main process / largest other process / whole group")
    for role, peak in sorted(results["memory_kib"].items()):
        cells = [f"{peak.get(k, 0) / 1024:6.1f}" for k in ("main", "child", "group")]
        print(f"  {role:<18} {' / '.join(cells)}")


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
    parser.add_argument(
        "--callback-share",
        type=float,
        default=0.25,
        help="share of steady submissions with a callback_url",
    )
    parser.add_argument("--night-pages", type=int, default=300, help="pages marked for the night")
    parser.add_argument(
        "--night-window",
        type=float,
        default=1200.0,
        help="the night's window at most, seconds (else half the load)",
    )
    parser.add_argument(
        "--fault-rounds",
        type=int,
        default=None,
        help="rounds of Redis/PostgreSQL faults (default: one per 20 minutes, at least one)",
    )
    parser.add_argument(
        "--sentinel",
        action="store_true",
        help="Redis behind Sentinel, with a Sentinel failover in each round (see sentinel_broker)",
    )
    parser.add_argument("--drain-timeout", type=float, default=600.0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()  # fmt: skip
    load_seconds = args.minutes * 60
    rounds = args.fault_rounds or max(1, int(args.minutes // 20))

    broker = sentinel_broker() if args.sentinel else PrivateRedis()
    cluster = PgCluster()
    processes: list[SessionProcess] = []
    downstream = Downstream()
    receiver = CallbackReceiver()
    logs = Path(tempfile.mkdtemp(prefix="plumb-soak-"))
    try:
        broker.start()
        cluster.start()
        cluster.create_database("plumb")
        env = {
            **os.environ, **STACK_ENV, **broker.stack_env(), "DATABASE_URL": cluster.database_url("plumb"),
            "AUDIT_QUEUE_MAX_DEPTH": str(args.backlog_max), "WEB_PORT": str(devservices.free_port()),
        }  # fmt: skip
        os.environ.update(env)
        threading.Thread(target=downstream.serve_forever, daemon=True).start()
        receiver.up()

        import django

        django.setup()
        from django.conf import settings
        from django.core.management import call_command
        from django.db import connections
        from django.utils import timezone

        from devstack.management.commands.runstack import stack_commands

        call_command("migrate", interactive=False, verbosity=0)
        make_night_pages(downstream, args.night_pages)
        day = timezone.now().date()
        commands = stack_commands()
        wanted = {
            name: command
            for name, command in commands.items()
            if name in ("web", "beat", "worker-reaudit", "worker-webhooks")
            or name.startswith("worker-audits")
        }
        processes = [SessionProcess(role, command, env, logs) for role, command in wanted.items()]
        for process in processes:
            process.start()
        api = f"http://{settings.WEB_HOST}:{settings.WEB_PORT}"
        wait_until_up(api, logs)
        sampler = MemorySampler(
            processes, lambda: {"soak (this script)": os.getpid(), **broker.pids()}
        )
        sampler.start()
        print(f"stack up (logs in {logs}, PostgreSQL in {cluster.root}); load for {args.minutes:g} min",
              flush=True)  # fmt: skip

        load = Load(api, downstream, receiver, args.callback_share)
        workers = [p for p in processes if p.name.startswith("worker-audits")]
        started = time.monotonic()
        night_window = min(0.5 * load_seconds, args.night_window)
        faults = FaultRunner(
            fault_schedule(load_seconds, rounds, broker=broker, cluster=cluster, receiver=receiver,
                           sentinel=args.sentinel, night=lambda: fan_out_night(day, night_window)),
            started,
        )  # fmt: skip
        faults.start()
        kills = run_load(load, args, workers, started + load_seconds)
        faults.stopped.set()
        faults.join()
        receiver.up()  # if the load ended while it was down
        load.drain()
        print(f"load done: {len(load.admitted)} admitted; waiting for the drain", flush=True)
        drained = wait_for_drain(load, receiver, day, args.drain_timeout)
        sampler.stopped.set()
        sampler.join()

        connections.close_all()
        results = {
            "minutes": args.minutes,
            "kills": len(kills),
            "faults": faults.done,
            "submitted": sum(load.outcomes.values()),
            "outcomes": dict(load.outcomes),
            **account(load.admitted),
            **account_deliveries(load.with_callback, receiver),
            **account_night(day),
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
            args.json.write_text(json.dumps(results, indent=2, default=str))
        failed = (
            results["lost"] or results["deliveries_lost"] or results["night_not_reaudited"]
            or not results["night_started"]
        )  # fmt: skip
        return 1 if failed else 0
    finally:
        for process in processes:
            if process.popen is not None:
                process.stop()
        downstream.shutdown()
        receiver.down()
        if "django.db" in sys.modules:  # Django was set up
            from django.db import connections

            connections.close_all()
        cluster.close()
        broker.stop()


def wait_until_up(api: str, logs: Path, timeout: float = 60.0) -> None:
    import httpx2

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx2.get(f"{api}/healthz", timeout=2).status_code == 200:
                return
        except httpx2.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the stack did not come up within {timeout:g} s; see {logs}")


if __name__ == "__main__":
    sys.exit(main())
