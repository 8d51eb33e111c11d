from __future__ import annotations

from django.urls import reverse
from rest_framework import serializers

from audits.models import Audit
from outbound.integrations.webhook import validate_secret
from outbound.urls import InvalidURL, NormalizedURL, normalize_url


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, so a typo is an error, not silently ignored."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


class AuditSubmissionSerializer(StrictSerializer):
    url = serializers.CharField(
        max_length=4096,
        trim_whitespace=True,
        help_text="An http or https URL to audit.",
    )

    callback_url = serializers.CharField(
        max_length=4096,
        trim_whitespace=True,
        required=False,
        help_text="An http or https URL the finished audit is POSTed to (Standard Webhooks).",
    )
    callback_secret = serializers.CharField(
        required=False,
        write_only=True,
        trim_whitespace=True,
        help_text="The signing secret, `whsec_` + base64 of 16 to 64 random bytes. "
        "Required with callback_url; never shown again.",
    )

    def validate_url(self, value: str) -> NormalizedURL:
        try:
            return normalize_url(value)
        except InvalidURL as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate_callback_url(self, value: str) -> str:
        try:
            return normalize_url(value).url
        except InvalidURL as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate_callback_secret(self, value: str) -> str:
        try:
            return validate_secret(value)
        except ValueError as exc:
            # The message never repeats the value: it is a secret.
            raise serializers.ValidationError(str(exc)) from None

    def validate(self, data):
        if ("callback_url" in data) != ("callback_secret" in data):
            missing = "callback_secret" if "callback_url" in data else "callback_url"
            raise serializers.ValidationError(
                {missing: ["callback_url and callback_secret go together."]}
            )
        return data


class AuditLinksSerializer(serializers.Serializer):
    self = serializers.CharField()


class AuditSerializer(serializers.ModelSerializer):
    url = serializers.CharField(source="page.url", read_only=True)
    links = serializers.SerializerMethodField()

    class Meta:
        model = Audit
        fields = [
            "id",
            "url",
            "status",
            "trigger",
            "attempts",
            "created_at",
            "started_at",
            "finished_at",
            "result",
            "error",
            "callback_url",
            "links",
        ]
        read_only_fields = fields

    def get_links(self, audit: Audit) -> dict:
        path = reverse("audit-detail", kwargs={"audit_id": audit.id})
        request = self.context.get("request")
        return {"self": request.build_absolute_uri(path) if request else path}


class AuditListQuerySerializer(StrictSerializer):
    status = serializers.ChoiceField(choices=Audit.Status.choices, required=False)
    trigger = serializers.ChoiceField(choices=Audit.Trigger.choices, required=False)
    page = serializers.IntegerField(min_value=1, required=False)
    page_size = serializers.IntegerField(min_value=1, max_value=100, required=False)
