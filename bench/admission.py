#!/usr/bin/env python
"""What admission costs, and what each way of counting the backlog gives, in one run.

    REDIS_URL=redis://127.0.0.1:6379/11 \\
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/plumb \\
    .venv/bin/python bench/admission.py --flush

1. The cost of one backlog check with 100 and with 100,000 messages held in
   `unacked:audits` (retries in backoff), for the chosen check and the alternatives.
2. Requests per second of POST /api/audits through the WSGI app (Django's test
   client, in process: no HTTP server to add noise), with admission on (the script, and
   the client's share checked in the submission's own statement), with the client's
   holding read in a statement of its own before the script, as until 2026-12-07, with
   a script that decides nothing in the admission script's place (admission's round trip
   alone: the floor of admission as a round trip of its own), and with no admission (no
   script, the statement reading no holding), in turn request by request.
3. A fail-fast outage: a real `celery worker` (4 slots, started with the tests'
   `WorkerProcess`) whose every audit fails at once (a 500 from the demo site), the
   cap at 20, and 100 submissions paced at 5 per second; how many each count admits.
4. What a client holds (admission.client_holding, the fair share's count each
   submission reads), against the same count planned on every call, against the checks
   counted in full (before 2026-12-07) and against the one join before that, alternated,
   at holdings of 10 and 100, and for a client far past its share (5,000 entries: the
   chosen count stops at the share, 100).

It creates its own database on the DATABASE_URL server (Django's test-database
machinery, bench.inprocess: `..._bench_admission`) and drops it at the end. The check reads
the broker's own keys, so REDIS_URL must name a Redis database it may empty:
it refuses a non-empty one unless given --flush.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# As a deployment runs (devstack runstack): with DEBUG on, Django logs every query, and the
# client's holding is bound client-side for that log instead of prepared (jobs.sql), so the
# admission measured more than a deployment pays.
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", "bench-admission-" + secrets.token_urlsafe(48))

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402

from audits import admission  # noqa: E402
from audits.api import views  # noqa: E402
from audits.models import Audit, LinkCheck, Page  # noqa: E402
from audits.tasks import run_audit  # noqa: E402
from bench.inprocess import own_stores  # noqa: E402
from config.celery_app import queue_list_keys, unacked_key_for_queue  # noqa: E402
from config.redis import REDIS_NOW_LUA, lua  # noqa: E402
from devstack.demo_site import DemoSite  # noqa: E402
from jobs.backlog import backlog_snapshot  # noqa: E402
from jobs.sql import fetch_one  # noqa: E402
from tests.workers import WorkerProcess  # noqa: E402

HELD_COUNTS = (100, 100_000)
QUEUE = settings.AUDIT_QUEUE
UNACKED = unacked_key_for_queue(QUEUE)
QUEUE_KEYS = queue_list_keys(QUEUE)
IN_BACKOFF_KEY = "bench:audits:in_backoff"


# --- the backlog counts compared ------------------------------------------------------


def waiting_only(client) -> int:
    with client.pipeline(transaction=False) as pipe:
        for key in QUEUE_KEYS:
            pipe.llen(key)
        return sum(pipe.execute())


_IN_BACKOFF_REGISTRY = lua(
    REDIS_NOW_LUA
    + """
