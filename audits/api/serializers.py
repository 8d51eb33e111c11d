from __future__ import annotations

from django.urls import reverse
from rest_framework import serializers

from audits.models import Audit
from audits.targets import InvalidURL, NormalizedURL, normalize_url


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

    def validate_url(self, value: str) -> NormalizedURL:
        try:
            return normalize_url(value)
        except InvalidURL as exc:
            raise serializers.ValidationError(str(exc)) from None


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
