#!/usr/bin/env python
"""Writes lost in a `SENTINEL FAILOVER`, by how the Redis servers are configured.

    .venv/bin/python bench/sentinel_failover.py

For each configuration it starts a private Sentinel group on 127.0.0.1
(config.devservices.SentinelGroup: a primary, its replicas, three sentinels), points
Plumb's own Redis client at it (REDIS_SENTINELS), increments one counter every 50 ms
through the failover and for a few seconds after, and compares the increments that
succeeded with the counter the new master holds: the difference is writes acknowledged
and then lost. Also reported: calls that failed (the caller sees an error), and how long
the sentinels took to agree on the new master.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from config.devservices import SentinelGroup  # noqa: E402

MIN_REPLICAS = ("--min-replicas-to-write", "1", "--min-replicas-max-lag", "10")
CONFIGURATIONS = [
    ("1 replica, no min-replicas-to-write", 1, ()),
    ("1 replica, min-replicas-to-write 1", 1, MIN_REPLICAS),
    ("2 replicas, min-replicas-to-write 1", 2, MIN_REPLICAS),
]
CALLS = 200
INTERVAL = 0.05


def measure(replicas: int, redis_args: tuple[str, ...]) -> dict:
    from django.conf import settings

    from config.redis import redis_client

    group = SentinelGroup(
        Path(tempfile.mkdtemp(prefix="plumb-bench-sentinel-")),
        replicas=replicas, extra_redis_args=redis_args,
    ).start()  # fmt: skip
    try:
        settings.REDIS_SENTINEL_ADDRESSES = [("127.0.0.1", p) for p in group.sentinel_ports]
        settings.REDIS_SENTINEL_MASTER = group.MASTER_NAME
        client = redis_client()
        client.set("counter", 0)
        outcome = {"succeeded": 0, "failed": 0}

        def increment():
            for _ in range(CALLS):
                try:
                    client.incr("counter")
                    outcome["succeeded"] += 1
                except Exception:  # noqa: BLE001 - any error is a failed call
                    outcome["failed"] += 1
                time.sleep(INTERVAL)

        thread = threading.Thread(target=increment)
        thread.start()
        time.sleep(0.5)
        started = time.monotonic()
        new_master = group.failover()
        outcome["failover_seconds"] = time.monotonic() - started
        thread.join()
        outcome["kept"] = int(group.client(new_master).get("counter") or 0)
        outcome["lost"] = outcome["succeeded"] - outcome["kept"]
        return outcome
    finally:
        group.stop()


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DEBUG", "true")
    import django

    django.setup()
    print(f"{CALLS} INCR calls, one every {INTERVAL * 1000:.0f} ms, through a SENTINEL FAILOVER\n")
    print("| servers | succeeded | lost after success | failed | failover |")
    print("| --- | --- | --- | --- | --- |")
    for name, replicas, redis_args in CONFIGURATIONS:
        r = measure(replicas, redis_args)
        print(f"| {name} | {r['succeeded']} | {r['lost']} ({r['lost'] / max(1, r['succeeded']):.0%}) "
              f"| {r['failed']} | {r['failover_seconds']:.1f} s |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
