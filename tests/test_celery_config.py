"""Each queue's workers get their own unacked keys and visibility timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

from django.apps import apps as django_apps

from audits.models import Audit
from audits.tasks import enqueue_audit
from config.celery_app import app, queue_list_keys, transport_options_for_queue
from tests.workers import ROOT


def test_each_queue_has_its_own_unacked_keys_and_timeout(settings):
    audits = transport_options_for_queue("audits")
    reaudit = transport_options_for_queue("reaudit")
    assert audits["unacked_key"] == "unacked:audits"
    assert audits["unacked_index_key"] == "unacked_index:audits"
    assert reaudit["unacked_index_key"] == "unacked_index:reaudit"
    assert audits["visibility_timeout"] == settings.AUDITS_VISIBILITY_TIMEOUT_SECONDS
    assert reaudit["visibility_timeout"] == settings.REAUDIT_VISIBILITY_TIMEOUT_SECONDS
    # Restores are scanned well inside the timeout, not kombu's default 100 s.
    assert audits["unacked_restore_interval"] * audits["unacked_restore_throttle"] <= 30


def test_an_audit_is_queued_before_any_worker_declared_its_queue(redis_client):
    # The publish declares nothing (DECISIONS.md, "The audit's publish declares nothing"):
    # Celery sends it by the anonymous exchange, straight onto the queue's list, so a web
    # that starts before any worker, or a Redis that came back empty, still queues it.
    assert not redis_client.keys("_kombu.binding*")
    audit = Audit(id=uuid.uuid4(), task_id=str(uuid.uuid4()), trigger=Audit.Trigger.SUBMITTED)
    assert enqueue_audit(audit)
    assert sum(redis_client.llen(key) for key in queue_list_keys("audits")) == 1


def test_a_worker_for_two_queues_refuses_to_start():
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "audits,reaudit"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, "DEBUG": "true"},
    )  # fmt: skip
    assert result.returncode != 0
    assert "exactly one queue" in result.stdout + result.stderr


# What a worker has registered once it loaded its modules (Celery's loader, as the worker
# runs it at start), in a process of its own: this one imported every task long ago.
# CELERY_SKIP_CHECKS is what `celery --skip-checks` sets: Django's system checks, which a
# worker runs as it starts, import the URLconf and with it modules that define tasks.
REGISTERED_BY_A_WORKER = """
import json
from config.celery_app import app
app.loader.import_default_modules()
print(json.dumps(sorted(name for name in app.tasks if not name.startswith("celery."))))
"""


def test_a_worker_registers_every_task_from_the_apps_tasks_modules(settings):
    """Celery's autodiscovery found nothing (the app has no fixups of its own to ask for
    Django's apps), so a task registered only if something else imported its module:
    with the checks skipped, jobs.prune, the daily retention, was unknown to the worker
    that consumes it and its messages would be refused."""
    loaded = subprocess.run(
        [sys.executable, "-c", REGISTERED_BY_A_WORKER], cwd=ROOT, capture_output=True,
        text=True, timeout=60, env={**os.environ, "DEBUG": "true", "CELERY_SKIP_CHECKS": "true"},
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    registered = set(json.loads(loaded.stdout.strip().splitlines()[-1]))
    # Every task of an installed app that this process knows (pytest-celery, not an app,
    # adds tasks of its own).
    installed = tuple(f"{config.name}." for config in django_apps.get_app_configs())
    ours = {name for name, task in app.tasks.items() if task.__module__.startswith(installed)}
    assert ours <= registered
    assert {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()} <= registered


def test_every_periodic_task_names_a_queue_with_a_visibility_timeout(settings):
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert entry["options"]["queue"] in settings.QUEUE_VISIBILITY_TIMEOUTS


def test_a_worker_reconnects_for_as_long_as_redis_is_away(settings):
    # Celery's default stops a worker after 100 failed reconnects (about 50 minutes),
    # and after any channel error (READONLY from a demoted master): both reconnect.
    assert app.conf.broker_connection_max_retries is None
    assert app.conf.broker_channel_error_retry is True
    options = transport_options_for_queue("webhooks")
    # No broker command waits forever on a connection whose peer vanished.
    assert options["socket_timeout"] == settings.BROKER_SOCKET_TIMEOUT_SECONDS
    assert options["socket_connect_timeout"] == settings.BROKER_CONNECT_TIMEOUT_SECONDS
