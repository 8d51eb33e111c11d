"""Breakers are keyed by origin (`http://victim.com:8080`), not host (issue 31.3).

The admin's rows of breakers keyed by a bare host mirror Redis keys nothing reads any
more: they go, and so do those keys (best effort: a Redis that cannot be reached now
keeps them, counted by the state gauge as any idle breaker is, and harmless). A task
that was parked by an old breaker wakes at its release time and meets its origin's
breaker, closed until that origin fails again.
"""

import logging

from django.db import migrations, models
from redis import RedisError

from config.redis import redis_client

log = logging.getLogger(__name__)

KEY_PREFIX = "plumb:breaker:"
BREAKERS_KEY = "plumb:breakers"


def is_host_keyed(key: str) -> bool:
    """`plumb:breaker:<task>:<host>`: an origin has a scheme, a host alone has not."""
    _task, _, host = key.removeprefix(KEY_PREFIX).partition(":")
    return "://" not in host


def forget_host_keyed_breakers(apps, schema_editor):
    CircuitBreaker = apps.get_model("jobs", "CircuitBreaker")
    CircuitBreaker.objects.exclude(host__contains="://").delete()
    try:
        client = redis_client()
        stale = [m.decode() for m in client.smembers(BREAKERS_KEY) if is_host_keyed(m.decode())]
        if stale:
            client.delete(*stale, *(f"{key}:window" for key in stale))
            client.srem(BREAKERS_KEY, *stale)
    except RedisError as exc:
        log.warning("breakers.host_keyed_left_in_redis", extra={"error": str(exc)})


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0004_dead_letter_task_failed_index"),
    ]

    operations = [
        migrations.AlterField(
            model_name="circuitbreaker",
            name="host",
            field=models.CharField(
                "origin",
                max_length=255,
                help_text="The origin the breaker guards: scheme://host[:port].",
            ),
        ),
        migrations.RunPython(forget_host_keyed_breakers, migrations.RunPython.noop),
    ]
