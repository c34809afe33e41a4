"""Read-only console view of notifications: operators can see what a user was told and whether the
email went out, but never edit or delete that record (the user's dashboard shows the same rows)."""

from django.contrib import admin

from .models import EmailOptOut, Notification


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "user", "kind", "event_key", "email_status", "email_attempts", "read_at"]
    list_filter = ["kind", "email_enabled", ("emailed_at", admin.EmptyFieldListFilter), "created_at"]
    search_fields = ["user__email", "event_key"]
    list_select_related = ["user"]
    date_hierarchy = "created_at"
    fields = [
        "user",
        "kind",
        "event_key",
        "context",
        "created_at",
        "read_at",
        "email_enabled",
        "emailed_at",
        "email_attempts",
        "email_error",
    ]

    @admin.display(description="Email")
    def email_status(self, notification):
        if not notification.email_enabled:
            return "off"
        if notification.emailed_at:
            return "sent"
        return "failing" if notification.email_error else "pending"


@admin.register(EmailOptOut)
class EmailOptOutAdmin(ReadOnlyAdmin):
    list_display = ["user", "kind", "created_at"]
    list_filter = ["kind"]
    search_fields = ["user__email"]
    list_select_related = ["user"]
