"""GET /healthz: can this process reach the database and Redis?"""

from __future__ import annotations

import redis
from django.db import connection
from django.http import JsonResponse

from config.redis import redis_client


def check_database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any failure means "not ok"
        return f"error: {exc.__class__.__name__}"
    return "ok"


def check_redis() -> str:
    try:
        # The process's client: under Sentinel, the current master's.
        redis_client().ping()
    except redis.RedisError as exc:
        return f"error: {exc.__class__.__name__}"
    return "ok"


def healthz(request):
    checks = {"database": check_database(), "redis": check_redis()}
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "unavailable", "checks": checks},
        status=200 if healthy else 503,
    )
