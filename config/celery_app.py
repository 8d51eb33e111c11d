"""The Celery application, configured from Django settings (CELERY_* names)."""

from __future__ import annotations

import itertools
import logging
import os
from logging.config import dictConfig
from urllib.parse import urlsplit

from celery import Celery, signals
from celery.fixups.django import DjangoWorkerFixup
from celery.fixups.django import fixup as django_fixup
from django.conf import settings
from django.db import close_old_connections
from kombu.transport.redis import PRIORITY_STEPS, Channel

from config.redis import (
    REQUIRED_SERVER_SETTINGS,
    dedicated_client,
    redis_client,
    unsafe_server_settings,
)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

log = logging.getLogger(__name__)


class ConnectionsKeptBetweenTasks(DjangoWorkerFixup):
    """Celery's Django worker fixup, with Django's own rule for a connection between tasks.

    Celery's closes every connection of the task's thread before and after each task, so
    every audit connected to the database anew and `DB_CONN_MAX_AGE` was never reached.
    Here a task ends as Django ends a request (`close_old_connections`): a connection is
    closed only when it broke, is in a transaction, or is past its age, and checked
    before its next use (`conn_health_checks`); a pooled one (`DB_POOL_MAX_SIZE`, age 0)
    goes back to its pool as before. DECISIONS.md, "A worker thread keeps its database
    connection between tasks".
    """

    def on_task_prerun(self, sender, **kwargs):
        if not getattr(sender.request, "is_eager", False):
            close_old_connections()

    def on_task_postrun(self, sender, **kwargs):
        if not getattr(sender.request, "is_eager", False):
            close_old_connections()
            self.close_cache()


app = Celery("plumb", fixups=[])


@signals.worker_init.connect
def keep_connections_between_tasks(**kwargs):
    """Give Celery's Django fixup the worker fixup above before it installs one: this
    receiver is connected first, so it runs before the fixup's own (`on_worker_init`)."""
    DJANGO_FIXUP.worker_fixup = ConnectionsKeptBetweenTasks(app)


# Celery's Django fixup, installed here rather than by the app's default list for the
# receiver above. Kept in a module global: its receivers are weak references (Celery keeps
# its own fixups alive in the app).
DJANGO_FIXUP = django_fixup(app)
# The default for every thread, not just this one: shared tasks resolve their
# app through it, and a threaded server would otherwise publish to amqp://localhost.
app.set_default()


@app.on_configure.connect
def read_settings_once(sender, **kwargs):
    """Configure Celery from Django's CELERY_* settings, copied into a dict once, when
    the app first reads its configuration (after Django's settings are loaded).

    Given Django's settings object itself ("django.conf:settings"), Celery looked up
    each setting left at its default there on every use, under each of its names, each
    miss an AttributeError raised through LazySettings: a dozen on every publish, 60 us
    of its 340 (DECISIONS.md, "Celery reads its settings from a dict").
    """
    sender.config_from_object(
        {name: getattr(settings, name) for name in dir(settings) if name.startswith("CELERY_")},
        namespace="CELERY",
    )


# Every installed app's `tasks` module, as the worker loads its modules: Celery asks its
# fixups for the apps when given no packages, and this app has none of its own (the Django
# fixup above is installed by hand), so the fixup's list is passed. Without it nothing was
# discovered, and jobs.prune was registered only because Django's system checks, run as a
# worker starts, imported the URLconf (`celery --skip-checks` left it unregistered).
app.autodiscover_tasks(DJANGO_FIXUP.autodiscover_tasks)


def stay_on_plumb_s_transport(alternates: list[str]):
    """The broker connection's failover strategy (Celery's `broker_failover_strategy`).

    Under Sentinel the broker URL lists every sentinel, `;`-separated, which is how
    kombu's Sentinel channel learns them; kombu also takes them for alternate brokers,
    and after a connection error switches to the next by re-parsing its URL, which
    makes the URL's scheme (`sentinel`) the transport: kombu's stock one, without
    Plumb's hooks (the soak's reaudit worker then died in stock `conn_or_acquire` at
    the next outage). The sentinels are not alternates: the channel asks all of them
    for the master on every connect. So a switch names only the first one's host,
    which keeps the connection's transport, credentials and database.
    """
    return itertools.repeat(urlsplit(alternates[0]).hostname or alternates[0])


app.conf.broker_failover_strategy = stay_on_plumb_s_transport
# The worker's own threads, one bootstep each: every worker wakes its queue's delayed
# jobs, one of them samples the gauges each minute for the dashboard, one a tick
# publishes again what Redis lost (jobs.reconcile), and one a sweep an interval runs
# the apps' periodic sweeps (jobs.sweeps). First, a check: a worker logs an error naming
# any task that could outlive its queue's visibility timeout.
app.steps["worker"].add("jobs.bootsteps:TimeLimitCheck")
app.steps["worker"].add("jobs.bootsteps:DelayedWaker")
app.steps["worker"].add("jobs.bootsteps:MinuteSampler")
app.steps["worker"].add("jobs.bootsteps:Reconciler")
app.steps["worker"].add("jobs.bootsteps:Sweeper")
app.steps["worker"].add("jobs.bootsteps:TimeLimitWatchdog")
# The audits worker's tree builders: children that parse large pages within a memory and
# time limit (audits.treebuild).
app.steps["worker"].add("audits.bootsteps:TreeBuilders")


