"""Plumb's settings: every value comes from an environment variable with a safe default.

The defaults run the embedded stack (SQLite and a local Redis); production sets
DATABASE_URL, REDIS_URL, SECRET_KEY and DEBUG=false. docs/configuration.md is the
reference, one row per variable.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from urllib.parse import urlsplit

from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

from config.env import (
    database_config,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_named_secrets,
    env_str,
)
from config.secret_files import kept_secret

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("PLUMB_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)

# The dev key is generated once per checkout and kept in var/, so sessions and
# processes agree on it; its prefix lets us refuse it outside DEBUG.
DEV_SECRET_KEY_PREFIX = "plumb-dev-insecure-"


def _dev_secret_key() -> str:
    generated = DEV_SECRET_KEY_PREFIX + secrets.token_urlsafe(40)
    return kept_secret(VAR_DIR / "dev-secret-key", generated)


SECRET_KEY = env_str("SECRET_KEY", "") or _dev_secret_key()
if not DEBUG and SECRET_KEY.startswith(DEV_SECRET_KEY_PREFIX):
    raise ImproperlyConfigured(
        "SECRET_KEY is the generated development key and DEBUG is off: "
        "set SECRET_KEY to a long random value for this deployment."
    )

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_celery_beat",
    "csp",
    # Plumb's apps, each depending only on those above it.
    "observability",
    "jobs",
    "ratelimit",
    "audits",
    "reaudit",
    "webhooks",
    # `manage.py runstack` (make run / make demo) and the demo site: development only.
    "devstack",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
# Only the admin shows messages, to staff who have a session. The default (cookie, then
# session) builds a cookie signer on every request, API calls included: 4 % of a
# submission's CPU under py-spy.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -----------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'plumb.sqlite3'}")
# A connection pool (PostgreSQL only) bounds the connections one process opens,
# however many threads it runs: a webhooks worker's threads share it, and a
# thread waits at most DB_POOL_TIMEOUT_SECONDS for a connection (PoolTimeout).
DB_POOL_MAX_SIZE = env_int("DB_POOL_MAX_SIZE", 0, minimum=0)
DB_POOL_TIMEOUT_SECONDS = env_float("DB_POOL_TIMEOUT_SECONDS", 10.0, minimum=0.1)
# Each process (a gunicorn worker, a Celery pool process) holds at most one
# connection, kept DB_CONN_MAX_AGE seconds for reuse: the connection count is
# bounded by the process count (docs/workers.md has the budget), not by how
# many retries come due at once.
DATABASES = {
    "default": database_config(
        DATABASE_URL,
        # A pooled connection goes back to the pool at the end of each request
        # or task: Django requires conn_max_age 0 with the pool.
        conn_max_age=0 if DB_POOL_MAX_SIZE else env_int("DB_CONN_MAX_AGE", 60, minimum=0),
        # A kept connection is checked before reuse; with the pool, Django hands this to
        # psycopg_pool as its `check`. Off, the first request after a database restart
        # or failover got a dead pooled connection and failed.
        conn_health_checks=True,
    )
}
# Whether the database is PostgreSQL: its connection options and the web's threads follow.
_ON_POSTGRESQL = DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
if _ON_POSTGRESQL:
    # Django's backend, its kept connections checked on their socket, not with a SELECT 1.
    DATABASES["default"]["ENGINE"] = "config.postgresql"
if DB_POOL_MAX_SIZE and _ON_POSTGRESQL:
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": DB_POOL_MAX_SIZE,
        "timeout": DB_POOL_TIMEOUT_SECONDS,
    }
DB_CONNECT_TIMEOUT_SECONDS = env_int("DB_CONNECT_TIMEOUT_SECONDS", 10, minimum=1)
if _ON_POSTGRESQL:
    # A database that is out of connections fails the task fast (and the
    # task is retried) instead of hanging a pool process.
    DATABASES["default"].setdefault("OPTIONS", {})["connect_timeout"] = DB_CONNECT_TIMEOUT_SECONDS
    # psycopg prepares a statement only when asked (execute(prepare=True): the statements
    # run through jobs.sql.preparing_cursor). Django's cursors bind client-side and
    # never prepare; its default None would refuse the statements that ask too.
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = sys.maxsize
    # A prepared statement keeps its one plan for any client: PostgreSQL's default
    # (auto) kept planning it on every call whenever the statistics made the plan for
    # any client look dearer than the client's own, and planned it for a client with a
    # long history as a walk of every link check (DECISIONS.md, "The client's holding is
    # one prepared statement"). Only prepared statements have a plan cache to choose from.
    _server_options = DATABASES["default"]["OPTIONS"].get("options", "")
    DATABASES["default"]["OPTIONS"]["options"] = (
        f"{_server_options} -c plan_cache_mode=force_generic_plan".strip()
    )
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    # Owner-only: it holds sessions and callback URLs. SQLite gives its -wal and -shm
    # files the database file's mode.
    _sqlite_name = DATABASES["default"]["NAME"]
    if _sqlite_name and _sqlite_name != ":memory:":
        os.close(os.open(_sqlite_name, os.O_CREAT | os.O_RDWR, 0o600))
        os.chmod(_sqlite_name, 0o600)
    DATABASES["default"]["OPTIONS"] = {
        # Web, workers and beat are separate processes sharing one file:
        # WAL lets readers run beside the writer, IMMEDIATE takes the write
        # lock up front so two writers queue instead of deadlocking.
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    # A file, not :memory:, so the worker processes the tests start can see it.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# In DEBUG, serve straight from the apps so collectstatic is not required.
WHITENOISE_USE_FINDERS = DEBUG

# --- HTTP API -----------------------------------------------------------------
# {user name: token}: each token acts as the Django user of that name (created on first
# use). Tokens made in the admin (audits.ApiToken, stored hashed) work alongside them.
API_TOKENS = env_named_secrets("API_TOKENS")
# Every API call needs a token (or a staff login), also when API_TOKENS is empty and the
# tokens are the admin's only. API_TOKENS set implies it.
API_REQUIRE_TOKEN = env_bool("API_REQUIRE_TOKEN", False)
# The largest request body the web process reads at all (config.asgi answers 413 past
# it, before Django sees the request): a submission is a small JSON, and no form of the
# admin comes near it. Django's own limit is the same, for a server without config.asgi.
API_MAX_BODY_BYTES = env_int("API_MAX_BODY_BYTES", 16 * 1024, minimum=256)
DATA_UPLOAD_MAX_MEMORY_SIZE = API_MAX_BODY_BYTES
# A request body must have arrived in full this long after its headers, or the web
# answers 408 and closes the connection (config.asgi): a stalled upload holds a socket
# and at most API_MAX_BODY_BYTES for this long, never longer.
WEB_BODY_READ_TIMEOUT_SECONDS = env_float("WEB_BODY_READ_TIMEOUT_SECONDS", 5.0, minimum=0.1)

REST_FRAMEWORK = {
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["audits.api.parsers.BoundedJSONParser"],
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "audits.api.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["audits.api.auth.TokenRequiredWhenConfigured"],
    "DEFAULT_SCHEMA_CLASS": "audits.api.schema.PlumbAutoSchema",
    "EXCEPTION_HANDLER": "audits.api.errors.json_exception_handler",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Plumb API",
    "DESCRIPTION": "Submit URLs for audit, read the results and what changed, manage pages.",
    "VERSION": "0.2.0",
    # 3.1: JSON Schema's own keywords (dependentRequired for the callback pair, type lists
    # for nulls) say what the API accepts.
    "OAS_VERSION": "3.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "audits.api.schema.add_links",
    ],
}

# --- Redis and Celery ---------------------------------------------------------
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# Redis Sentinel: with REDIS_SENTINELS (host:port, ...) set, every Redis client (the
# broker's, Plumb's own, Flower's) asks the sentinels for the current master of
# REDIS_SENTINEL_MASTER, and follows it through a failover. REDIS_URL then gives only the
# database number and the master's credentials: its host and port are not used.
REDIS_SENTINELS = env_list("REDIS_SENTINELS", [])
REDIS_SENTINEL_MASTER = env_str("REDIS_SENTINEL_MASTER", "mymaster")
# The sentinels' own password (their `requirepass`), when they have one.
REDIS_SENTINEL_PASSWORD = env_str("REDIS_SENTINEL_PASSWORD", "")


def _sentinel_address(entry: str) -> tuple[str, int]:
    host, _, port = entry.rpartition(":")
    if not host or not port.isdigit():
        raise ImproperlyConfigured(f"REDIS_SENTINELS entries are host:port, got {entry!r}")
    return host, int(port)


REDIS_SENTINEL_ADDRESSES = [_sentinel_address(entry) for entry in REDIS_SENTINELS]

AUDIT_QUEUE = "audits"
REAUDIT_QUEUE = "reaudit"
WEBHOOK_QUEUE = "webhooks"

AUDITS_VISIBILITY_TIMEOUT_SECONDS = env_int("AUDITS_VISIBILITY_TIMEOUT_SECONDS", 300, minimum=5)
REAUDIT_VISIBILITY_TIMEOUT_SECONDS = env_int("REAUDIT_VISIBILITY_TIMEOUT_SECONDS", 1800, minimum=5)
# A webhooks worker holds a message only while it runs it (its waits are in the
# delayed store, not in the worker: see jobs/delayed.py), so this only has to
# exceed one attempt: the request timeout plus the database's.
WEBHOOKS_VISIBILITY_TIMEOUT_SECONDS = env_int("WEBHOOKS_VISIBILITY_TIMEOUT_SECONDS", 120, minimum=5)

# Each queue's workers keep their own unacked keys and visibility timeout
# (config.celery_app applies them when a worker starts), so a worker with a
# short timeout never restores another queue's long-held messages early.
QUEUE_VISIBILITY_TIMEOUTS = {
    AUDIT_QUEUE: AUDITS_VISIBILITY_TIMEOUT_SECONDS,
    REAUDIT_QUEUE: REAUDIT_VISIBILITY_TIMEOUT_SECONDS,
    WEBHOOK_QUEUE: WEBHOOKS_VISIBILITY_TIMEOUT_SECONDS,
}

CELERY_BROKER_URL = REDIS_URL
# kombu's Redis transport, with a queue entry that is not a message envelope
# dead-lettered instead of stopping the worker (jobs/transport.py).
CELERY_BROKER_TRANSPORT = "jobs.transport:Transport"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker that loses Redis reconnects for as long as it takes (Celery's default gives
# up after 100 attempts, about 50 minutes, and the process exits). A channel error
# (kombu's for Redis: ResponseError, so READONLY or UNBLOCKED from a master that a
# failover demoted) restarts the consumer the same way, instead of stopping the worker.
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_BROKER_CHANNEL_ERROR_RETRY = True
# kombu waits forever on a command by default: a Redis that vanished without closing
# the TCP connection (a failover, a NAT timeout) would hang a publish or an ack for
# good. kombu's health checks (health_check_interval, 25 s) cover the idle BRPOP.
BROKER_SOCKET_TIMEOUT_SECONDS = env_float("BROKER_SOCKET_TIMEOUT_SECONDS", 10.0, minimum=1.0)
BROKER_CONNECT_TIMEOUT_SECONDS = env_float("BROKER_CONNECT_TIMEOUT_SECONDS", 2.0, minimum=0.1)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": AUDITS_VISIBILITY_TIMEOUT_SECONDS,
    "socket_timeout": BROKER_SOCKET_TIMEOUT_SECONDS,
    "socket_connect_timeout": BROKER_CONNECT_TIMEOUT_SECONDS,
    "socket_keepalive": True,
    # No `retry_on_timeout`: it gives every broker connection redis-py's retry, and the
    # pub/sub read kombu makes in the worker's event loop then reconnects in place when
    # Redis closes it and blocks on the new subscription with no timeout, the queue
    # unread for good. Without it the error reaches Celery, which restarts the consumer
    # (tests/faults/test_broker_outage.py, DECISIONS.md "A worker's event loop never
    # waits on a fresh subscription").
}
CELERY_TASK_DEFAULT_QUEUE = AUDIT_QUEUE
CELERY_TASK_CREATE_MISSING_QUEUES = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
# A task is acknowledged only when it has finished, and a task whose worker
# process died is put back: an audit survives a SIGKILL mid-fetch.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A task running when the broker connection drops keeps running: its effects are in
# the database and idempotent, and cancelling it would leave the audit `running`
# with its message gone if Redis came back empty (tests/faults/test_redis_restart.py).
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
# Task events (sent, received, started, succeeded: one Redis publish each) feed Flower's
# task list and nothing else; they were a tenth of an audit worker's CPU
# (DECISIONS.md, "Throughput"). Off unless TASK_EVENTS: Flower still shows workers,
# queues and the broker, and `make run` keeps its Flower from turning them on.
TASK_EVENTS = env_bool("TASK_EVENTS", False)
CELERY_WORKER_SEND_TASK_EVENTS = TASK_EVENTS
CELERY_TASK_SEND_SENT_EVENT = TASK_EVENTS
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Dead-letters messages the worker cannot run (undecodable, unknown task,
# wrong shape) on their first delivery instead of only logging them.
CELERY_WORKER_CONSUMER = "jobs.consumer:DeadLetteringConsumer"
if REDIS_SENTINEL_ADDRESSES:
    # The broker through Sentinel: kombu's Sentinel transport with Plumb's hooks, and
    # `sentinel://host:port` per sentinel, separated by `;`, each carrying REDIS_URL's
    # credentials and database number.
    _redis = urlsplit(REDIS_URL)
    _auth = _redis.netloc.rpartition("@")[0]
    CELERY_BROKER_URL = ";".join(
        f"sentinel://{_auth + '@' if _auth else ''}{host}:{port}{_redis.path}"
        for host, port in REDIS_SENTINEL_ADDRESSES
    )
    CELERY_BROKER_TRANSPORT = "jobs.transport:SentinelTransport"
    CELERY_BROKER_TRANSPORT_OPTIONS["master_name"] = REDIS_SENTINEL_MASTER
    # Given explicitly, these replace the socket timeouts kombu would copy to its
    # sentinel connections: keep them, so a sentinel that hangs cannot hang a worker.
    CELERY_BROKER_TRANSPORT_OPTIONS["sentinel_kwargs"] = {
        "socket_connect_timeout": BROKER_CONNECT_TIMEOUT_SECONDS,
        "socket_timeout": BROKER_SOCKET_TIMEOUT_SECONDS,
        **({"password": REDIS_SENTINEL_PASSWORD} if REDIS_SENTINEL_PASSWORD else {}),
    }

# --- Audits -------------------------------------------------------------------
AUDIT_FETCH_TIMEOUT_SECONDS = env_float("AUDIT_FETCH_TIMEOUT_SECONDS", 10.0, minimum=0.1)
AUDIT_MAX_PAGE_BYTES = env_int("AUDIT_MAX_PAGE_BYTES", 5 * 1024 * 1024, minimum=1024)
# Content codings stacked on one response body that are decoded (gzip, deflate), each
# inflated within the body cap; more is refused. 0 asks downstreams for `identity`.
OUTBOUND_MAX_CONTENT_CODINGS = env_int("OUTBOUND_MAX_CONTENT_CODINGS", 2, minimum=0)
AUDIT_MAX_ATTEMPTS = env_int("AUDIT_MAX_ATTEMPTS", 5, minimum=1)
AUDIT_ALLOW_PRIVATE_TARGETS = env_bool("AUDIT_ALLOW_PRIVATE_TARGETS", False)
# Page fetches in flight to one host at most, across all workers (Scrapy's
# CONCURRENT_REQUESTS_PER_DOMAIN is 8); 0: no limit.
PAGE_FETCH_PER_HOST_CONCURRENCY = env_int("PAGE_FETCH_PER_HOST_CONCURRENCY", 8, minimum=0)
# Page fetches started per second to a host that has not answered in the last minute,
# until it answers (a slow start); 0: none.
PAGE_FETCH_WARMUP_RATE = env_float("PAGE_FETCH_WARMUP_RATE", 2.0, minimum=0)
AUDIT_USER_AGENT = env_str("AUDIT_USER_AGENT", "Plumb/0.1 (+https://github.com/plumb-audits/plumb)")
REAUDIT_NEW_PAGES = env_bool("REAUDIT_NEW_PAGES", True)
# A nightly re-audit sends the validators of the page's last succeeded audit (ETag,
# Last-Modified); a 304 carries that result forward (audits.services). False: full fetches.
AUDIT_CONDITIONAL_REAUDITS = env_bool("AUDIT_CONDITIONAL_REAUDITS", True)
RETRY_BACKOFF_BASE_SECONDS = env_float("RETRY_BACKOFF_BASE_SECONDS", 1.0, minimum=0.01)
RETRY_BACKOFF_MAX_SECONDS = env_float("RETRY_BACKOFF_MAX_SECONDS", 60.0, minimum=0.01)
# Plumb's own PostgreSQL or Redis away: a job waits without spending an attempt, backing
# off from RETRY_BACKOFF_BASE_SECONDS up to this, so it runs within seconds of the return.
OUTAGE_BACKOFF_MAX_SECONDS = env_float("OUTAGE_BACKOFF_MAX_SECONDS", 5.0, minimum=0.01)

# --- Observability ------------------------------------------------------------
# Per-minute buckets behind the dashboard and /api/stats; the day view needs 24.
METRICS_RETENTION_HOURS = env_int("METRICS_RETENTION_HOURS", 48, minimum=1)
# Empty: /metrics and /api/stats are open (scraped over a private network). Set it
# to require `Authorization: Bearer <token>` (or a staff session) for both.
METRICS_BEARER_TOKEN = env_str("METRICS_BEARER_TOKEN", "")
# --- Outbound rate limits and link checks ---------------------------------------
# A wait for a rate-limited bucket up to this long is slept inline; a longer one
# defers the task (no attempt spent) instead of holding the worker.
RATELIMIT_INLINE_MAX_WAIT_SECONDS = env_float("RATELIMIT_INLINE_MAX_WAIT_SECONDS", 5.0, minimum=0)
# The longest wait a downstream may impose on a job (Retry-After, a bucket's reset): a
# longer one ends the job as rate limited, carrying the time asked for, instead of
# holding it in the backlog. Every wait jobs.policy.delay gives is within it (plus
# jitter), so it is also the horizon of the backlog admission counts.
RATELIMIT_MAX_WAIT_SECONDS = env_float("RATELIMIT_MAX_WAIT_SECONDS", 3600.0, minimum=1)
LINKCHECK_PER_HOST_CONCURRENCY = env_int("LINKCHECK_PER_HOST_CONCURRENCY", 2, minimum=1)
LINKCHECK_PER_HOST_RATE = env_float("LINKCHECK_PER_HOST_RATE", 1.0, minimum=0.01)
# Link checks in flight at once for the clients waiting on them (audits.linkcheck): one
# client's page of many links defers its own excess, never another client's check.
LINKCHECK_PER_CLIENT_CONCURRENCY = env_int("LINKCHECK_PER_CLIENT_CONCURRENCY", 4, minimum=1)
AUDIT_LINKCHECK_DEADLINE_SECONDS = env_float("AUDIT_LINKCHECK_DEADLINE_SECONDS", 120.0, minimum=1)
AUDIT_MAX_LINK_CHECKS = env_int("AUDIT_MAX_LINK_CHECKS", 100, minimum=0)
# Distinct links of each kind (internal, external) an audit keeps, the first in the
# page, as a crawler caps a page's outlinks; the rest are only counted
# (result.links_over_cap, links_truncated): what one page can make an audit hold, store,
# check and serve is bounded (DECISIONS.md, "An audit bounded by construction").
AUDIT_MAX_LINKS = env_int("AUDIT_MAX_LINKS", 100, minimum=0)
# A page nested deeper than this is not given a tree (WHATWG tree construction is
# quadratic in depth; Chrome itself caps the tree at 512): its fields come from the
# streaming pass and its tree-based findings are not applicable (audits.analysis).
AUDIT_MAX_TREE_DEPTH = env_int("AUDIT_MAX_TREE_DEPTH", 512, minimum=1)
# Nor is a page of more elements and comments than this (a tree costs ~0.8 KB a node:
# 20,000 is ~16 MB; the 30 real pages of the corpus hold at most 1,929 elements).
AUDIT_MAX_TREE_ELEMENTS = env_int("AUDIT_MAX_TREE_ELEMENTS", 20_000, minimum=1)
# Lexbor builds a tree in C, without the GIL, and some markup costs it far more than its
# size (one tag of 40,000 distinct attributes: 3.7 s; 5 MiB of duplicate ones: 196 MiB).
# In an audits worker of threads, a page of more bytes than this is parsed in a child
# process (audits.treebuild) with AUDIT_TREE_MEMORY_MB of address space and
# AUDIT_TREE_SECONDS, AUDIT_TREE_PROCESSES of them per worker process; past either limit
# the child is replaced and the page read without a tree (too_costly_for_a_tree).
# Smaller pages are parsed in the worker: their worst case is bounded by their size.
AUDIT_TREE_IN_PROCESS_MAX_BYTES = env_int("AUDIT_TREE_IN_PROCESS_MAX_BYTES", 64 * 1024, minimum=0)
AUDIT_TREE_MEMORY_MB = env_int("AUDIT_TREE_MEMORY_MB", 256, minimum=16)
AUDIT_TREE_SECONDS = env_float("AUDIT_TREE_SECONDS", 3.0, minimum=0.1)
AUDIT_TREE_PROCESSES = env_int("AUDIT_TREE_PROCESSES", 1, minimum=1)
# The longest a large page waits for its client's turn and a free builder: past it, it is
# read without a tree (tree_builders_busy), so many clients' costly pages cannot hold
# another's audit past its time limits (part of its deadline budget, audits.models).
AUDIT_TREE_WAIT_SECONDS = env_float("AUDIT_TREE_WAIT_SECONDS", 4.0, minimum=1.0)
# A link's outcome is shared by every audit listing it for this long (audits.SharedLink).
LINKCHECK_FRESH_SECONDS = env_float("LINKCHECK_FRESH_SECONDS", 86400.0, minimum=0)
# A broken outcome is shared for less long: it is checked again sooner.
LINKCHECK_BROKEN_FRESH_SECONDS = env_float("LINKCHECK_BROKEN_FRESH_SECONDS", 3600.0, minimum=0)
# A link found broken is checked once more this long after, before it is reported
# broken (one bad answer is not a broken link); 0: reported at once.
LINKCHECK_BROKEN_RECHECK_SECONDS = env_float("LINKCHECK_BROKEN_RECHECK_SECONDS", 10.0, minimum=0)
# A host's robots.txt (audits.robots) is read once per this long, shared by every worker:
# RFC 9309 asks for no more than a day. One that answered 429, 5xx or nothing (unreachable:
# every link on the host is held back) is asked again after ROBOTS_UNREACHABLE_SECONDS.
ROBOTS_FRESH_SECONDS = env_float("ROBOTS_FRESH_SECONDS", 86400.0, minimum=0)
ROBOTS_UNREACHABLE_SECONDS = env_float("ROBOTS_UNREACHABLE_SECONDS", 600.0, minimum=0)
# A robots.txt `Crawl-delay` spaces a host's link checks by at most this many seconds.
ROBOTS_MAX_CRAWL_DELAY_SECONDS = env_float("ROBOTS_MAX_CRAWL_DELAY_SECONDS", 30.0, minimum=0)

GITHUB_API_URL = env_str("GITHUB_API_URL", "https://api.github.com").rstrip("/")
GITHUB_APP_ID = env_str("GITHUB_APP_ID", "")
GITHUB_APP_PRIVATE_KEY = env_str("GITHUB_APP_PRIVATE_KEY", "")
GITHUB_INSTALLATION_ID = env_str("GITHUB_INSTALLATION_ID", "")
GITHUB_TOKEN = env_str("GITHUB_TOKEN", "")
_github_app = [GITHUB_APP_ID, GITHUB_APP_PRIVATE_KEY, GITHUB_INSTALLATION_ID]
if any(_github_app) and not all(_github_app):
    raise ImproperlyConfigured(
        "A GitHub App needs GITHUB_APP_ID, GITHUB_APP_PRIVATE_KEY and GITHUB_INSTALLATION_ID together."
    )

# Periodic tasks, each on an explicit queue (beat syncs these into its database schedule).
# Sweeps every few seconds are not beat's: they are ticks of the workers (jobs.sweeps).
CELERY_BEAT_SCHEDULE = {}
# --- Admission of submissions (POST /api/audits) ---------------------------------
# Each client address has a token bucket; the service as a whole refuses new
# submissions while the backlog owed to the audit workers is at the cap.
AUDIT_SUBMIT_BURST = env_int("AUDIT_SUBMIT_BURST", 20, minimum=1)
AUDIT_SUBMIT_RATE_PER_MINUTE = env_float("AUDIT_SUBMIT_RATE_PER_MINUTE", 30.0, minimum=0.01)
AUDIT_QUEUE_MAX_DEPTH = env_int("AUDIT_QUEUE_MAX_DEPTH", 1000, minimum=1)
# The most of that backlog one client (a user, else an address) may hold: beyond it its
# own submissions get 429 while other clients are admitted (audits.admission).
AUDIT_CLIENT_MAX_SHARE = env_float("AUDIT_CLIENT_MAX_SHARE", 0.1, minimum=0.001)
# How many proxies in front of the web processes append to X-Forwarded-For; 0 uses
# the socket's peer address, so a client cannot pick its own bucket.
TRUSTED_PROXY_COUNT = env_int("TRUSTED_PROXY_COUNT", 0, minimum=0)
# --- Result webhooks -----------------------------------------------------------
WEBHOOK_MAX_ATTEMPTS = env_int("WEBHOOK_MAX_ATTEMPTS", 8, minimum=1)
WEBHOOK_BACKOFF_BASE_SECONDS = env_float("WEBHOOK_BACKOFF_BASE_SECONDS", 5.0, minimum=0.01)
WEBHOOK_BACKOFF_MAX_SECONDS = env_float("WEBHOOK_BACKOFF_MAX_SECONDS", 3600.0, minimum=0.01)
# Deliveries one webhooks worker process runs at once (its thread pool); 0: no cap.
WEBHOOK_MAX_CONCURRENCY = env_int("WEBHOOK_MAX_CONCURRENCY", 16, minimum=0)
# Deliveries in flight to one destination host across all workers; 0: no limit.
WEBHOOK_PER_HOST_CONCURRENCY = env_int("WEBHOOK_PER_HOST_CONCURRENCY", 32, minimum=0)
WEBHOOK_TIMEOUT_SECONDS = env_float("WEBHOOK_TIMEOUT_SECONDS", 10.0, minimum=0.1)
# Links an event's payload lists at most (result.links, broken first; external_links;
# each list of changes); the rest are counted, and `links.self` is the full audit.
WEBHOOK_MAX_LINKS = env_int("WEBHOOK_MAX_LINKS", 10, minimum=0)

# --- Nightly re-audit ---------------------------------------------------------
# Read once, by the data migration that creates the beat entry (reaudit 0002);
# after that the entry's crontab is edited in the admin.
REAUDIT_HOUR = env_int("REAUDIT_HOUR", 2, minimum=0)
if REAUDIT_HOUR > 23:
    raise ImproperlyConfigured(
        f"REAUDIT_HOUR must be an hour of the day (0-23), got {REAUDIT_HOUR}"
    )
REAUDIT_WINDOW_SECONDS = env_int("REAUDIT_WINDOW_SECONDS", 6 * 3600, minimum=1)
REAUDIT_SLICE_SECONDS = env_int("REAUDIT_SLICE_SECONDS", 600, minimum=1)
REAUDIT_DOMAIN_SPACING_SECONDS = env_float("REAUDIT_DOMAIN_SPACING_SECONDS", 10.0, minimum=0.0)
# A reaudit worker holds each placement, and the message of the next slice, for
# up to one slice before it runs them. Were the visibility timeout shorter, its
# own restore scan would redeliver them while it still holds them: every held
# message twice, every slice (kombu#337).
if REAUDIT_VISIBILITY_TIMEOUT_SECONDS <= REAUDIT_SLICE_SECONDS:
    raise ImproperlyConfigured(
        f"REAUDIT_VISIBILITY_TIMEOUT_SECONDS ({REAUDIT_VISIBILITY_TIMEOUT_SECONDS}) must exceed "
        f"REAUDIT_SLICE_SECONDS ({REAUDIT_SLICE_SECONDS}): a reaudit worker holds scheduled "
        "placements for up to one slice."
    )
# --- Retention (jobs.retention: `manage.py prune` and the daily jobs.prune) -------
# Days each kind of row is kept; each app registers its kinds. An audit still queued
# or running, a page's latest succeeded audit, an audit still owed a webhook delivery,
# an open night and an unreplayed dead letter (but a failed delivery's) are kept
# whatever their age.
AUDIT_RETENTION_DAYS = env_int("AUDIT_RETENTION_DAYS", 90, minimum=1)
LINK_CHECK_RETENTION_DAYS = env_int("LINK_CHECK_RETENTION_DAYS", 7, minimum=1)
WEBHOOK_DELIVERY_RETENTION_DAYS = env_int("WEBHOOK_DELIVERY_RETENTION_DAYS", 30, minimum=1)
RATELIMIT_OBSERVATION_RETENTION_DAYS = env_int("RATELIMIT_OBSERVATION_RETENTION_DAYS", 7, minimum=1)
DEAD_LETTER_RETENTION_DAYS = env_int("DEAD_LETTER_RETENTION_DAYS", 30, minimum=1)
# A breaker's admin row (jobs.CircuitBreaker), once it has not changed state for this long.
BREAKER_RETENTION_DAYS = env_int("BREAKER_RETENTION_DAYS", 30, minimum=1)
WEBHOOK_DEAD_LETTER_RETENTION_DAYS = env_int("WEBHOOK_DEAD_LETTER_RETENTION_DAYS", 30, minimum=1)
REAUDIT_PLACEMENT_RETENTION_DAYS = env_int("REAUDIT_PLACEMENT_RETENTION_DAYS", 1, minimum=0)
REAUDIT_NIGHT_RETENTION_DAYS = env_int("REAUDIT_NIGHT_RETENTION_DAYS", 90, minimum=1)
# Rows deleted per transaction: each batch locks only its own rows, briefly.
RETENTION_BATCH_SIZE = env_int("RETENTION_BATCH_SIZE", 1000, minimum=1)
# Hour (UTC) of the daily prune: keep it out of the re-audit's night (REAUDIT_HOUR plus
# REAUDIT_WINDOW_SECONDS), when the reaudit workers are busy placing and PostgreSQL auditing.
RETENTION_HOUR = env_int("RETENTION_HOUR", 12, minimum=0)
if RETENTION_HOUR > 23:
    raise ImproperlyConfigured(
        f"RETENTION_HOUR must be an hour of the day (0-23), got {RETENTION_HOUR}"
    )
# The prune runs on the reaudit queue: housekeeping like the fan-out, outside the
# backlog that admission weighs (the `audits` queue's), on workers every deployment
# runs, whose visibility timeout is long. Each run stops within half of that timeout and
# publishes its continuation, so the broker never redelivers a prune still running.
RETENTION_QUEUE = REAUDIT_QUEUE
# One prune run works this long, then publishes the rest as a new run: short enough that
# its hard time limit (a run plus 30 s) stays under the reaudit queue's visibility timeout
# and a worker's stop grace, so a deploy never kills it mid-batch.
RETENTION_RUN_SECONDS = 60
CELERY_BEAT_SCHEDULE["prune-aged-out-rows"] = {
    "task": "jobs.prune",
    "schedule": crontab(minute=0, hour=RETENTION_HOUR),
    # A day's prune not started within hours is tomorrow's to do.
    "options": {"queue": RETENTION_QUEUE, "expires": 6 * 3600.0},
}
# --- Retries, breakers and parked tasks (ratelimit/) ---------------------------
# Off only to reproduce the old, unjittered policy in a benchmark (bench/retry_storm.py).
RETRY_JITTER = env_bool("RETRY_JITTER", True)
BREAKER_ENABLED = env_bool("BREAKER_ENABLED", True)
BREAKER_FAILURE_RATE = env_float("BREAKER_FAILURE_RATE", 0.5, minimum=0.01)
if BREAKER_FAILURE_RATE > 1:
    raise ImproperlyConfigured(
        f"BREAKER_FAILURE_RATE must be at most 1, got {BREAKER_FAILURE_RATE}"
    )
BREAKER_MIN_CALLS = env_int("BREAKER_MIN_CALLS", 10, minimum=1)
BREAKER_WINDOW_SECONDS = env_int("BREAKER_WINDOW_SECONDS", 30, minimum=1)
BREAKER_OPEN_SECONDS = env_float("BREAKER_OPEN_SECONDS", 30.0, minimum=0.1)
BREAKER_HALF_OPEN_PROBES = env_int("BREAKER_HALF_OPEN_PROBES", 3, minimum=1)
# A breaker's state in Redis is forgotten this long after its last use (an open one no
# sooner than its open period and its parked tasks' releases end): closed, as it was.
BREAKER_FORGET_AFTER_SECONDS = env_int("BREAKER_FORGET_AFTER_SECONDS", 3600, minimum=1)
# How often each worker wakes the due entries of its queue's delayed store (jobs.delayed).
DELAYED_POLL_INTERVAL_SECONDS = env_float("DELAYED_POLL_INTERVAL_SECONDS", 0.25, minimum=0.01)
# The reconciler (jobs.reconcile): one worker a tick publishes again what PostgreSQL says
# is owed and Redis lost. A Redis back empty or behind is caught at the next tick; a
# single lost message once its row is still owed RECONCILE_AFTER_SECONDS past its due
# time (above the longest normal queue wait and any attempt's hard time limit).
RECONCILE_INTERVAL_SECONDS = env_float("RECONCILE_INTERVAL_SECONDS", 15.0, minimum=0.1)
RECONCILE_AFTER_SECONDS = env_int("RECONCILE_AFTER_SECONDS", 600, minimum=10)

# --- Logging ------------------------------------------------------------------
LOG_LEVEL = env_str("LOG_LEVEL", "INFO").upper()
LOG_FORMAT = env_str("LOG_FORMAT", "text")
if LOG_FORMAT not in {"text", "json"}:
    raise ImproperlyConfigured(f"LOG_FORMAT must be 'text' or 'json', got {LOG_FORMAT!r}")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "structured": {"()": "config.logging.StructuredFormatter", "as_json": LOG_FORMAT == "json"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "structured"},
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        "httpx2": {"level": "WARNING"},
        "httpcore2": {"level": "WARNING"},
        # Celery's own per-task INFO lines (succeeded, retry, ignored) repeat what the job
        # runtime logs as task.finished / task.retry / task.parked / task.deferred, and an
        # "ignored" line carries a whole traceback for every breaker park. Errors still show.
        "celery.app.trace": {"level": "WARNING"},
        # "Task ... received" for every message: task.started says it, with the wait.
        "celery.worker.strategy": {"level": "WARNING"},
    },
}


# --- The run command (manage.py runstack, `make run`) --------------------------
WEB_HOST = env_str("WEB_HOST", "127.0.0.1")
WEB_PORT = env_int("WEB_PORT", 8000, minimum=1)
# Where the API is reached from outside (`https://plumb.example.com`): the base of the
# audit's URL (`links.self`) in webhook payloads, which are built without a request.
PUBLIC_BASE_URL = env_str("PUBLIC_BASE_URL", f"http://{WEB_HOST}:{WEB_PORT}").rstrip("/")
WEB_CONCURRENCY = env_int("WEB_CONCURRENCY", 2, minimum=1)
# Threads per web process running Django (config.wsgi_threads), each with its database
# connection: on PostgreSQL two, so one request's waits on the database and Redis overlap
# another's Python; on SQLite one, whose writes take one lock in turn (DECISIONS.md, "Two
# threads a web process on PostgreSQL").
WEB_THREADS = env_int(
    "WEB_THREADS",
    2 if _ON_POSTGRESQL else 1,
    minimum=1,
)
FLOWER_PORT = env_int("FLOWER_PORT", 5555, minimum=1)
# "user:password" (several comma-separated); empty: runstack generates one into var/.
FLOWER_BASIC_AUTH = env_str("FLOWER_BASIC_AUTH", "")
# An audit mostly waits on the network: one process of 32 threads runs 32 at once in
# 145 MB, where 4 prefork processes ran 4 in 563 MB; a threads process uses one core at
# most (the GIL), so there is one per core (DECISIONS.md, "Throughput").
AUDITS_WORKER_POOL = env_str("AUDITS_WORKER_POOL", "threads")
AUDITS_WORKER_CONCURRENCY = env_int("AUDITS_WORKER_CONCURRENCY", 32, minimum=1)
AUDITS_WORKER_PROCESSES = env_int("AUDITS_WORKER_PROCESSES", os.cpu_count() or 1, minimum=1)
# A placement is short database work, and a night's placements arrive as fast as a machine
# audits: threads, like the audits. One prefork slot placed 45 a second in a night that
# needed 67; 8 threads placed 110 (DECISIONS.md, "Re-audit").
REAUDIT_WORKER_POOL = env_str("REAUDIT_WORKER_POOL", "threads")
REAUDIT_WORKER_CONCURRENCY = env_int("REAUDIT_WORKER_CONCURRENCY", 8, minimum=1)
# (The webhooks worker's concurrency is WEBHOOK_MAX_CONCURRENCY.)
DEMO_SITE_PORT = env_int("DEMO_SITE_PORT", 8099, minimum=1)

# --- Web hardening (issue 26): headers, cookies, proxies, logins, the key -------
# A production key must be long and random: Django's own bar (check W009), refused at
# start-up instead of warned about. DEBUG keeps the generated development key.
if not DEBUG and (len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5):
    raise ImproperlyConfigured(
        "SECRET_KEY is too weak for DEBUG off: use at least 50 characters with at least "
        "5 distinct ones (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(50))'`)."
    )
# Cookies go over HTTPS only, unless DEBUG. `make run` serves plain http on 127.0.0.1
# and turns this off for its own processes (runstack; docs/configuration.md).
SECURE_COOKIES = env_bool("SECURE_COOKIES", not DEBUG)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE_COOKIES
# HSTS only once the site is served over HTTPS for good: a browser remembers it.
SECURE_HSTS_SECONDS = env_int("HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("HSTS_PRELOAD", False)
# Redirect http to https; /healthz and /metrics stay reachable over http for probes.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
# The header a TLS-terminating proxy sets (e.g. X-Forwarded-Proto); empty: no proxy,
# and a client cannot claim https by sending the header itself.
PROXY_SSL_HEADER = env_str("PROXY_SSL_HEADER", "")
if PROXY_SSL_HEADER:
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + PROXY_SSL_HEADER.upper().replace("-", "_"), "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# django-csp: no inline or foreign script anywhere (the admin and the dashboard have
# none). Inline styles stay allowed: the admin and the dashboard use style attributes.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
INSTALLED_APPS.append("axes")
MIDDLEWARE.insert(MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
                  "csp.middleware.CSPMiddleware")  # fmt: skip
# django-axes: after LOGIN_FAILURE_LIMIT failures a (username, address) pair is locked
# out for LOGIN_LOCKOUT_MINUTES; the admin and Flower's login (devstack) go through it.
MIDDLEWARE.append("axes.middleware.AxesMiddleware")
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = env_float("LOGIN_LOCKOUT_MINUTES", 15.0, minimum=0.1) / 60
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# The address axes counts is the one the admission buckets use (TRUSTED_PROXY_COUNT).
AXES_CLIENT_IP_CALLABLE = "audits.admission.client_address"
# Callback secrets are encrypted at rest (audits.secrets): comma-separated Fernet keys,
# the first encrypts, every one decrypts (rotation: put the new key first, run
# `manage.py rotate_callback_secrets`, then drop the old). Empty: one key derived from
# SECRET_KEY.
CALLBACK_SECRET_KEYS = env_list("CALLBACK_SECRET_KEYS", [])
