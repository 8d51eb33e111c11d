import json

from django.contrib import admin, messages
from django.db.models.functions import Length
from django.utils.html import format_html, format_html_join

from audits.api.auth import new_token
from audits.findings import CHECK_IDS
from audits.models import ApiToken, Audit, LinkCheck, Page, RobotsTxt, SharedLink
from audits.pages import failing
from audits.secrets import without_password


class RemovedFilter(admin.SimpleListFilter):
    title = "removed through the API"
    parameter_name = "removed"

    def lookups(self, request, model_admin):
        return [("no", "Current"), ("yes", "Removed")]

    def queryset(self, request, queryset):
        if self.value() == "no":
            return queryset.filter(removed_at=None)
        if self.value() == "yes":
            return queryset.exclude(removed_at=None)
        return queryset


class FailingCheckFilter(admin.SimpleListFilter):
    title = "failing check"
    parameter_name = "failing_check"

    def lookups(self, request, model_admin):
        return [(check, check) for check in CHECK_IDS]

    def queryset(self, request, queryset):
        if self.value():
            return failing(queryset, self.value())
        return queryset


@admin.register(Page)
class PageAdmin(admin.ModelAdmin):
    list_display = [
        "url", "domain", "owner", "reaudit_nightly", "page_callback", "last_changed_at",
        "removed_at", "created_at",
    ]  # fmt: skip
    list_filter = ["reaudit_nightly", RemovedFilter, FailingCheckFilter, "last_changed_at"]
    search_fields = ["url", "domain", "=public_id", "owner__username"]
    list_editable = ["reaudit_nightly"]
    list_select_related = ["owner"]
    raw_id_fields = ["owner"]
    readonly_fields = [
        "public_id", "page_callback", "created_at", "last_changed_at", "last_worse_at",
        "removed_at", "failing_checks",
    ]  # fmt: skip
    # The page callback is set through the API, as a pair with its secret; the secret is
    # write-only (never shown) and the URL's password shown as `***`.
    exclude = ["callback_url", "callback_secret"]

    @admin.display(description="Page callback", ordering="callback_url")
    def page_callback(self, page: Page) -> str:
        return without_password(page.callback_url) or "-"


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """API tokens, each acting as its user. Only a hash is kept: a new token is shown once,
    in the message after it is added; losing it means adding another."""

    list_display = ["name", "user", "prefix", "created_at"]
    list_select_related = ["user"]
    search_fields = ["name", "user__username", "prefix"]
    raw_id_fields = ["user"]
    fields = ["user", "name", "prefix", "created_at"]
    readonly_fields = ["prefix", "created_at"]

    def get_readonly_fields(self, request, obj=None):
        # A token's user is what it acts as: a saved token is never moved to another user.
        return [*self.readonly_fields, "user"] if obj is not None else self.readonly_fields

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        token = new_token(obj)
        super().save_model(request, obj, form, change)
        messages.warning(
            request, f"The new token, shown only this once: {token}", extra_tags="api-token"
        )


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
    raw_id_fields = ["audit", "link"]
    readonly_fields = [
        "audit", "url", "link", "status", "status_code", "final_url", "github", "detail",
        "retry_at", "created_at", "finished_at",
    ]  # fmt: skip

    def has_add_permission(self, request):
        return False


@admin.register(SharedLink)
class SharedLinkAdmin(admin.ModelAdmin):
    """Each distinct link's latest outcome, and whether a check of it is in flight."""

    list_display = ["url", "status", "status_code", "checked_at", "check_status"]
    list_filter = ["status", "check_status"]
    search_fields = ["url"]
    readonly_fields = [
        "url", "status", "status_code", "final_url", "github", "detail", "checked_at",
        "check_status", "task_id", "attempts", "attempt_started_at", "next_attempt_at",
        "published_at", "suspect_since",
    ]  # fmt: skip

    def has_add_permission(self, request):
        return False


