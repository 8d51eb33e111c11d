from __future__ import annotations

import copy

from django.conf import settings
from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from audits.changes import FIELDS as CHANGE_FIELDS
from audits.findings import CHECK_IDS, FINDING_MAX_ITEMS, FINDING_MAX_TEXT, OUTCOMES
from audits.models import Audit, Page
from audits.secrets import without_password
from outbound.integrations.webhook import validate_secret
from outbound.urls import (
    MAX_HOST_GROWTH,
    MAX_HOST_LENGTH,
    MAX_URL_LENGTH,
    InvalidURL,
    NormalizedURL,
    normalize_host,
    normalize_url,
)

# What the schema says of a URL and a secret: what outbound.urls.normalize_url and
# outbound.integrations.webhook.validate_secret accept (they stay the one check).
# Normalizing may add the path's "/" and dot a short IPv4 host, and the normalized URL
# must fit MAX_URL_LENGTH.
SUBMITTED_URL_MAX_LENGTH = MAX_URL_LENGTH - 1 - MAX_HOST_GROWTH
HTTP_URL_SCHEMA = {
    "type": "string",
    "format": "uri",
    # Scheme, optional user info, a host of at most MAX_HOST_LENGTH (no %-escapes, whose
    # decoding may grow it), optional port, the rest.
    "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://(?:[^/?#@]*@)?"
    f"[^/?#@:%]{{1,{MAX_HOST_LENGTH}}}(?::[0-9]{{1,5}})?(?:[/?#].*)?$",
    "minLength": 1,
    "maxLength": SUBMITTED_URL_MAX_LENGTH,
}
# `whsec_` + base64 of 16 to 64 bytes: 6 to 21 groups of four, or 22 ending in `==`.
_B64 = "[A-Za-z0-9+/]"
WEBHOOK_SECRET_SCHEMA = {
    "type": "string",
    "pattern": f"^whsec_(?:(?:{_B64}{{4}}){{5,20}}(?:{_B64}{{4}}|{_B64}{{3}}=|{_B64}{{2}}==)"
    f"|(?:{_B64}{{4}}){{21}}{_B64}{{2}}==)$",
}


