"""Operator console for instances (list, filter, timeline, force stop) and the image catalogue (enable/disable).

Instances are read-only here: state changes go through services (a force stop charges up to the moment
and tears the instance down like any other stop), never through an edited field.
"""

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.utils.html import format_html_join

from portal.credits.models import hours

from . import services
from .models import Image, Instance, InstanceEvent


class InstanceEventInline(admin.TabularInline):
    """The instance's timeline, oldest first. Read-only."""

    model = InstanceEvent
    fields = ["created_at", "state", "step", "message"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ["created_at", "id"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Instance)
class InstanceAdmin(admin.ModelAdmin):
    list_display = [
        "short_id",
        "user",
        "size",
        "image",
        "state",
        "step",
        "host",
        "created_at",
        "ready_at",
        "charged",
    ]
    list_filter = ["state", "size", "image", "host", "created_at"]
    search_fields = ["id", "user__email", "host__name"]
    list_select_related = ["user", "image", "host"]
    date_hierarchy = "created_at"
    ordering = ["-created_at"]
    inlines = [InstanceEventInline]
    actions = ["force_stop"]
    # The token is a credential for the user's JupyterLab: operators do not need to see it.
    exclude = ["jupyter_token"]
    readonly_fields = [
        "id",
        "user",
        "size",
        "image",
        "host",
        "state",
        "step",
        "failure_reason",
        "stop_reason",
        "driver",
        "driver_state",
        "gpus",
        "created_at",
        "provisioning_at",
        "ready_at",
        "stopped_at",
        "metered_until",
        "charged",
        "state_changed_at",
    ]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        # The ledger refers to instances by id; an instance's record outlives it.
        return False

    @admin.display(description="Charged (GPU-h)", ordering="charged_gpu_seconds")
    def charged(self, obj):
        return hours(obj.charged_gpu_seconds)

    @admin.display(description="GPUs held")
    def gpus(self, obj):
        live = obj.allocations.filter(released_at__isnull=True).select_related("gpu__host")
        return (
            format_html_join(", ", "{}/renderD{}", ((a.gpu.host.name, a.gpu.render_minor) for a in live))
            or "none"
        )

    @admin.action(description="Force stop the selected instances", permissions=["change"])
    def force_stop(self, request, queryset):
        stopped, skipped = 0, 0
        for instance_id in queryset.values_list("id", flat=True):
            try:
                services.instance_request_stop(
                    instance_id=instance_id,
                    stop_reason="operator",
                    message=f"Stopped by an operator ({request.user.get_full_name() or request.user.email}).",
                )
                stopped += 1
            except ValidationError:
                skipped += 1
        self.message_user(request, f"Stopping {stopped} instance(s).", messages.SUCCESS)
        if skipped:
            self.message_user(request, f"{skipped} had already stopped or failed.", messages.WARNING)


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = [
        "key",
        "name",
        "sizes",
        "reference",
        "is_enabled",
        "is_default",
        "needs_gpu",
        "sort_order",
    ]
    list_filter = ["is_enabled", "needs_gpu"]
    list_editable = ["is_enabled"]
    search_fields = ["key", "name", "reference"]
    actions = ["enable", "disable"]

    @admin.action(description="Enable the selected images (users may launch them)", permissions=["change"])
    def enable(self, request, queryset):
        count = queryset.update(is_enabled=True)
        self.message_user(request, f"Enabled {count} image(s).", messages.SUCCESS)

    @admin.action(
        description="Disable the selected images (running instances keep running)", permissions=["change"]
    )
    def disable(self, request, queryset):
        count = queryset.update(is_enabled=False)
        self.message_user(request, f"Disabled {count} image(s).", messages.SUCCESS)
