"""Callback secrets, encrypted at rest with keys that can be rotated.

A callback secret signs the webhooks sent to its URL: whoever reads it can forge them.
The database (a backup, a replica, a read-only account) keeps only Fernet tokens; the
keys live in the environment (CALLBACK_SECRET_KEYS). MultiFernet encrypts with the first
key and decrypts with any, so a rotation is: a new key first, `manage.py
rotate_callback_secrets`, then the old key removed.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from functools import lru_cache
from urllib.parse import urlsplit, urlunsplit

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import models

log = logging.getLogger(__name__)


def _keys() -> tuple[str, ...]:
    if settings.CALLBACK_SECRET_KEYS:
        return tuple(settings.CALLBACK_SECRET_KEYS)
    # No key configured: one derived from SECRET_KEY, so the embedded stack needs no setup.
    # Changing SECRET_KEY then loses the secrets: a deployment sets its own keys.
    digest = hashlib.sha256(b"plumb.callback-secrets:" + settings.SECRET_KEY.encode()).digest()
    return (base64.urlsafe_b64encode(digest).decode(),)


@lru_cache(maxsize=4)
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(key) for key in keys])


def encrypt(secret: str) -> str:
    return _fernet(_keys()).encrypt(secret.encode()).decode()


def decrypt(token: str) -> str:
    return _fernet(_keys()).decrypt(token.encode()).decode()


class UnreadableSecret(str):
    """A stored secret none of the keys decrypts: reads as no secret (empty), and is written
    back as the token it was read from, so the right key configured later still reads it."""

    def __new__(cls, token: str):
        secret = super().__new__(cls, "")
        secret.token = token
        return secret


class EncryptedSecretField(models.TextField):
    """A string stored as a Fernet token; empty stays empty (no secret).

    Lookups by value cannot work (every token differs): nothing filters on a secret.
    A token no key decrypts (a changed SECRET_KEY, a key dropped too early) costs that row
    its secret, logged, and never the list or page that row is in.
    """

    def from_db_value(self, value, expression, connection):
        if not value:
            return value
        try:
            return decrypt(value)
        except InvalidToken:
            log.error(
                "callback_secret.unreadable",
                extra={"table": self.model._meta.db_table, "field": self.name},
            )
            return UnreadableSecret(value)

    def get_prep_value(self, value):
        if isinstance(value, UnreadableSecret):
            return value.token
        value = super().get_prep_value(value)
        return encrypt(value) if value else value


def without_password(url: str) -> str:
    """The URL with the password of its user info shown as `***`: whoever may see a callback
    URL sees where it goes and as which user, never its password (like its secret)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))
