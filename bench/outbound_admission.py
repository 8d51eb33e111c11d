"""How much an admission check costs: the Redis hot copy against the database query.

    DATABASE_URL=postgres://... REDIS_URL=redis://127.0.0.1:6379/10 .venv/bin/python bench/outbound_admission.py

Migrates the database it is given, writes 20,000 observations (keys prefixed
`bench:`) spread over 200 keys and two resources, then times admission reads both
ways in one run and prints the ratio. Removes its rows and Redis keys afterwards.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DEBUG", "true")

import django  # noqa: E402

from bench.services import ensure_database  # noqa: E402

ensure_database()
django.setup()

from django.core.management import call_command  # noqa: E402

from config.redis import redis_client  # noqa: E402
from ratelimit.admission import admit  # noqa: E402
from ratelimit.observations import (  # noqa: E402
    HOT_KEY_PREFIX,
    Kind,
    Observation,
    RateLimitObservation,
    latest_from_database,
    record,
)

ROWS = 20000
READS = 2000
KEYS = [f"bench:installation:{n}" for n in range(200)]


def main() -> None:
    call_command("migrate", verbosity=0)
    rng = random.Random(1)
    now = time.time()
    written = time.perf_counter()
    for n in range(ROWS):
        key = rng.choice(KEYS)
        resource = "graphql" if n % 3 else "core"
        record(Observation(key, resource, now + n * 0.001, Kind.OK, 200, 5000, rng.randint(0, 5000),
                           None, now + 3600))  # fmt: skip
    write_us = (time.perf_counter() - written) / ROWS * 1e6

    def timed(read) -> float:
        started = time.perf_counter()
        for _ in range(READS):
            read(rng.choice(KEYS), "core")
        return (time.perf_counter() - started) / READS * 1e6

    hot_us = timed(lambda key, resource: admit(key, resource))
    database_us = timed(latest_from_database)
    print(f"rows={ROWS} keys={len(KEYS)} reads={READS}")
    print(f"record (Redis merge + INSERT): {write_us:.0f} us per observation")
    print(f"admit from Redis (two buckets read): {hot_us:.0f} us per call")
    print(f"newest row from the database:        {database_us:.0f} us per call")
    print(f"database / Redis: {database_us / hot_us:.1f}x")

    RateLimitObservation.objects.filter(key__startswith="bench:").delete()
    client = redis_client()
    for hot in client.scan_iter(f"{HOT_KEY_PREFIX}bench:*"):
        client.delete(hot)


if __name__ == "__main__":
    main()
