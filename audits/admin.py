import json

from django.contrib import admin
from django.utils.html import format_html

from audits.models import Audit, LinkCheck, Page


@admin.register(Page)
class PageAdmin(admin.ModelAdmin):
    list_display = ["url", "domain", "reaudit_nightly", "created_at"]
    list_filter = ["reaudit_nightly"]
    search_fields = ["url", "domain"]
    list_editable = ["reaudit_nightly"]
    readonly_fields = ["created_at"]


class LinkCheckInline(admin.TabularInline):
    model = LinkCheck
    extra = 0
    can_delete = False
    fields = ["url", "status", "status_code", "final_url", "github", "detail", "retry_at"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(LinkCheck)
class LinkCheckAdmin(admin.ModelAdmin):
    list_display = ["url", "status", "status_code", "audit_id", "retry_at", "finished_at"]
    list_filter = ["status"]
    search_fields = ["url", "=audit__id"]
    raw_id_fields = ["audit"]
    readonly_fields = [
        "audit", "url", "status", "task_id", "status_code", "final_url", "github", "detail",
        "retry_at", "created_at", "finished_at",
    ]  # fmt: skip

    def has_add_permission(self, request):
        return False


@admin.register(Audit)
class AuditAdmin(admin.ModelAdmin):
    inlines = [LinkCheckInline]
    list_display = ["id", "page_url", "status", "trigger", "attempts", "created_at", "finished_at"]
    list_filter = ["status", "trigger", "created_at"]
    search_fields = ["page__url", "=id", "=task_id"]
    list_select_related = ["page"]
    raw_id_fields = ["page"]
    date_hierarchy = "created_at"
    readonly_fields = [
        "id",
        "page",
        "status",
        "trigger",
        "attempts",
        "task_id",
        "idempotency_key",
        "created_at",
        "started_at",
        "finished_at",
        "link_checks_deadline",
        "error",
        "callback_url",
        "result_pretty",
    ]
    # The callback secret is write-only: never shown, not even to staff.
    exclude = ["result", "callback_secret"]

    @admin.display(description="URL", ordering="page__url")
    def page_url(self, audit: Audit) -> str:
        return audit.page.url

    @admin.display(description="Result")
    def result_pretty(self, audit: Audit):
        if audit.result is None:
            return "-"
        return format_html("<pre>{}</pre>", json.dumps(audit.result, indent=2, sort_keys=True))

    def has_add_permission(self, request):
        return False
