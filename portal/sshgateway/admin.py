from django.contrib import admin
from django.template.defaultfilters import filesizeformat

from .models import SshSession


@admin.register(SshSession)
class SshSessionAdmin(admin.ModelAdmin):
    """Who connected to which instance over SSH, when, and how much went through. Read-only: only the
    gateway writes these."""

    list_display = ["started_at", "user", "instance_short_id", "key_name", "client_address", "duration",
                    "sent", "received", "is_open"]
    list_filter = ["started_at"]
    search_fields = ["user__email", "instance__id", "key_fingerprint", "client_address"]
    date_hierarchy = "started_at"
    list_select_related = ["user", "instance"]

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="instance")
    def instance_short_id(self, obj):
        return obj.instance.short_id

    @admin.display(description="duration")
    def duration(self, obj):
        end = obj.ended_at or obj.last_seen_at
        seconds = int((end - obj.started_at).total_seconds())
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"

    @admin.display(description="bytes in (client to instance)")
    def sent(self, obj):
        return filesizeformat(obj.bytes_from_client)

    @admin.display(description="bytes out (instance to client)")
    def received(self, obj):
        return filesizeformat(obj.bytes_to_client)

    @admin.display(description="open", boolean=True)
    def is_open(self, obj):
        return obj.ended_at is None
