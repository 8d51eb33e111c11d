"""Who may call the API.

Without API_TOKENS, submitting is open and an audit is readable by whoever holds
its id (a random UUID); listing audits, and every pages endpoint, needs a staff
session or a token, since a list would hand out every id. With API_TOKENS set,
every API endpoint but the schema needs `Authorization: Bearer <token>` (or a
staff session).
"""

from __future__ import annotations

import hmac

from django.conf import settings
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission


class ApiClient:
    """The caller behind a valid API token."""

    is_authenticated = True
    is_staff = False


class ApiTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthenticationFailed("Use 'Authorization: Bearer <token>'.")
        token = token.strip()
        # Compare against every token in constant time, so timing says nothing.
        matches = [
            hmac.compare_digest(token.encode(), known.encode()) for known in settings.API_TOKENS
        ]
        if not any(matches):
            raise AuthenticationFailed("Invalid API token.")
        return ApiClient(), token

    def authenticate_header(self, request):
        return 'Bearer realm="plumb"'


def is_trusted(request) -> bool:
    """A staff user or an API token: a caller whose choices may cost Plumb every night."""
    user = request.user
    return bool(
        user is not None
        and user.is_authenticated
        and (isinstance(user, ApiClient) or user.is_staff)
    )


class TokenRequiredWhenConfigured(BasePermission):
    message = "An API token is required."

    def has_permission(self, request, view):
        return self.allows_anonymous() or is_trusted(request)

    def allows_anonymous(self) -> bool:
        """Whether a caller without credentials gets through (the schema says so)."""
        return not settings.API_TOKENS


class TrustedCallerOnly(BasePermission):
    message = "This needs an API token or a staff login."

    def has_permission(self, request, view):
        return is_trusted(request)

    def allows_anonymous(self) -> bool:
        return False
