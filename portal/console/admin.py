"""The audit log and capacity samples in Django admin: read-only, as both are records of what happened.

The audit log's screen is registered through the console's proxy of portal.audit's model, so its URLs and
permission stay the console's (see models.AuditEntry)."""

from django.contrib import admin

from .models import AuditEntry, CapacitySample


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "actor_name", "action", "target_repr", "short_reason")
    list_filter = ("action", "created_at")
    search_fields = ("actor_name", "action", "target_type", "target_id", "target_repr", "reason")
    date_hierarchy = "created_at"
    fields = (
        "created_at",
        "actor",
        "actor_name",
        "action",
        "target_type",
        "target_id",
        "target_repr",
        "reason",
        "details",
    )
    readonly_fields = fields
    # The actor column is the recorded name; joining users for 100 rows a page buys nothing.
    show_full_result_count = False

    @admin.display(description="Reason")
    def short_reason(self, entry):
        return entry.reason if len(entry.reason) <= 80 else entry.reason[:79] + "…"


@admin.register(CapacitySample)
class CapacitySampleAdmin(ReadOnlyAdmin):
    list_display = (
        "taken_at",
        "gpus_allocated",
        "gpus_total",
        "queue_length",
        "oldest_queued_wait_seconds",
        "running_instances",
    )
    date_hierarchy = "taken_at"
    readonly_fields = list_display
