"""What /api/schema says beyond what drf-spectacular reads from the views.

- Every operation lists every status it can answer, each error with its JSON body:
  401 and 403 everywhere (a bad `Authorization` header is refused even where no token is
  needed; a session without its CSRF token is refused on writes), 400 wherever there is
  input, 404 wherever the path names something or a list is paginated, 413 and 415
  wherever there is a body. 429 and 503 are declared by the views that answer them,
  and carry `Retry-After`.
- Security follows the permission classes: an operation lists `{}` (no credentials)
  exactly when its permissions let an anonymous caller through with the settings the
  schema is served under (API_TOKENS, API_REQUIRE_TOKEN).
- Links: a created audit leads to itself and to its page, a page to its update and removal.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

ERROR_DESCRIPTIONS = {
    400: "Invalid input: `fields` names each refused field (`malformed_json`: the body is not "
    "JSON). Nothing was written.",
    401: "No valid credentials: send `Authorization: Bearer <token>` (or log in as staff).",
    403: "Not allowed: a login that is not staff, or a session request without its CSRF token.",
    404: "No such resource, or not yours (another client's page), or no such page of results.",
    413: "The body is larger than API_MAX_BODY_BYTES.",
    415: "The body is not `application/json`.",
    429: "Too many submissions from this address (`throttled`), or your audits already hold "
    "your share of the backlog (`client_backlog_full`, with `held` and `share`: other "
    "clients are still admitted). Nothing was written; try again after `Retry-After` seconds.",
    503: "Cannot take this now (`backlog_full` with `backlog` and `max_depth`, or "
    "`*_unavailable`); nothing was written. Try again after `Retry-After` seconds.",
}
RETRY_AFTER = {
    "description": "Whole seconds to wait before trying again.",
    "required": True,
    "schema": {"type": "integer", "minimum": 1},
}
WWW_AUTHENTICATE = {
    "description": "How to authenticate: `Bearer`.",
    "required": True,
    "schema": {"type": "string"},
}


class ErrorSerializer(serializers.Serializer):
    """Every error the API answers: a stable code and a sentence."""

    error = serializers.CharField(help_text="A stable code: not_found, not_authenticated, ...")
    message = serializers.CharField()


class InvalidRequestSerializer(ErrorSerializer):
    fields = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="Each refused field (query parameter or body field) with why; "
        "`non_field_errors` for the body as a whole.",
    )


class UnavailableSerializer(ErrorSerializer):
    backlog = serializers.IntegerField(required=False, help_text="With backlog_full.")
    max_depth = serializers.IntegerField(required=False, help_text="With backlog_full.")


class TooManyRequestsSerializer(ErrorSerializer):
    held = serializers.IntegerField(
        required=False,
        help_text="With client_backlog_full: what your unfinished audits hold of the backlog "
        "(an audit checking links, one per check it still waits on), counted up to your "
        "share: past it, your share.",
    )
    share = serializers.IntegerField(
        required=False,
        help_text="With client_backlog_full: the most one client may hold "
        "(AUDIT_CLIENT_MAX_SHARE of AUDIT_QUEUE_MAX_DEPTH).",
    )


ERROR_BODIES = {
    400: InvalidRequestSerializer,
    429: TooManyRequestsSerializer,
    503: UnavailableSerializer,
}


def error(status: int) -> dict:
    """The responses entry for an error status, for a view's @extend_schema."""
    return {
        status: OpenApiResponse(
            ERROR_BODIES.get(status, ErrorSerializer), ERROR_DESCRIPTIONS[status]
        )
    }


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "audits.api.auth.ApiTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A token from API_TOKENS (`name:secret`: the secret) or one made "
            "in the admin; it acts as its user, who owns the pages it creates.",
        }


class PlumbAutoSchema(AutoSchema):
    def get_auth(self):
        required = [scheme for scheme in super().get_auth() if scheme]
        if all(_allows_anonymous(permission) for permission in self.view.get_permissions()):
            required.append({})
        return required

    def _map_basic_serializer(self, serializer, direction):
        schema = super()._map_basic_serializer(serializer, direction)
        if direction != "request":
            return schema
        if getattr(serializer, "refuses_unknown_fields", False):
            schema["additionalProperties"] = False
        together = getattr(serializer, "fields_together", ())
        if together:
            schema["dependentRequired"] = {
                name: [other for other in together if other != name] for name in together
            }
        first, second = getattr(serializer, "null_together", (None, None))
        if first:
            # Given as null, the other is null too; given as a string, the other is one too.
            schema["if"] = {"properties": {first: {"type": "null"}}, "required": [first]}
            schema["then"] = {"properties": {second: {"type": "null"}}}
            schema["else"] = {"properties": {second: {"type": "string"}}}
        return schema

    def get_operation(self, *args, **kwargs):
        operation = super().get_operation(*args, **kwargs)
        if operation is None:
            return None
        responses = operation["responses"]
        for status in self._error_statuses(operation):
            responses.setdefault(str(status), self._error_response(status))
        for status, headers in (("401", {"WWW-Authenticate": WWW_AUTHENTICATE}),
                                ("429", {"Retry-After": RETRY_AFTER}),
                                ("503", {"Retry-After": RETRY_AFTER})):  # fmt: skip
            if status in responses:
                responses[status].setdefault("headers", {}).update(headers)
        operation["responses"] = dict(sorted(responses.items()))
        return operation

    def _error_statuses(self, operation: dict) -> list[int]:
        where = {parameter["in"] for parameter in operation.get("parameters", [])}
        names = {parameter["name"] for parameter in operation.get("parameters", [])}
        statuses = [401, 403]
        if "query" in where or "requestBody" in operation:
            statuses.append(400)
        if "path" in where or "page" in names:
            statuses.append(404)
        if "requestBody" in operation:
            statuses += [413, 415]
        return statuses

    def _error_response(self, status: int) -> dict:
        body = ERROR_BODIES.get(status, ErrorSerializer)
        return {
            "description": ERROR_DESCRIPTIONS[status],
            "content": {
                "application/json": {"schema": self.resolve_serializer(body, "response").ref}
            },
        }


def _allows_anonymous(permission) -> bool:
    allows = getattr(permission, "allows_anonymous", None)
    return bool(allows and allows())


# --- Postprocessing: links -------------------------------------------------------------

LINKS = {
    ("audits_create", "202"): {
        "GetAuditById": {
            "operationId": "audits_retrieve",
            "parameters": {"audit_id": "$response.body#/id"},
            "description": "The audit just queued, to read until it finishes.",
        },
        "GetPageOfAudit": {
            "operationId": "pages_retrieve",
            "parameters": {"page_id": "$response.body#/page"},
            "description": "The audited page and its history.",
        },
    },
    ("pages_retrieve", "200"): {
        "UpdatePage": {
            "operationId": "pages_partial_update",
            "parameters": {"page_id": "$response.body#/id"},
        },
        "RemovePage": {
            "operationId": "pages_destroy",
            "parameters": {"page_id": "$response.body#/id"},
        },
    },
}


def add_links(result, generator, request, public):
    """drf-spectacular postprocessing hook: the OpenAPI links between operations."""
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            for (operation_id, status), links in LINKS.items():
                if operation.get("operationId") == operation_id:
                    operation["responses"][status]["links"] = links
    return result
