"""Workers warn at start when their Redis may lose or evict queued work."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from config.redis import unsafe_server_settings
from tests.workers import ROOT, wait_for


def test_a_server_that_may_lose_or_evict_work_is_named(start_private_redis):
    client = start_private_redis("--maxmemory-policy", "allkeys-lru").client()  # and no AOF
    assert unsafe_server_settings(client) == {
        "appendonly": "no",
        "maxmemory-policy": "allkeys-lru",
    }


def test_a_server_set_as_documented_passes(start_private_redis):
    client = start_private_redis(
        "--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory-policy", "noeviction"
    ).client()
    assert unsafe_server_settings(client) == {}


def test_a_server_that_refuses_config_get_is_not_an_error(start_private_redis):
    # Managed Redis (ElastiCache, Memorystore) renames or disables CONFIG.
    client = start_private_redis("--rename-command", "CONFIG", "").client()
    assert unsafe_server_settings(client) == {}


@pytest.mark.slow
def test_a_worker_warns_at_start_about_an_unsafe_server(start_private_redis, start_worker):
    unsafe = start_private_redis("--maxmemory-policy", "allkeys-lru")
    worker = start_worker("audits", env={"REDIS_URL": unsafe.url})
    line = wait_for(
        lambda: next((x for x in worker.lines if "redis.unsafe_settings" in x), None),
        timeout=20, message="the warning", show=[worker],
    )  # fmt: skip
    assert "allkeys-lru" in line and "noeviction" in line and "appendonly" in line


def settings_in_subprocess(env: dict, expression: str) -> subprocess.CompletedProcess:
    code = f"import django; django.setup(); from django.conf import settings; print({expression})"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DEBUG": "true", **env},
    )  # fmt: skip


def test_sentinels_make_a_sentinel_broker_with_the_urls_credentials_and_database():
    env = {"REDIS_SENTINELS": "10.0.0.1:26379, 10.0.0.2:26380", "REDIS_URL": "redis://:pw@m/2",
           "REDIS_SENTINEL_MASTER": "plumb"}  # fmt: skip
    result = settings_in_subprocess(
        env, "settings.CELERY_BROKER_URL, settings.CELERY_BROKER_TRANSPORT_OPTIONS['master_name']"
    )
    assert result.stdout.split() == [
        "sentinel://:pw@10.0.0.1:26379/2;sentinel://:pw@10.0.0.2:26380/2",
        "plumb",
    ], result.stderr


def test_a_sentinel_without_a_port_stops_the_process_with_the_variables_name():
    result = settings_in_subprocess({"REDIS_SENTINELS": "sentinel-1"}, "1")
    assert result.returncode != 0
    assert "REDIS_SENTINELS entries are host:port" in result.stderr


def test_a_broker_failover_under_sentinel_keeps_plumb_s_transport():
    # kombu takes the `;`-separated sentinel URLs for alternate brokers and, after a
    # connection error, switches to the next by its scheme: kombu's stock Sentinel
    # transport, without Plumb's hooks (the soak's reaudit worker died in its
    # conn_or_acquire at the next outage). The switch must keep Plumb's transport.
    code = (
        "import django; django.setup()\n"
        "from config.celery_app import app\n"
        "connection = app.connection_for_read()\n"
        "for _ in range(4): connection.maybe_switch_next()\n"
        "print(type(connection.transport).__module__, type(connection.transport).__name__,"
        " connection.virtual_host, connection.password)\n"
    )
    env = {
        **os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DEBUG": "true",
        "REDIS_SENTINELS": "127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381",
        "REDIS_SENTINEL_MASTER": "plumb", "REDIS_URL": "redis://:pw@plumb/3",
    }  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.stdout.split()[-4:] == ["jobs.transport", "SentinelTransport", "3", "pw"], (
        result.stderr
    )