@admin.register(RobotsTxt)
class RobotsTxtAdmin(admin.ModelAdmin):
    """Each origin's robots.txt as last read (audits.robots), to look at, not to edit: the
    workers own the rows, and the prune lets them go (audits.retention)."""

    list_display = [
        "origin", "availability", "status_code", "fetched_at", "fresh_until", "crawl_delay",
        "size", "truncated", "claimed_until",
    ]  # fmt: skip
    list_filter = ["availability", "truncated"]
    search_fields = ["origin"]
    date_hierarchy = "fetched_at"
    ordering = ["-fetched_at"]
    fields = [
        "origin", "availability", "status_code", "fetched_at", "fresh_until", "crawl_delay",
        "size", "truncated", "error", "claimed_until", "body",
    ]  # fmt: skip
    readonly_fields = fields

    def get_queryset(self, request):
        # The size from the database: a list of files up to 500 KiB each never loads them
        # (one row's page reads its body when it shows it).
        return super().get_queryset(request).annotate(body_size=Length("body")).defer("body")

    @admin.display(description="Size (characters)", ordering="body_size")
    def size(self, row: RobotsTxt) -> int:
        return row.body_size

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Audit)
class AuditAdmin(admin.ModelAdmin):
    inlines = [LinkCheckInline]
    list_display = [
        "id", "page_url", "status", "trigger", "attempts", "changes_count", "got_worse",
        "created_at", "finished_at",
    ]  # fmt: skip
    list_filter = ["status", "trigger", "got_worse", "created_at"]
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
        "attempt_started_at",
        "next_attempt_at",
        "published_at",
        "finished_at",
        "link_checks_deadline",
        "error",
        "submitter",
        "callback",
        "changes_table",
        "got_worse",
        "findings_table",
        "result_pretty",
    ]
    # The callback secret is write-only: never shown, not even to staff; the callback URL's
    # password neither (only its submitter sees the rest through the API).
    exclude = ["result", "changes", "callback_url", "callback_secret"]

    @admin.display(description="Callback URL")
    def callback(self, audit: Audit) -> str:
        return without_password(audit.callback_url) or "-"

    @admin.display(description="URL", ordering="page__url")
    def page_url(self, audit: Audit) -> str:
        return audit.page.url

    @admin.display(description="Changes")
    def changes_count(self, audit: Audit) -> str:
        return "-" if audit.changes is None else str(len(audit.changes))

    @admin.display(description="Changes since the previous succeeded audit")
    def changes_table(self, audit: Audit):
        if audit.changes is None:
            return "- (no previous succeeded audit, or not succeeded)"
        if not audit.changes:
            return "None: the page did not change."
        rows = format_html_join(
            "",
            "<tr><th>{}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    change["field"],
                    _shown(change["before"]),
                    _shown(change["after"]),
                    _shown(change.get("added", _NOT_SET)),
                    _shown(change.get("removed", _NOT_SET)),
                )
                for change in audit.changes
            ),
        )
        return format_html(
            "<table><tr><th>field</th><th>before</th><th>after</th><th>added</th>"
            "<th>removed</th></tr>{}</table>",
            rows,
        )

    @admin.display(description="Findings (failing first)")
    def findings_table(self, audit: Audit):
        findings = (audit.result or {}).get("findings")
        if not findings:
            return "-"
        order = {"fail": 0, "pass": 1, "not_applicable": 2}
        rows = format_html_join(
            "",
            '<tr><th>{}</th><td class="finding-{}">{}</td><td>{}</td><td>{}</td></tr>',
            (
                (
                    item["id"],
                    item["outcome"],
                    item["outcome"],
                    item["severity"],
                    _shown(item.get("details") or {}),
                )
                for item in sorted(findings, key=lambda item: order.get(item["outcome"], 3))
            ),
        )
        return format_html(
            "<table><tr><th>check</th><th>outcome</th><th>severity</th><th>details</th></tr>"
            "{}</table>",
            rows,
        )

    @admin.display(description="Result (long lists and strings abridged: the API has all)")
    def result_pretty(self, audit: Audit):
        if audit.result is None:
            return "-"
        # Abridged, so the page stays small whatever the audit holds: a browser chokes on
        # a megabyte of JSON long before the server does (DECISIONS.md, "Bounded audits").
        shown = json.dumps(_abridged(audit.result), indent=2, sort_keys=True)
        return format_html("<pre>{}</pre>", shown)

    def has_add_permission(self, request):
        return False


_NOT_SET = object()  # a value change has no added/removed
SHOWN_ITEMS = 20
SHOWN_CHARS = 300


def _abridged(value):
    """`value` with lists cut to SHOWN_ITEMS and strings to SHOWN_CHARS, each cut said."""
    if isinstance(value, dict):
        return {key: _abridged(item) for key, item in value.items()}
    if isinstance(value, list):
        shown = [_abridged(item) for item in value[:SHOWN_ITEMS]]
        if len(value) > SHOWN_ITEMS:
            shown.append(f"... {len(value) - SHOWN_ITEMS} more")
        return shown
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        return f"{value[:SHOWN_CHARS]}... ({len(value) - SHOWN_CHARS} more characters)"
    return value


def _shown(value) -> str:
    if value is _NOT_SET:
        return ""
    if isinstance(value, list):
        return ", ".join(map(str, _abridged(value))) if value else "(none)"
    return json.dumps(_abridged(value))