@extend_schema_field(HTTP_URL_SCHEMA)
class HttpUrlField(serializers.CharField):
    """An http or https URL; the serializer normalizes it (outbound.urls)."""

    def __init__(self, **kwargs):
        super().__init__(max_length=SUBMITTED_URL_MAX_LENGTH, trim_whitespace=False, **kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        # Refused, not trimmed: the schema's pattern does not allow it either.
        if value != value.strip():
            raise serializers.ValidationError("Must not start or end with whitespace.")
        return value


@extend_schema_field(WEBHOOK_SECRET_SCHEMA)
class WebhookSecretField(serializers.CharField):
    """A Standard Webhooks signing secret: write-only, never trimmed nor echoed."""

    def __init__(self, **kwargs):
        super().__init__(write_only=True, trim_whitespace=False, **kwargs)


def field_copy(field: serializers.Field) -> serializers.Field:
    """An unbound copy of `field` for one serializer instance to bind.

    DRF's own copy (`Field.__deepcopy__`) calls the field's constructor again with copies
    of its arguments: 90 us of the 130 us an AuditSerializer took to get its fields, 28 of
    the 31 us of an AuditSubmissionSerializer (a submission pays for both). A
    field that holds no other field is never changed once built but by `bind`, which sets
    attributes of its own, so a copy of its attributes serves: what the copies share (the
    validators' list, choices, error messages) no field writes to after its constructor. A
    field holding others (a nested serializer, a list's child, a relation's) is copied
    DRF's way: its child is bound to it, and a shared child would answer to the wrong
    parent.
    """
    if isinstance(field, serializers.BaseSerializer) or any(
        hasattr(field, name) for name in ("child", "child_relation")
    ):
        return copy.deepcopy(field)
    clone = object.__new__(type(field))
    clone.__dict__.update(field.__dict__)
    return clone


class FieldsBuiltOnce:
    """A serializer whose fields are built once per class, each instance binding copies.

    DRF builds a serializer's fields for every instance: a ModelSerializer's from the
    model's metadata (a tenth of a submission's CPU under py-spy), any serializer's as
    copies of its declared ones. They depend only on the class, so they are built once,
    DRF's way, and each instance gets a `field_copy` of each.
    """

    def get_fields(self):
        cls = type(self)
        built = cls.__dict__.get("_built_fields")
        if built is None:
            built = cls._built_fields = super().get_fields()
        return {name: field_copy(field) for name, field in built.items()}


class StrictSerializer(FieldsBuiltOnce, serializers.Serializer):
    """Refuses fields it does not know, so a typo is an error, not silently ignored."""

    refuses_unknown_fields = True  # the schema says so: additionalProperties false

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


class AuditSubmissionSerializer(StrictSerializer):
    """POST /api/audits: the URL, and optionally where to POST the finished audit."""

    # Each needs the other (the schema's dependentRequired).
    fields_together = ("callback_url", "callback_secret")

    url = HttpUrlField(help_text="An http or https URL to audit.")
    callback_url = HttpUrlField(
        required=False,
        help_text="An http or https URL the finished audit is POSTed to (Standard Webhooks).",
    )
    callback_secret = WebhookSecretField(
        required=False,
        help_text="The signing secret, `whsec_` + base64 of 16 to 64 random bytes. "
        "Required with callback_url; never shown again.",
    )

    def validate_url(self, value: str) -> NormalizedURL:
        try:
            return normalize_url(value)
        except InvalidURL as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate_callback_url(self, value: str) -> str:
        return valid_callback_url(value)

    def validate_callback_secret(self, value: str) -> str:
        return valid_callback_secret(value)

    def validate(self, data):
        require_callback_pair(data)
        return data


def valid_callback_url(value: str) -> str:
    """A callback URL, normalized as a submitted URL is."""
    try:
        return normalize_url(value).url
    except InvalidURL as exc:
        raise serializers.ValidationError(str(exc)) from None


def valid_callback_secret(value: str) -> str:
    try:
        return validate_secret(value)
    except ValueError as exc:
        # The message never repeats the value: it is a secret.
        raise serializers.ValidationError(str(exc)) from None


def require_callback_pair(data: dict) -> None:
    if ("callback_url" in data) != ("callback_secret" in data):
        missing = "callback_secret" if "callback_url" in data else "callback_url"
        raise serializers.ValidationError(
            {missing: ["callback_url and callback_secret go together."]}
        )


class LinksSerializer(serializers.Serializer):
    self = serializers.CharField(help_text="This resource's URL.")


class ChangeSerializer(serializers.Serializer):
    field = serializers.ChoiceField(choices=CHANGE_FIELDS)
    before = serializers.JSONField(help_text="The value in the previous succeeded audit.")
    after = serializers.JSONField(help_text="The value in this audit.")
    added = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="missing_security_headers: headers now missing; broken_links: newly broken; "
        "failing_checks: checks (result.findings ids) that started failing.",
    )
    removed = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="missing_security_headers: headers now sent; broken_links: fixed; "
        "failing_checks: checks that stopped failing.",
    )


@extend_schema_field(ChangeSerializer(many=True))
class ChangesField(serializers.Field):
    """An audit's changes, each as ChangeSerializer writes it, or null.

    Not a nested `ChangeSerializer(many=True)`: a field holding a child is copied whole for
    every serializer instance (field_copy), the child and its five fields built again, 70 us
    of the 320 an AuditSerializer took, on every submission's answer, though most audits
    have no changes. This field holds no child, and one ChangeSerializer, which keeps no
    state between calls, writes every change.
    """

    _change = ChangeSerializer()

    def __init__(self, **kwargs):
        super().__init__(read_only=True, allow_null=True, **kwargs)

    def to_representation(self, changes):
        return [self._change.to_representation(change) for change in changes]


@extend_schema_field(
    {
        "type": ["object", "null"],
        "description": "What the audit found; null until it succeeds. Bounded whatever the "
        "page: `external_links` and `links` (one entry per external link, its outcome) list "
        "at most AUDIT_MAX_LINKS distinct links, the first in the page; `link_counts` "
        "counts every link (internal, external; past the cap each time it appears), "
        "`links_over_cap` the external ones not listed, `links_too_long` those longer than "
        "2048 characters, and `links_truncated` is true when any link went unlisted. "
        "`link_check.outcomes` counts the listed links per outcome. A webhook payload "
        "lists at most WEBHOOK_MAX_LINKS of them (broken first), with `links_truncated` "
        "true; `links.self` is the full audit. `findings` holds one verdict per SEO check.",
        "properties": {
            "findings": {
                "type": "array",
                "description": "One entry per check, in this order: Lighthouse 12.2.3's ten "
                "SEO audits with its meaning (is-crawlable, http-status-code, document-title, "
                "meta-description, canonical, hreflang, robots-txt, crawlable-anchors, "
                "link-text, image-alt), then viewport, mixed-content (https pages) and "
                "structured-data (JSON-LD that does not parse).",
                "items": {
                    "type": "object",
                    "required": ["id", "outcome", "severity", "details"],
                    "properties": {
                        "id": {"type": "string", "enum": list(CHECK_IDS)},
                        "outcome": {"type": "string", "enum": list(OUTCOMES)},
                        "severity": {"type": "string", "enum": ["high", "medium", "low"]},
                        "details": {
                            "type": "object",
                            "description": "What failed or was read: `items` lists at most "
                            f"{FINDING_MAX_ITEMS} offending elements or values (each clipped "
                            f"at {FINDING_MAX_TEXT} characters), `count` all of them; "
                            "`reason` says why a check failed or did not apply.",
                            "additionalProperties": True,
                        },
                    },
                },
            },
        },
        "additionalProperties": True,
    }
)
class ResultField(serializers.JSONField):
    pass


