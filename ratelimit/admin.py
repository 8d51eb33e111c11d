from __future__ import annotations

from django.contrib import admin

from ratelimit.observations import RateLimitObservation


class KeyKindFilter(admin.SimpleListFilter):
    """Which kind of bucket: a plain host, a GitHub installation, the App, a token."""

    title = "key kind"
    parameter_name = "key_kind"
    KINDS = {
        "host": "host:",
        "github-installation": "github-installation:",
        "github-app": "github-app:",
        "github-token": "github-token:",
    }

    def lookups(self, request, model_admin):
        return [(kind, kind) for kind in self.KINDS]

    def queryset(self, request, queryset):
        prefix = self.KINDS.get(self.value() or "")
        return queryset.filter(key__startswith=prefix) if prefix else queryset


@admin.register(RateLimitObservation)
class RateLimitObservationAdmin(admin.ModelAdmin):
    """History only: admission reads the hot copy in Redis, so nothing here is editable."""

    list_display = [
        "observed_at",
        "key",
        "resource",
        "kind",
        "status_code",
        "remaining",
        "limit",
        "reset_at",
        "blocked_until",
    ]
    list_filter = [KeyKindFilter, "resource", "kind", "observed_at"]
    search_fields = ["=key", "key"]
    date_hierarchy = "observed_at"
    readonly_fields = [field.name for field in RateLimitObservation._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
