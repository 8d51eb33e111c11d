from django.contrib import admin, messages

from audits.secrets import without_password
from webhooks import tasks
from webhooks.models import Delivery


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "event",
        "destination",
        "audit_link",
        "status",
        "attempts",
        "last_status_code",
        "next_attempt_at",
        "delivered_at",
        "created_at",
    ]
    list_filter = ["event", "status", "created_at"]
    search_fields = ["url", "=id", "=audit__id", "=task_id"]
    list_select_related = ["audit"]
    raw_id_fields = ["audit"]
    date_hierarchy = "created_at"
    readonly_fields = [
        "id",
        "webhook_id",
        "audit",
        "event",
        "destination",
        "status",
        "attempts",
        "task_id",
        "last_status_code",
        "last_error",
        "next_attempt_at",
        "attempt_started_at",
        "published_at",
        "delivered_at",
        "created_at",
        "updated_at",
    ]
    # The URL's password is the submitter's: staff see where a delivery goes, not that.
    exclude = ["url"]
    actions = ["redeliver"]

    @admin.display(description="URL", ordering="url")
    def destination(self, delivery: Delivery) -> str:
        return without_password(delivery.url)

    @admin.display(description="Audit", ordering="audit__created_at")
    def audit_link(self, delivery: Delivery) -> str:
        return str(delivery.audit_id)

    @admin.display(description="webhook-id")
    def webhook_id(self, delivery: Delivery) -> str:
        return delivery.webhook_id

    @admin.action(description="Redeliver the selected failed deliveries")
    def redeliver(self, request, queryset):
        replayed = sum(tasks.redeliver(d) for d in queryset.filter(status=Delivery.Status.FAILED))
        skipped = queryset.count() - replayed
        self.message_user(request, f"Queued {replayed} delivery(ies) again.", messages.SUCCESS)
        if skipped:
            self.message_user(request, f"Skipped {skipped} that had not failed.", messages.WARNING)

    def has_add_permission(self, request):
        return False
