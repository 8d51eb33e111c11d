from django.contrib import admin, messages
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils.html import format_html

from audits.models import Audit
from reaudit import services
from reaudit.models import FanOut, Placement, SliceRun
from reaudit.tasks import NIGHT_TASKS


def _count(rows):
    """The number of `rows` belonging to the outer night, as a subquery."""
    counted = rows.filter(fan_out=OuterRef("pk")).order_by().values("fan_out")
    return Coalesce(Subquery(counted.annotate(n=Count("pk")).values("n")), 0)


class SliceRunInline(admin.TabularInline):
    model = SliceRun
    extra = 0
    can_delete = False
    fields = ["index", "planned_at", "starts_at", "late", "published_at", "placements"]
    readonly_fields = fields

    @admin.display(description="Late (s)")
    def late(self, run: SliceRun) -> str:
        return f"{run.late_seconds:.1f}"

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(FanOut)
class FanOutAdmin(admin.ModelAdmin):
    list_display = [
        "day",
        "window_start",
        "window_seconds",
        "pages",
        "scheduled",
        "slices_published",
        "state",
    ]
    date_hierarchy = "day"
    readonly_fields = [
        "day",
        "window_start",
        "window_seconds",
        "slice_seconds",
        "spacing_seconds",
        "pages",
        "slice_sizes",
        "created_at",
        "finished_at",
        "superseded_at",
        "placements_link",
    ]
    inlines = [SliceRunInline]
    actions = ["resume_selected"]

    def get_queryset(self, request):
        # Subqueries, not joins: a night has a row per page.
        return (
            super()
            .get_queryset(request)
            .annotate(
                unfired=_count(Placement.objects.filter(fired_at__isnull=True)),
                published=_count(SliceRun.objects.filter(published_at__isnull=False)),
            )
        )

    @admin.display(description="Not fired yet", ordering="unfired")
    def scheduled(self, night: FanOut) -> int:
        return night.unfired

    @admin.display(description="Slices published")
    def slices_published(self, night: FanOut) -> str:
        return f"{night.published} / {night.slice_count}"

    @admin.display(description="State")
    def state(self, night: FanOut) -> str:
        if night.superseded_at:
            return "superseded"
        return "finished" if night.finished_at else "in progress"

    @admin.display(description="Placements")
    def placements_link(self, night: FanOut):
        url = reverse("admin:reaudit_placement_changelist") + f"?fan_out__id__exact={night.id}"
        return format_html('<a href="{}">{} placements</a>', url, night.pages)

    @admin.action(description="Resume: republish the next slice of the selected nights")
    def resume_selected(self, request, queryset):
        resumed = [
            night.day
            for night in queryset
            if services.resume(night, night_tasks=NIGHT_TASKS) is not None
        ]
        self.message_user(
            request,
            f"Resumed {len(resumed)} night(s): {', '.join(map(str, resumed)) or 'none open'}.",
            messages.SUCCESS,
        )

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class FiredFilter(admin.SimpleListFilter):
    title = "fired"
    parameter_name = "fired"

    def lookups(self, request, model_admin):
        return [("yes", "Fired"), ("no", "Still scheduled")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(fired_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(fired_at__isnull=True)
        return queryset


@admin.register(Placement)
class PlacementAdmin(admin.ModelAdmin):
    list_display = ["page", "night", "offset_seconds", "slice_index", "fired_at"]
    list_filter = [FiredFilter, "fan_out__day"]
    list_select_related = ["page", "fan_out"]
    search_fields = ["page__url", "=page__domain"]
    raw_id_fields = ["page", "fan_out"]
    readonly_fields = ["fan_out", "page", "offset_seconds", "slice_index", "fired_at", "audit"]
    show_full_result_count = False

    @admin.display(description="Night", ordering="fan_out__day")
    def night(self, placement: Placement):
        return placement.fan_out.day

    @admin.display(description="Audit")
    def audit(self, placement: Placement):
        key = services.placement_key(placement.page_id, placement.fan_out.day)
        audit = Audit.objects.filter(idempotency_key=key).only("id").first()
        if audit is None:
            return "-"
        url = reverse("admin:audits_audit_change", args=[audit.id])
        return format_html('<a href="{}">{}</a>', url, key)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
