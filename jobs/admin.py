from __future__ import annotations

from datetime import UTC, datetime

from django.contrib import admin, messages
from django.utils import timezone
from django.utils.html import format_html

from jobs import breakers, deadletters
from jobs.models import CircuitBreaker, DeadLetter


class ReplayStateFilter(admin.SimpleListFilter):
    title = "replay state"
    parameter_name = "replayed"

    def lookups(self, request, model_admin):
        return [("no", "not replayed"), ("yes", "replayed")]

    def queryset(self, request, queryset):
        if self.value() == "no":
            return queryset.filter(replayed_at__isnull=True)
        if self.value() == "yes":
            return queryset.filter(replayed_at__isnull=False)
        return queryset


class TaskNameFilter(admin.SimpleListFilter):
    title = "task"
    parameter_name = "task_name"

    def lookups(self, request, model_admin):
        names = DeadLetter.objects.order_by().values_list("task_name", flat=True).distinct()
        return [(name, name or "(unknown)") for name in sorted(names)]

    def queryset(self, request, queryset):
        if self.value() is not None:
            return queryset.filter(task_name=self.value())
        return queryset


@admin.register(DeadLetter)
class DeadLetterAdmin(admin.ModelAdmin):
    list_display = [
        "id", "task_name", "reason", "short_exception", "attempts",
        "first_failed_at", "last_failed_at", "replay_state",
    ]  # fmt: skip
    list_filter = [TaskNameFilter, "reason", ReplayStateFilter, "last_failed_at"]
    search_fields = ["=task_id", "=replay_task_id", "exception"]
    date_hierarchy = "last_failed_at"
    actions = ["replay"]
    readonly_fields = [
        "task_name", "task_id", "queue", "args", "kwargs", "reason", "exception",
        "traceback_pre", "raw_message_pre", "attempts", "first_failed_at", "last_failed_at",
        "replayed_at", "replayed_by", "replay_task_id",
    ]  # fmt: skip
    exclude = ["traceback", "raw_message"]

    @admin.display(description="Exception")
    def short_exception(self, dead_letter: DeadLetter) -> str:
        text = dead_letter.exception
        return text if len(text) <= 120 else text[:119] + "…"

    @admin.display(description="Replayed", ordering="replayed_at")
    def replay_state(self, dead_letter: DeadLetter) -> str:
        if dead_letter.replayed_at is None:
            return "-"
        return f"{dead_letter.replayed_at:%Y-%m-%d %H:%M} by {dead_letter.replayed_by}"

    @admin.display(description="Traceback")
    def traceback_pre(self, dead_letter: DeadLetter):
        return format_html("<pre>{}</pre>", dead_letter.traceback or "-")

    @admin.display(description="Raw message")
    def raw_message_pre(self, dead_letter: DeadLetter):
        return format_html("<pre>{}</pre>", dead_letter.raw_message or "-")

    def has_add_permission(self, request):
        # A dead letter is what a worker set aside; one made by hand would replay nothing real.
        return False

    @admin.action(description="Replay selected dead letters (enqueue their tasks again)")
    def replay(self, request, queryset):
        report = deadletters.replay(queryset, by=request.user.get_username())
        if report.replayed:
            self.message_user(request, f"Replayed {len(report.replayed)} dead letter(s).")
        for dead_letter, why in report.skipped:
            self.message_user(
                request, f"Skipped dead letter {dead_letter.id}: {why}.", level=messages.WARNING
            )


@admin.register(CircuitBreaker)
class CircuitBreakerAdmin(admin.ModelAdmin):
    list_display = [
        "task_name", "host", "live_state", "last_transition", "changed_at", "times_opened",
    ]  # fmt: skip
    list_filter = ["state", "task_name"]
    search_fields = ["host", "task_name"]
    actions = ["close_breakers"]
    readonly_fields = [
        "task_name", "host", "live_state", "state", "last_transition", "changed_at",
        "open_until", "times_opened",
    ]  # fmt: skip

    @admin.display(description="State now")
    def live_state(self, breaker: CircuitBreaker) -> str:
        # The row is the last recorded transition; Redis has the state now.
        live = breakers.Breaker(breaker.task_name, breaker.host).state()
        if live["open_until"]:
            until = datetime.fromtimestamp(live["open_until"], tz=UTC)
            if until > timezone.now():
                return f"open until {until:%H:%M:%S} UTC"
            return "open, due to half-open on its next call"
        return live["state"].replace("_", "-")

    @admin.action(description="Close selected breakers (let every call through again)")
    def close_breakers(self, request, queryset):
        for breaker in queryset:
            breakers.Breaker(breaker.task_name, breaker.host).close(by=request.user.get_username())
        self.message_user(request, f"Closed {queryset.count()} breaker(s).")

    def has_add_permission(self, request):
        return False