class BuiltOnceModelSerializer(FieldsBuiltOnce, serializers.ModelSerializer):
    """A ModelSerializer whose fields are built from the model once per class."""


def viewer(context: dict):
    """The authenticated user the response is for, or None (anonymous, or no request)."""
    request = context.get("request")
    user = getattr(request, "user", None)
    return user if user is not None and user.is_authenticated else None


CALLBACK_URL_SCHEMA = {"type": ["string", "null"], "format": "uri"}


class AuditSerializer(BuiltOnceModelSerializer):
    url = serializers.CharField(source="page.url", read_only=True)
    result = ResultField(read_only=True)
    page = serializers.UUIDField(
        source="page.public_id", read_only=True, help_text="The page's id."
    )
    callback_url = serializers.SerializerMethodField(
        help_text="Where the finished audit is POSTed, its password shown as `***`: only to "
        "its submitter (the submission's own answer, and later the same token or login); "
        "null for anyone else, and without a callback."
    )
    changes = ChangesField(
        help_text="A succeeded audit's changes since the page's previous succeeded audit: "
        "null for the page's first (or when not succeeded), [] when nothing changed.",
    )
    links = serializers.SerializerMethodField()
    started_at = serializers.DateTimeField(
        source="attempt_started_at",
        read_only=True,
        allow_null=True,
        help_text="When its latest attempt began.",
    )

    class Meta:
        model = Audit
        fields = [
            "id",
            "url",
            "page",
            "status",
            "trigger",
            "attempts",
            "created_at",
            "started_at",
            "finished_at",
            "result",
            "changes",
            "got_worse",
            "error",
            "callback_url",
            "links",
        ]
        read_only_fields = fields

    @extend_schema_field(CALLBACK_URL_SCHEMA)
    def get_callback_url(self, audit: Audit) -> str | None:
        if not audit.callback_url:
            return None
        # The submission's own answer goes to its submitter, anonymous or not.
        submitter = self.context.get("submitted") or (
            audit.submitter_id is not None
            and (user := viewer(self.context)) is not None
            and user.pk == audit.submitter_id
        )
        return without_password(audit.callback_url) if submitter else None

    @extend_schema_field(LinksSerializer)
    def get_links(self, audit: Audit) -> dict:
        return links_to(self.context, "audit-detail", audit_id=audit.id)


def links_to(context: dict, view_name: str, **kwargs) -> dict:
    """{"self": the resource's absolute URL: the request's, or PUBLIC_BASE_URL's without
    one (a webhook payload)}."""
    path = reverse(view_name, kwargs=kwargs)
    request = context.get("request")
    return {
        "self": request.build_absolute_uri(path) if request else settings.PUBLIC_BASE_URL + path
    }


class AuditListQuerySerializer(StrictSerializer):
    status = serializers.ChoiceField(choices=Audit.Status.choices, required=False)
    trigger = serializers.ChoiceField(choices=Audit.Trigger.choices, required=False)
    page = serializers.IntegerField(min_value=1, required=False)
    page_size = serializers.IntegerField(min_value=1, max_value=100, required=False)


class StrictBooleanField(serializers.BooleanField):
    """true or false only: DRF's own also takes "yes", 1 and "on", which the schema does not."""

    def to_internal_value(self, data):
        if isinstance(data, bool):
            return data
        self.fail("invalid", input=data)


