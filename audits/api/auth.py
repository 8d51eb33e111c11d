"""Who may call the API, and as whom.

A token acts as a Django user: `request.user` is that user, so an audit's submitter and
a page's owner are users, whether they came with a token or a staff login. Tokens come
from two places: `API_TOKENS` (`name:secret`, each acting as the user of that name,
created on first use) and the admin's `ApiToken` rows (stored as their SHA-256).

Without API_TOKENS (and API_REQUIRE_TOKEN off), submitting is open and an audit is
readable by whoever holds its id (a random UUID); listing audits, and every pages
endpoint, needs a staff session or a token, and shows the caller's own (staff: all).
With either set, every API endpoint but the schema needs `Authorization: Bearer <token>`
(or a staff session).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission

from audits.models import ApiToken

TOKEN_PREFIX = "plumb_"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(row: ApiToken) -> str:
    """Give the unsaved `row` a fresh token's prefix and hash; the token itself is returned
    to be shown once, and kept nowhere."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row.prefix = token[: len(TOKEN_PREFIX) + 6]
    row.key_hash = token_hash(token)
    return token


def issue_token(user, name: str) -> tuple[ApiToken, str]:
    """A new token for `user`: (its row, the token)."""
    row = ApiToken(user=user, name=name)
    token = new_token(row)
    row.save(force_insert=True)
    return row, token


def configured_token_user(token: str):
    """The user an API_TOKENS secret acts as, created (with no password) on first use."""
    # Compare against every configured token in constant time, so timing says nothing.
    matched = None
    for name, known in settings.API_TOKENS.items():
        if hmac.compare_digest(token.encode(), known.encode()):
            matched = name
    if matched is None:
        return None
    user, created = get_user_model().objects.get_or_create(username=matched)
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


def stored_token_user(token: str):
    """The user of an admin-made token; the lookup is by hash, which leaks no timing of use."""
    row = ApiToken.objects.select_related("user").filter(key_hash=token_hash(token)).first()
    return None if row is None else row.user


class ApiTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthenticationFailed("Use 'Authorization: Bearer <token>'.")
        token = token.strip()
        user = configured_token_user(token) or stored_token_user(token)
        if user is None or not user.is_active:
            raise AuthenticationFailed("Invalid API token.")
        return user, BearerToken()

    def authenticate_header(self, request):
        return 'Bearer realm="plumb"'


class BearerToken:
    """`request.auth` of a call authenticated by a token (a session's is None)."""


def caller(request):
    """The authenticated user behind the request, or None (anonymous)."""
    user = request.user
    return user if user is not None and user.is_authenticated else None


def is_trusted(request) -> bool:
    """A staff user or an API token: a caller whose choices may cost Plumb every night."""
    user = caller(request)
    return user is not None and (isinstance(request.auth, BearerToken) or user.is_staff)


def tokens_required() -> bool:
    return bool(settings.API_TOKENS) or settings.API_REQUIRE_TOKEN


class TokenRequiredWhenConfigured(BasePermission):
    message = "An API token is required."

    def has_permission(self, request, view):
        return self.allows_anonymous() or is_trusted(request)

    def allows_anonymous(self) -> bool:
        """Whether a caller without credentials gets through (the schema says so)."""
        return not tokens_required()


class TrustedCallerOnly(BasePermission):
    message = "This needs an API token or a staff login."

    def has_permission(self, request, view):
        return is_trusted(request)

    def allows_anonymous(self) -> bool:
        return False
