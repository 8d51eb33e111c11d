"""Typed access to environment variables, failing loudly on a bad value.

Every setting Plumb reads goes through these helpers, so a typo in a
deployment fails at start-up with the variable's name instead of silently
falling back to a default. `docs/configuration.md` has one row per name; a
test keeps the two in step.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from psycopg.conninfo import conninfo_to_dict

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name} must be a boolean (1/0, true/false, yes/no, on/off), got {raw!r}"
    )


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        value = default
    else:
        try:
            value = int(raw)
        except ValueError:
            raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        value = default
    else:
        try:
            value = float(raw)
        except ValueError:
            raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_named_secrets(name: str) -> dict[str, str]:
    """`name:secret,name:secret` as {name: secret}; a bare secret (the old form) or a
    repeated name fails with the variable's name, never echoing a secret."""
    named: dict[str, str] = {}
    for position, item in enumerate(env_list(name, []), start=1):
        label, colon, secret = item.partition(":")
        label, secret = label.strip(), secret.strip()
        if not colon or not label or not secret:
            raise ImproperlyConfigured(
                f"{name}: entry {position} is not name:secret. Each entry names the user the "
                "secret acts as (e.g. ci:<secret>); a bare secret has no identity."
            )
        if label in named:
            raise ImproperlyConfigured(f"{name}: the name {label!r} appears twice")
        named[label] = secret
    return named


def database_config(url: str, **options) -> dict:
    """Django's DATABASES entry for a DATABASE_URL, multi-host ones included.

    libpq takes a list of hosts (`postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write`:
    try each in turn, keep the first that accepts writes), which dj_database_url cannot
    parse. It parses the URL with one placeholder host instead; HOST and PORT then get
    libpq's own reading of the list (comma-separated, as libpq takes them), and the
    query options (target_session_attrs...) are in OPTIONS as for any URL.
    """
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return dj_database_url.parse(url, **options)
    placeholder = f"{userinfo}@placeholder" if userinfo else "placeholder"
    config = dj_database_url.parse(urlunsplit(parts._replace(netloc=placeholder)), **options)
    if config["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured(
            f"DATABASE_URL lists several hosts: PostgreSQL only, got {url!r}"
        )
    try:
        libpq = conninfo_to_dict(urlunsplit(parts._replace(scheme="postgresql")))
    except Exception as exc:  # psycopg.ProgrammingError: libpq refused the URI
        raise ImproperlyConfigured(f"DATABASE_URL is not a valid multi-host URL: {exc}") from None
    config["HOST"], config["PORT"] = libpq["host"], libpq.get("port", "")
    return config