class PageUpdateSerializer(StrictSerializer):
    """PATCH /api/pages/<id>: any of the fields. The page callback is set (both strings)
    or removed (both null) as a pair."""

    fields_together = ("callback_url", "callback_secret")
    null_together = ("callback_url", "callback_secret")

    reaudit_nightly = StrictBooleanField(
        required=False, help_text="Whether the page is audited again every night."
    )
    callback_url = HttpUrlField(
        required=False,
        allow_null=True,
        help_text="An http or https URL that `audit.changed` is POSTed to whenever an audit of "
        "this page finds a change (Standard Webhooks); null, with callback_secret null, "
        "removes the page callback.",
    )
    callback_secret = WebhookSecretField(
        required=False,
        allow_null=True,
        help_text="The signing secret, `whsec_` + base64 of 16 to 64 random bytes, or null "
        "with callback_url null. Never shown again.",
    )

    def validate_callback_url(self, value: str | None) -> str | None:
        return None if value is None else valid_callback_url(value)

    def validate_callback_secret(self, value: str | None) -> str | None:
        return None if value is None else valid_callback_secret(value)

    def validate(self, data):
        require_callback_pair(data)
        if (data.get("callback_url") is None) != (data.get("callback_secret") is None):
            null = "callback_url" if data.get("callback_url") is None else "callback_secret"
            raise serializers.ValidationError(
                {null: ["Both null (removing the page callback) or neither."]}
            )
        return data


class LatestAuditSerializer(BuiltOnceModelSerializer):
    changes = ChangesField()
    links = serializers.SerializerMethodField()

    class Meta:
        model = Audit
        fields = ["id", "status", "finished_at", "changes", "got_worse", "links"]
        read_only_fields = fields

    @extend_schema_field(LinksSerializer)
    def get_links(self, audit: Audit) -> dict:
        return links_to(self.context, "audit-detail", audit_id=audit.id)


class PageSerializer(BuiltOnceModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True, help_text="The page's id.")
    callback_url = serializers.SerializerMethodField(
        help_text="Where `audit.changed` is POSTed, its password shown as `***`; null "
        "without a page callback, and for staff reading another user's page."
    )
    latest_audit = serializers.SerializerMethodField(
        help_text="The page's newest audit, whatever its status; null before its first."
    )
    links = serializers.SerializerMethodField()

    class Meta:
        model = Page
        fields = [
            "id",
            "url",
            "domain",
            "reaudit_nightly",
            "callback_url",
            "latest_audit",
            "last_changed_at",
            "created_at",
            "links",
        ]
        read_only_fields = fields

    @extend_schema_field({"type": ["string", "null"], "format": "uri"})
    def get_callback_url(self, page: Page) -> str | None:
        # The page's callback is its owner's; an anonymous page's, the staff's who set it.
        user = viewer(self.context)
        if not page.callback_url or user is None:
            return None
        if page.owner_id == user.pk or (page.owner_id is None and user.is_staff):
            return without_password(page.callback_url)
        return None

    @extend_schema_field(LatestAuditSerializer(allow_null=True))
    def get_latest_audit(self, page: Page) -> dict | None:
        # `latest_audits` is prefetched (newest first, one row) by the views.
        latest = getattr(page, "latest_audits", None)
        if latest is None:
            latest = list(page.audits.order_by("-created_at", "-id")[:1])
        return LatestAuditSerializer(latest[0], context=self.context).data if latest else None

    @extend_schema_field(LinksSerializer)
    def get_links(self, page: Page) -> dict:
        return links_to(self.context, "page-detail", page_id=page.public_id)


class PageListQuerySerializer(StrictSerializer):
    domain = serializers.CharField(
        max_length=255,
        required=False,
        help_text="Only pages of this host name (spelled as URLs are: `Example.ORG.` is `example.org`).",
    )
    reaudit_nightly = serializers.ChoiceField(
        choices=["true", "false"],
        required=False,
        help_text="Only pages re-audited nightly, or not.",
    )
    changed_since = serializers.DateTimeField(
        required=False, help_text="Only pages whose last change was found at or after this time."
    )
    page = serializers.IntegerField(min_value=1, required=False)
    page_size = serializers.IntegerField(min_value=1, max_value=100, required=False)

    def validate_domain(self, value: str) -> str:
        try:
            return normalize_host(value.strip())
        except InvalidURL:
            return value.strip().lower()  # no page has a host spelled so: none listed


class PageHistoryQuerySerializer(StrictSerializer):
    page = serializers.IntegerField(min_value=1, required=False)
    page_size = serializers.IntegerField(min_value=1, max_value=100, required=False)


class AuditHistorySerializer(serializers.Serializer):
    """One page of a page's audits, newest first (the list endpoints' pagination)."""

    count = serializers.IntegerField(min_value=0)
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = AuditSerializer(many=True)


class PageDetailSerializer(PageSerializer):
    audits = serializers.SerializerMethodField(
        help_text="The page's audits, newest first, paginated by `page` and `page_size`."
    )

    class Meta(PageSerializer.Meta):
        fields = [*PageSerializer.Meta.fields, "audits"]
        read_only_fields = fields

    @extend_schema_field(AuditHistorySerializer)
    def get_audits(self, page: Page) -> dict:
        return self.context["audit_history"]