local waiting = 0
for i = 2, #KEYS do waiting = waiting + redis.call('LLEN', KEYS[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', redis_now() - tonumber(ARGV[1]))
return waiting + redis.call('ZCARD', KEYS[1])
"""
)


def in_backoff_registry(client) -> int:
    """A sorted set of audits in backoff (added before a retry, removed at start)."""
    return _IN_BACKOFF_REGISTRY(keys=[IN_BACKOFF_KEY, *QUEUE_KEYS], args=[300], client=client)


def retrying_rows(client) -> int:
    return waiting_only(client) + Audit.objects.filter(status=Audit.Status.RETRYING).count()


def unacked_scan(client) -> int:
    """Every held message read and decoded; keep the audits that carry an ETA."""
    held = 0
    for _, raw in client.hscan_iter(UNACKED, count=1000):
        message, _, _ = json.loads(raw)
        headers = message.get("headers") or {}
        if headers.get("task") == run_audit.name and headers.get("eta"):
            held += 1
    return waiting_only(client) + held


def chosen_snapshot(client) -> int:
    return backlog_snapshot(QUEUE, client).backlog


def chosen_admission(client) -> int:
    """The whole admission script: bucket, backlog and counting, one round trip."""
    return admission.admit_submission("10.0.0.1", client=client).backlog


CHECKS = {
    "chosen: admission script (bucket + LLEN x4 + HLEN - running + ZCARD x2 + count)": (
        chosen_admission
    ),
    "chosen: backlog snapshot alone (GET /api/queue)": chosen_snapshot,
    "waiting only (LLEN x4)": waiting_only,
    "registry of audits in backoff (ZSET) + LLEN x4": in_backoff_registry,
    "Audit rows in `retrying` (SQL COUNT) + LLEN x4": retrying_rows,
    "scan of unacked:audits (HSCAN + decode) + LLEN x4": unacked_scan,
}


# --- populating held messages ---------------------------------------------------------


def a_held_retry_payload(client) -> bytes:
    """A real retry message as kombu holds it: [message, exchange, routing_key]."""
    capture = "bench:capture"
    run_audit.apply_async(
        args=["6f1f5b8e-0000-4000-8000-000000000000"], queue=capture, countdown=60
    )
    message = client.rpop(capture)
    client.delete(capture)
    return json.dumps([json.loads(message), "", QUEUE]).encode()


def stored(key: str, held: int) -> str:
    return f"bench:{held}:{key}"


def prepare_held_sets(client) -> None:
    """Both sizes built once, kept under side keys and swapped in with RENAME (O(1))."""
    payload = a_held_retry_payload(client)
    now = time.time()
    for held in HELD_COUNTS:
        for start in range(0, held, 10_000):
            with client.pipeline(transaction=False) as pipe:
                for n in range(start, min(held, start + 10_000)):
                    pipe.hset(stored(UNACKED, held), f"tag-{n}", payload)
                    pipe.zadd(stored(IN_BACKOFF_KEY, held), {f"audit-{n}": now + 3600})
                pipe.execute()
    page = Page.objects.create(url="https://bench.example/", domain="bench.example")
    Audit.objects.bulk_create(
        [Audit(page=page, status=Audit.Status.SUCCEEDED) for _ in range(max(HELD_COUNTS))],
        batch_size=5000,
    )


def hold_in_redis(client, held: int, *, previous: int | None) -> None:
    for key in (UNACKED, IN_BACKOFF_KEY):
        if previous is not None:
            client.rename(key, stored(key, previous))
        client.rename(stored(key, held), key)
    assert client.hlen(UNACKED) == held


def hold_in_database(held: int) -> None:
    Audit.objects.update(status=Audit.Status.SUCCEEDED)
    retrying = Audit.objects.order_by("id").values("id")[:held]
    Audit.objects.filter(id__in=retrying).update(status=Audit.Status.RETRYING)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            # Settle the bulk update (dead rows, statistics) before timing a read.
            cursor.execute(f"VACUUM ANALYZE {Audit._meta.db_table}")
    assert Audit.objects.filter(status=Audit.Status.RETRYING).count() == held


def measure(checks, client, *, switch, rounds: int, calls: int, into: dict) -> None:
    """Alternate the sizes every `calls` calls, so machine noise hits both sizes alike."""
    for check in checks.values():
        check(client)  # warm: script loaded, connection open, query planned
    for _ in range(rounds):
        for held in HELD_COUNTS:
            switch(held)
            for name, check in checks.items():
                for _ in range(calls):
                    started = time.perf_counter()
                    check(client)
                    into[name][held].append(time.perf_counter() - started)


def bench_check_costs(client) -> dict[str, dict[int, float]]:
    """Median microseconds per call of each check at each size."""
    settings.AUDIT_SUBMIT_BURST = 10**9
    settings.AUDIT_QUEUE_MAX_DEPTH = 10**9
    prepare_held_sets(client)
    client.lpush(QUEUE, *[b"waiting"] * 10)
    samples = {name: {held: [] for held in HELD_COUNTS} for name in CHECKS}
    current = {"held": None}

    def switch_redis(held: int) -> None:
        hold_in_redis(client, held, previous=current["held"])
        current["held"] = held

    slow = {retrying_rows, unacked_scan}
    fast = {name: check for name, check in CHECKS.items() if check not in slow}
    measure(fast, client, switch=switch_redis, rounds=40, calls=25, into=samples)
    scan = {name: check for name, check in CHECKS.items() if check is unacked_scan}
    measure(scan, client, switch=switch_redis, rounds=3, calls=1, into=samples)
    rows = {name: check for name, check in CHECKS.items() if check is retrying_rows}
    measure(rows, client, switch=hold_in_database, rounds=3, calls=20, into=samples)
    client.flushdb()
    Audit.objects.all().delete()
    Page.objects.all().delete()
    return {
        name: {held: statistics.median(values) * 1e6 for held, values in by_held.items()}
        for name, by_held in samples.items()
    }


# --- endpoint throughput --------------------------------------------------------------


# Admission's round trip with nothing decided: the floor of admission as a round trip of its
# own (the bench's "floor" mode). It answers as the script does when it admits.
ADMIT_DECIDING_NOTHING = lua("return {'admitted', '0', 0, 0, 0}")


def bench_throughput(client, *, requests: int = 4800) -> dict:
    """POST /api/audits with admission on, with the client's holding read before the
    script in a statement of its own (as until 2026-12-07), with a script that decides
    nothing in the admission script's place (the floor: the round trip, the keys and
    arguments sent, the answer read, the share read in the statement), and with admission
    off, in turn request by request, so load from elsewhere on the machine falls on all
    four alike. With the holding read apart, and with admission off, the audit is
    submitted for no client (""), whose holding the submission's statement does not read."""
    settings.AUDIT_SUBMIT_BURST = 10**9
    settings.AUDIT_QUEUE_MAX_DEPTH = 10**9
    http = Client(HTTP_HOST="localhost")
    admit, client_key = views.admit, admission.client_key

    def admit_reading_the_holding_apart(request, client):
        admission.client_holding(client_key(request))
        return admit(request, client)

    def admit_deciding_nothing(request, client):
        # The same keys and arguments sent, the same answer read: only the script's work is gone.
        admission._ADMIT = ADMIT_DECIDING_NOTHING
        try:
            return admit(request, client)
        finally:
            admission._ADMIT = admit_script

    admit_script = admission._ADMIT
    modes = {
        "on": (admit, client_key),
        "before": (admit_reading_the_holding_apart, lambda request: ""),
        "floor": (admit_deciding_nothing, client_key),
        "off": (lambda request, client: None, lambda request: ""),
    }
    orders = list(itertools.permutations(modes))
    latencies: dict[str, list[float]] = {mode: [] for mode in modes}
    # The request's CPU: the test client runs the whole request in this thread.
    cpu: dict[str, list[float]] = {mode: [] for mode in modes}

    def post(n: int) -> tuple[float, float]:
        started, started_cpu = time.perf_counter(), time.thread_time()
        response = http.post(
            "/api/audits",
            data=json.dumps({"url": f"https://bench.example/{n}"}),
            content_type="application/json",
        )
        elapsed, used = time.perf_counter() - started, time.thread_time() - started_cpu
        assert response.status_code == 202, response.content[:300]
        return elapsed, used

    try:
        for n in range(-300, requests):  # the first 300: warm-up, not recorded
            # Each mode follows each other mode as often: a request after one with admission
            # off ran slower than its mode's others, whichever mode it was.
            mode = orders[(n // len(modes)) % len(orders)][n % len(modes)]
            views.admit, admission.client_key = modes[mode]
            elapsed, used = post(n)
            if n >= 0:
                latencies[mode].append(elapsed)
                cpu[mode].append(used)
            if n % 500 == 0:
                client.delete(*QUEUE_KEYS)
            if n % 100 == 0:
                # The one submitting client holds at most a default share (100) of audits.
                Audit.objects.filter(status=Audit.Status.QUEUED).update(
                    status=Audit.Status.SUCCEEDED
                )
    finally:
        views.admit, admission.client_key = admit, client_key
    Audit.objects.all().delete()
    Page.objects.all().delete()
    client.flushdb()
    rate = {mode: len(values) / sum(values) for mode, values in latencies.items()}
    return {
        **rate,
        "cost": 1 - rate["on"] / rate["off"],
        "cost_before": 1 - rate["before"] / rate["off"],
        "cost_floor": 1 - rate["floor"] / rate["off"],
        "median_ms": {mode: statistics.median(values) * 1e3 for mode, values in latencies.items()},
        "cpu_us": {mode: statistics.fmean(values) * 1e6 for mode, values in cpu.items()},
        "requests": requests,
    }


# --- a client's holding ---------------------------------------------------------------

HOLDINGS = (10, 100)
HOLDER = "ip:192.0.2.1"
CHECKS_PER_AUDIT = 10
# A client far past its share (the default, 100): its audits' link checks took it there,
# which the share does not refuse. 50 audits checking links, each waiting on 100 checks.
FAR_PAST = (50, 100)

# What client_holding ran before (2026-12-06): one join of every unfinished audit of the
# client to its link checks, bound client-side like every Django statement, so parsed
# and planned on each call.
_A, _C, _UNFINISHED = admission._A, admission._C, admission._sql_list(Audit.UNFINISHED)
ONE_JOIN_SQL = f"""
SELECT
  COUNT(DISTINCT {_A}."id") FILTER (WHERE {_A}."status" <> '{Audit.Status.CHECKING_LINKS}'),
  COUNT({_C}."id") FILTER (WHERE {_A}."status" = '{Audit.Status.CHECKING_LINKS}'
      AND {_C}."status" IN ({admission._sql_list(LinkCheck.UNFINISHED)}))
FROM {_A} LEFT OUTER JOIN {_C} ON {_C}."audit_id" = {_A}."id"
WHERE {_A}."client" = %s AND {_A}."status" IN ({_UNFINISHED})
"""
# What client_holding ran before 2026-12-07: the same two counts, the checks counted in
# full however far past its share the client was.
FULL_COUNTS_SQL = f"""
SELECT
  (SELECT COUNT(*) FROM {_A}
    WHERE {admission._UNFINISHED_OF_CLIENT} AND {_A}."status" <> '{Audit.Status.CHECKING_LINKS}'),
  (SELECT COUNT(*) FROM {_A}
    INNER JOIN {_C} ON {_C}."audit_id" = {_A}."id"
    WHERE {admission._UNFINISHED_OF_CLIENT} AND {_A}."status" = '{Audit.Status.CHECKING_LINKS}'
      AND {admission._CHECK_UNFINISHED})
"""


def holding_as_before(client_key: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(ONE_JOIN_SQL, [client_key])
        audits, checks = cursor.fetchone()
    return (audits or 0) + (checks or 0)


def _unprepared(sql: str, params):
    """`sql` bound client-side, as Django binds its statements: parsed and planned on
    every call. `params`: a callable, read at each call (the share follows the settings)."""

    def count() -> int:
        with connection.cursor() as cursor:
            cursor.execute(sql, params())
            return sum(cursor.fetchone())

    return count


def _prepared(sql: str, params: list):
    return lambda: sum(fetch_one(connection, sql, params))


# Each count, and whether it stops at the share (the chosen statement does; the ones before
# it count a holding in full).
HOLDING_COUNTS = {
    "chosen: two counts, the checks up to the share, prepared (admission.client_holding)": (
        lambda: admission.client_holding(HOLDER),
        True,
    ),
    "the same two counts, planned on every call": (
        _unprepared(
            admission.CLIENT_HOLDING_SQL[connection.vendor],
            lambda: admission.holding_params(HOLDER, admission.client_share()),
        ),
        True,
    ),
    "before 2026-12-07: the checks counted in full, prepared": (
        _prepared(FULL_COUNTS_SQL, [HOLDER] * 4),
        False,
    ),
    "before 2026-12-06: one join of audits to checks, planned on every call": (
        lambda: holding_as_before(HOLDER),
        False,
    ),
}


def bench_client_holding(
    *, others: int = 100_000, other_checks: int = 100_000, own_finished: int = 100_000
) -> dict[str, dict[str, float]]:
    """Median microseconds of each count in HOLDING_COUNTS (the per-client count each
    submission adds), alternated, for a client holding 10 and 100 (the default share)
    entries (one audit checking links that waits on 10 checks, and queued audits for the
    rest), and for one far past its share (FAR_PAST: 5,000 entries, which the chosen count
    reads as the share). In the table: `others` unfinished audits of 1,000 other clients,
    of which some wait on `other_checks` link checks in all, and `own_finished` of the
    client's history."""
    # The default share, 100 (the throughput part above raised the cap for its own sake).
    settings.AUDIT_QUEUE_MAX_DEPTH, settings.AUDIT_CLIENT_MAX_SHARE = 1000, 0.1
    page = Page.objects.create(url="https://bench.example/holding", domain="bench.example")

    def audits(count: int, status: str, client=lambda n: HOLDER) -> list[Audit]:
        made = []
        for start in range(0, count, 10_000):
            made += Audit.objects.bulk_create(
                [
                    Audit(page=page, client=client(start + n), status=status)
                    for n in range(min(10_000, count - start))
                ]
            )
        return made

    def checks(of: list[Audit], per_audit: int) -> None:
        LinkCheck.objects.bulk_create(
            (LinkCheck(audit=audit, url=f"https://bench.example/{n}") for audit in of
             for n in range(per_audit)),
            batch_size=10_000,
        )  # fmt: skip

    checking_others = other_checks // 50
    audits(others - checking_others, Audit.Status.QUEUED, client=lambda n: f"ip:other-{n // 100}")
    checks(
        audits(
            checking_others, Audit.Status.CHECKING_LINKS, client=lambda n: f"ip:other-{n % 1000}"
        ),
        50,
    )
    audits(own_finished, Audit.Status.SUCCEEDED)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE audits_audit, audits_linkcheck")
    share = admission.client_share()
    results: dict[str, dict[str, float]] = {name: {} for name in HOLDING_COUNTS}
    far_audits, far_checks = FAR_PAST
    for held in (*HOLDINGS, far_audits * far_checks):
        Audit.objects.filter(client=HOLDER).exclude(status=Audit.Status.SUCCEEDED).delete()
        if held in HOLDINGS:
            checks(audits(1, Audit.Status.CHECKING_LINKS), CHECKS_PER_AUDIT)
            audits(held - CHECKS_PER_AUDIT, Audit.Status.QUEUED)
            label = str(held)
        else:
            checks(audits(far_audits, Audit.Status.CHECKING_LINKS), far_checks)
            label = f"{held} (past the share)"
        timings: dict[str, list[float]] = {name: [] for name in HOLDING_COUNTS}
        for name, (count, stops_at_share) in HOLDING_COUNTS.items():
            assert count() == (min(held, share) if stops_at_share else held), name
        for _ in range(20):
            for name, (count, _stops) in HOLDING_COUNTS.items():
                for _ in range(25):
                    started = time.perf_counter()
                    count()
                    timings[name].append(time.perf_counter() - started)
        for name, values in timings.items():
            results[name][label] = statistics.median(values) * 1e6
    LinkCheck.objects.all().delete()
    Audit.objects.all().delete()
    Page.objects.all().delete()
    return results


# --- a fail-fast outage ---------------------------------------------------------------


def bench_outage(
    client, *, max_depth: int = 20, submissions: int = 100, per_second: int = 5
) -> dict[str, dict]:
    counts = {
        "waiting only (LLEN x4)": waiting_only,
        "Audit rows in `retrying` (SQL COUNT) + LLEN x4": retrying_rows,
        "scan of unacked:audits (HSCAN + decode) + LLEN x4": unacked_scan,
        "chosen: LLEN x4 + HLEN - running + delayed store": None,
    }
    settings.AUDIT_SUBMIT_BURST = 10**9
    settings.AUDIT_QUEUE_MAX_DEPTH = max_depth
    # One client submits everything here: what is measured is the backlog cap, not the
    # client's share of it (a tenth by default: 2 of 20; tests/test_fair_share.py), so
    # its share is out of reach (a hundred times the cap).
    settings.AUDIT_CLIENT_MAX_SHARE = 100.0
    admit_submission = admission.admit_submission
    results = {}
    site = DemoSite().start()
    try:
        for name, count in counts.items():
            if count is not None:
                admission.admit_submission = _admission_counting_with(count, client, max_depth)
            worker = WorkerProcess(
                QUEUE,
                concurrency=4,
                # Retries after 3-5 s, 6-10 s, 12-20 s, 24-40 s: no audit is finished
                # for good within the 20 s of submissions.
                env={"RETRY_BACKOFF_BASE_SECONDS": "4", "AUDIT_MAX_ATTEMPTS": "5"},
            ).start()
            try:
                results[name] = _outage_run(client, site, max_depth, submissions, per_second)
            finally:
                worker.stop()
                admission.admit_submission = admit_submission
                client.flushdb()
                Audit.objects.all().delete()
                Page.objects.all().delete()
    finally:
        site.stop()
    return results


def _admission_counting_with(count, bench_client, max_depth):
    # The view passes `client=None` (the process's own): the count reads the bench's.
    def admit_submission(ip, *, client=None):
        seen = count(client or bench_client)
        outcome = admission.ADMITTED if seen < max_depth else admission.REFUSED_BACKLOG
        return admission.Decision(
            outcome, ip, seen, 0, 0, max_depth, retry_after=10,
            client_share=admission.client_share(),
        )  # fmt: skip

    return admit_submission


def _outage_run(client, site, max_depth: int, submissions: int, per_second: int) -> dict:
    http = Client(HTTP_HOST="localhost")
    admitted, peak = 0, 0
    started = time.perf_counter()
    for n in range(submissions):
        # Slower than the worker fails them, so its lists stay short: the outage's shape.
        time.sleep(max(0.0, started + n / per_second - time.perf_counter()))
        url = f"{site.base_url}/flaky?key=outage-{n}&fail=1000"
        response = http.post(
            "/api/audits", data=json.dumps({"url": url}), content_type="application/json"
        )
        admitted += response.status_code == 202
        peak = max(peak, backlog_snapshot(QUEUE, client).backlog)
    elapsed = time.perf_counter() - started
    finished = Audit.objects.filter(status__in=Audit.FINISHED).count()
    return {"admitted": admitted, "peak_backlog": peak, "seconds": elapsed, "finished": finished}


# --- the run --------------------------------------------------------------------------


def report(costs: dict, throughput: dict, outage: dict, holding: dict) -> str:
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    lines = [f"Load average at the end of the run: {load} ({os.cpu_count()} CPUs)", ""]
    lines += ["## Cost of one check (median microseconds per call)", ""]
    lines.append("| check | 100 held | 100,000 held | ratio |")
    lines.append("| --- | ---: | ---: | ---: |")
    for name, by_held in costs.items():
        small, large = by_held[HELD_COUNTS[0]], by_held[HELD_COUNTS[1]]
        lines.append(f"| {name} | {small:,.0f} | {large:,.0f} | {large / small:.2f}x |")
    lines += ["", "## POST /api/audits through the WSGI app", ""]
    median = throughput["median_ms"]
    lines.append(
        f"{throughput['requests']} requests in turn (every order of the four): admission on {throughput['on']:.0f} req/s, "
        f"admission with the client's holding read apart, as before, {throughput['before']:.0f} req/s, "
        f"its round trip with a script deciding nothing {throughput['floor']:.0f} req/s, "
        f"off {throughput['off']:.0f} req/s; admission costs {throughput['cost'] * 100:.1f} % "
        f"of throughput (as before: {throughput['cost_before'] * 100:.1f} %; the round trip "
        f"deciding nothing: {throughput['cost_floor'] * 100:.1f} %); median latency "
        f"{median['on']:.2f} ms on, {median['before']:.2f} ms as before, "
        f"{median['floor']:.2f} ms deciding nothing, {median['off']:.2f} ms off"
    )
    used = throughput["cpu_us"]
    lines.append(
        f"\nCPU a request (mean, the request's thread): {used['on']:,.0f} us on, "
        f"{used['before']:,.0f} us as before, {used['floor']:,.0f} us deciding nothing, "
        f"{used['off']:,.0f} us off; admission's own {used['on'] - used['off']:,.0f} us (as "
        f"before: {used['before'] - used['off']:,.0f} us; deciding nothing: "
        f"{used['floor'] - used['off']:,.0f} us)"
    )
    lines += ["", "## What a client holds (median microseconds per call)", ""]
    lines.append(
        "100,000 unfinished audits of 1,000 other clients (2,000 of them waiting on "
        "100,000 link checks), 100,000 finished of its own; it holds one audit waiting on "
        f"{CHECKS_PER_AUDIT} checks and queued audits for the rest, or (past its share) "
        f"{FAR_PAST[0]} audits each waiting on {FAR_PAST[1]} checks."
    )
    labels = list(next(iter(holding.values())))
    lines += ["", "| count | " + " | ".join(f"holding {label}" for label in labels) + " |"]
    lines.append("| --- |" + " ---: |" * len(labels))
    for name, by_held in holding.items():
        lines.append(f"| {name} | " + " | ".join(f"{by_held[h]:,.0f}" for h in labels) + " |")
    lines += ["", "## Fail-fast outage: cap 20, 100 submissions at 5/s, 4 worker slots", ""]
    lines.append("| backlog count | admitted | peak backlog | audits finished meanwhile |")
    lines.append("| --- | ---: | ---: | ---: |")
    for name, result in outage.items():
        lines.append(
            f"| {name} | {result['admitted']} | {result['peak_backlog']} | {result['finished']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flush", action="store_true", help="empty REDIS_URL's database first")
    parser.add_argument("--skip-outage", action="store_true", help="skip the worker scenario")
    args = parser.parse_args()

    # Per-request log lines would dominate the output; both modes lose the same cost.
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("django.request").setLevel(logging.CRITICAL)  # the outage's 503s
    with own_stores("bench_admission", flush=args.flush, flag="--flush") as client:
        costs = bench_check_costs(client)
        throughput = bench_throughput(client)
        holding = bench_client_holding()
        outage = {} if args.skip_outage else bench_outage(client)
    print(report(costs, throughput, outage, holding))
    return 0


if __name__ == "__main__":
    sys.exit(main())
