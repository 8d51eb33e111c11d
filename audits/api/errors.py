"""Every API error is a JSON body: {"error": code, "message": ..., "fields": {...}}."""

from __future__ import annotations

import random
import sys

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import JsonResponse
from django.views.defaults import page_not_found, server_error
from rest_framework import exceptions, status
from rest_framework.views import exception_handler


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "Request body is too large."
    default_code = "payload_too_large"


class ServiceUnavailable(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "The service cannot take this request right now."
    default_code = "unavailable"

    def __init__(
        self, detail=None, code=None, *, retry_after: int | None = None, extra: dict | None = None
    ):
        super().__init__(detail, code)
        self.retry_after = retry_after
        self.extra = extra or {}


class ClientBacklogFull(ServiceUnavailable):
    """One client holds its share of the backlog (audits.admission): its own submissions
    wait, everyone else's are admitted."""

    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_detail = "Your audits already hold your share of the backlog."
    default_code = "client_backlog_full"


# A database that is away (restarting, failing over, out of connections) is a 503 the
# client may retry, spread over this range so clients do not all come back at once.
DATABASE_RETRY_AFTER_SECONDS = (5, 15)
# What Django raises when it cannot reach the database or lost its connection mid-request.
DATABASE_AWAY = (OperationalError, InterfaceError)


def database_unavailable() -> ServiceUnavailable:
    return ServiceUnavailable(
        "The database cannot be reached right now; nothing was changed. Try again shortly.",
        code="database_unavailable",
        retry_after=random.randint(*DATABASE_RETRY_AFTER_SECONDS),
    )


def json_exception_handler(exc, context):
    if isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge(f"Request body must be at most {settings.API_MAX_BODY_BYTES} bytes.")
    if isinstance(exc, DATABASE_AWAY):
        exc = database_unavailable()
    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        response.data = {
            "error": "invalid_request",
            "message": "Some fields are not valid.",
            "fields": _field_errors(response.data),
        }
        return response
    detail = getattr(exc, "detail", None)
    code = getattr(exc, "default_code", "error")
    if isinstance(detail, exceptions.ErrorDetail):
        code = detail.code or code
    body = {"error": code, "message": str(detail) if detail is not None else ""}
    body.update(getattr(exc, "extra", {}))
    response.data = body
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        response["Retry-After"] = str(int(retry_after))
    return response


def _field_errors(data) -> dict:
    if isinstance(data, dict):
        return {key: _flatten(value) for key, value in data.items()}
    return {"non_field_errors": _flatten(data)}


def _flatten(value) -> list[str]:
    if isinstance(value, list):
        return [str(item) for item in value]
    if isinstance(value, dict):
        return [f"{k}: {m}" for k, v in value.items() for m in _flatten(v)]
    return [str(value)]


def json_not_found(request, exception=None):
    """404 for any unknown URL, as JSON under /api/ and Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "not_found", "message": "No such resource."}, status=404)
    return page_not_found(request, exception)


def json_server_error(request):
    """handler500. Django calls it while handling the exception: one that says the
    database is away (raised outside an API view, e.g. by a middleware reading the
    session) is a 503 with Retry-After, not a 500."""
    if isinstance(sys.exc_info()[1], DATABASE_AWAY):
        unavailable = database_unavailable()
        response = JsonResponse(
            {"error": "database_unavailable", "message": str(unavailable.detail)}, status=503
        )
        response["Retry-After"] = str(unavailable.retry_after)
        return response
    if request.path.startswith("/api/"):
        return JsonResponse(
            {"error": "internal_error", "message": "Something went wrong on our side."}, status=500
        )
    return server_error(request)