@signals.setup_logging.connect
def use_django_logging(**kwargs):
    """Log through Django's LOGGING so workers write the same key/value lines."""
    dictConfig(settings.LOGGING)


def transport_options_for_queue(queue: str) -> dict:
    """Broker transport options for the workers consuming `queue`.

    kombu's Redis transport keeps every delivered-but-unacked message in one
    `unacked` hash by default, and `restore_visible` puts back *any* message
    held longer than the restoring worker's visibility timeout, whatever its
    queue. Giving each queue's workers their own keys and timeout keeps a
    short-timeout worker from redelivering another queue's long-held messages.
    """
    visibility_timeout = settings.QUEUE_VISIBILITY_TIMEOUTS[queue]
    return {
        **settings.CELERY_BROKER_TRANSPORT_OPTIONS,
        "unacked_key": f"unacked:{queue}",
        "unacked_index_key": f"unacked_index:{queue}",
        "unacked_mutex_key": f"unacked_mutex:{queue}",
        "visibility_timeout": visibility_timeout,
        # Scan for expired messages often enough that a SIGKILLed worker's
        # messages come back within about a tenth of the timeout after it lapses.
        "unacked_restore_interval": max(1, min(10, visibility_timeout // 10)),
        "unacked_restore_throttle": 1,
    }


@signals.worker_process_init.connect
def connect_redis_in_pool_process(**kwargs):
    """Each pool process makes its own Redis client as it starts, never its parent's."""
    redis_client()


@signals.celeryd_init.connect
def configure_worker_for_its_queue(sender=None, conf=None, options=None, **kwargs):
    """Give a worker the transport options of the one queue it consumes (-Q)."""
    queues = (options or {}).get("queues") or []
    if isinstance(queues, str):
        queues = queues.split(",")
    known = [q for q in queues if q in settings.QUEUE_VISIBILITY_TIMEOUTS]
    if len(known) != 1 or len(queues) != 1:
        # SystemExit, not an exception: Celery logs and swallows exceptions
        # raised by signal handlers, and the worker would start misconfigured.
        raise SystemExit(
            f"Plumb workers consume exactly one queue (-Q one of "
            f"{sorted(settings.QUEUE_VISIBILITY_TIMEOUTS)}); got {queues!r}"
        )
    conf.broker_transport_options = transport_options_for_queue(known[0])
    if known[0] == settings.WEBHOOK_QUEUE:
        configure_webhooks_worker(conf, options or {})


@signals.worker_ready.connect
def warn_about_unsafe_redis_settings(**kwargs):
    """Log a warning as the worker starts when Redis may lose or evict queued work.

    A worker's start is where an operator looks (Sidekiq warns there too); worker_ready
    comes after logging is set up. The client is closed at once: no connection of it
    outlives this check."""
    client = dedicated_client()
    try:
        unsafe = unsafe_server_settings(client)
    finally:
        client.close()
    if unsafe:
        log.warning(
            "redis.unsafe_settings",
            extra={"found": unsafe, "required": {k: REQUIRED_SERVER_SETTINGS[k] for k in unsafe}},
        )


def queue_list_keys(queue: str) -> list[str]:
    """The Redis lists kombu keeps for `queue`: the queue's own key for priority 0 and
    queue + '\\x06\\x16' + step for each other priority step (kombu's `_q_for_pri`)."""
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    prefix = options.get("global_keyprefix", "")
    steps = sorted(set(options.get("priority_steps", PRIORITY_STEPS)))
    return [prefix + (f"{queue}{Channel.sep}{step}" if step else queue) for step in steps]


def unacked_key_for_queue(queue: str) -> str:
    """The hash where `queue`'s workers hold delivered, not yet acked messages."""
    options = transport_options_for_queue(queue)
    return options.get("global_keyprefix", "") + options["unacked_key"]


# What WEBHOOK_MAX_CONCURRENCY=0 ("no cap") means for a thread pool: more
# threads than a burst has messages in flight, so the broker, not the pool, limits.
UNCAPPED_WEBHOOK_THREADS = 1000


def configure_webhooks_worker(conf, options: dict) -> None:
    """A webhooks worker runs WEBHOOK_MAX_CONCURRENCY deliveries at once, no more.

    With acks late and prefetch 1 a worker takes a message only when one of
    its threads is free, so this is also how many deliveries it holds.
    """
    cap = settings.WEBHOOK_MAX_CONCURRENCY or UNCAPPED_WEBHOOK_THREADS
    given = options.get("concurrency")
    if given not in (None, "", cap, str(cap)):
        raise SystemExit(
            f"The webhooks worker's concurrency is WEBHOOK_MAX_CONCURRENCY ({cap}); "
            f"drop --concurrency {given} or change the setting."
        )
    conf.worker_concurrency = cap
