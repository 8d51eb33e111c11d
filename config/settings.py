"""Plumb's settings: every value comes from an environment variable with a safe default.

The defaults run the embedded stack (SQLite and a local Redis); production sets
DATABASE_URL, REDIS_URL, SECRET_KEY and DEBUG=false. docs/configuration.md is the
reference, one row per variable.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("PLUMB_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)

# The dev key is generated once per checkout and kept in var/, so sessions and
# processes agree on it; its prefix lets us refuse it outside DEBUG.
DEV_SECRET_KEY_PREFIX = "plumb-dev-insecure-"


def _dev_secret_key() -> str:
    path = VAR_DIR / "dev-secret-key"
    if not path.exists():
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(DEV_SECRET_KEY_PREFIX + secrets.token_urlsafe(40))
    return path.read_text().strip()


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
    "audits",
    "reaudit",
    "ratelimit",
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
# Each process (a gunicorn worker, a Celery pool process) holds at most one
# connection, kept DB_CONN_MAX_AGE seconds for reuse: the connection count is
# bounded by the process count (docs/workers.md has the budget), not by how
# many retries come due at once.
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL,
        conn_max_age=env_int("DB_CONN_MAX_AGE", 60, minimum=0),
        conn_health_checks=True,
    )
}
DB_CONNECT_TIMEOUT_SECONDS = env_int("DB_CONNECT_TIMEOUT_SECONDS", 10, minimum=1)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # A database that is out of connections fails the task fast (and the
    # task is retried) instead of hanging a pool process.
    DATABASES["default"].setdefault("OPTIONS", {})["connect_timeout"] = DB_CONNECT_TIMEOUT_SECONDS
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    VAR_DIR.mkdir(parents=True, exist_ok=True)
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
API_MAX_BODY_BYTES = env_int("API_MAX_BODY_BYTES", 16 * 1024, minimum=256)
# Django enforces this when the body is read; the API turns it into a 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = API_MAX_BODY_BYTES

REST_FRAMEWORK = {
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["audits.api.parsers.BoundedJSONParser"],
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "audits.api.errors.json_exception_handler",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Plumb API",
    "DESCRIPTION": "Submit URLs for audit and read the results.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
}

# --- Redis and Celery ---------------------------------------------------------
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")

AUDIT_QUEUE = "audits"
REAUDIT_QUEUE = "reaudit"

AUDITS_VISIBILITY_TIMEOUT_SECONDS = env_int("AUDITS_VISIBILITY_TIMEOUT_SECONDS", 300, minimum=5)
REAUDIT_VISIBILITY_TIMEOUT_SECONDS = env_int("REAUDIT_VISIBILITY_TIMEOUT_SECONDS", 1800, minimum=5)

# Each queue's workers keep their own unacked keys and visibility timeout
# (config.celery_app applies them when a worker starts), so a worker with a
# short timeout never restores another queue's long-held messages early.
QUEUE_VISIBILITY_TIMEOUTS = {
    AUDIT_QUEUE: AUDITS_VISIBILITY_TIMEOUT_SECONDS,
    REAUDIT_QUEUE: REAUDIT_VISIBILITY_TIMEOUT_SECONDS,
}

CELERY_BROKER_URL = REDIS_URL
# kombu's Redis transport, with a queue entry that is not a message envelope
# dead-lettered instead of stopping the worker (ratelimit/transport.py).
CELERY_BROKER_TRANSPORT = "ratelimit.transport:Transport"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": AUDITS_VISIBILITY_TIMEOUT_SECONDS}
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
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
CELERY_WORKER_SEND_TASK_EVENTS = True
CELERY_TASK_SEND_SENT_EVENT = True
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Dead-letters messages the worker cannot run (undecodable, unknown task,
# wrong shape) on their first delivery instead of only logging them.
CELERY_WORKER_CONSUMER = "ratelimit.consumer:DeadLetteringConsumer"

# --- Audits -------------------------------------------------------------------
AUDIT_FETCH_TIMEOUT_SECONDS = env_float("AUDIT_FETCH_TIMEOUT_SECONDS", 10.0, minimum=0.1)
AUDIT_MAX_PAGE_BYTES = env_int("AUDIT_MAX_PAGE_BYTES", 5 * 1024 * 1024, minimum=1024)
AUDIT_MAX_ATTEMPTS = env_int("AUDIT_MAX_ATTEMPTS", 5, minimum=1)
AUDIT_ALLOW_PRIVATE_TARGETS = env_bool("AUDIT_ALLOW_PRIVATE_TARGETS", False)
AUDIT_USER_AGENT = env_str("AUDIT_USER_AGENT", "Plumb/0.1 (+https://github.com/plumb-audits/plumb)")
REAUDIT_NEW_PAGES = env_bool("REAUDIT_NEW_PAGES", True)
RETRY_BACKOFF_BASE_SECONDS = env_float("RETRY_BACKOFF_BASE_SECONDS", 1.0, minimum=0.01)
RETRY_BACKOFF_MAX_SECONDS = env_float("RETRY_BACKOFF_MAX_SECONDS", 60.0, minimum=0.01)

# --- Retries, breakers and parked tasks (ratelimit/) ---------------------------
RETRY_JITTER_CHOICES = ("multiplicative", "full", "equal", "decorrelated", "none")
RETRY_JITTER = env_str("RETRY_JITTER", "multiplicative").strip().lower()
if RETRY_JITTER not in RETRY_JITTER_CHOICES:
    raise ImproperlyConfigured(
        f"RETRY_JITTER must be one of {', '.join(RETRY_JITTER_CHOICES)}, got {RETRY_JITTER!r}"
    )
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
PARKED_SWEEP_INTERVAL_SECONDS = env_float("PARKED_SWEEP_INTERVAL_SECONDS", 1.0, minimum=0.05)

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
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
    },
}


# --- The run command (manage.py runstack, `make run`) --------------------------
WEB_HOST = env_str("WEB_HOST", "127.0.0.1")
WEB_PORT = env_int("WEB_PORT", 8000, minimum=1)
WEB_CONCURRENCY = env_int("WEB_CONCURRENCY", 2, minimum=1)
FLOWER_PORT = env_int("FLOWER_PORT", 5555, minimum=1)
AUDITS_WORKER_CONCURRENCY = env_int("AUDITS_WORKER_CONCURRENCY", 4, minimum=1)
REAUDIT_WORKER_CONCURRENCY = env_int("REAUDIT_WORKER_CONCURRENCY", 1, minimum=1)
DEMO_SITE_PORT = env_int("DEMO_SITE_PORT", 8099, minimum=1)
