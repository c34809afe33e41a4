"""Operator console for instances (list, filter, timeline, container log, force stop), the image
catalogue (enable/disable) and bookings (list, cancel with a reason).

Instances are read-only here: state changes go through services (a force stop charges up to the moment,
tells the owner why, is audited, and tears the instance down like any other stop), never through an
edited field.
"""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from portal.credits.models import hours

from . import logs, reservations, services
from .models import Image, Instance, InstanceEvent, Reservation

# Lines of the container's output shown on the instance's page.
LOG_TAIL_LINES = 100


class InstanceEventInline(admin.TabularInline):
    """The instance's timeline, oldest first. Read-only."""

    model = InstanceEvent
    fields = ["created_at", "state", "step", "message"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ["created_at", "id"]
    verbose_name = "state change"
    verbose_name_plural = "Timeline"

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class OwnerFilter(admin.SimpleListFilter):
    """Instances of one owner, by email address (or part of it): a text box, since a list of every user
    would not fit the sidebar."""

    title = "owner"
    parameter_name = "owner"
    template = "admin/instances/instance/owner_filter.html"

    def lookups(self, request, model_admin):
        # The text box needs no choices, but a filter without any is not drawn.
        return [(self.value() or "", self.value() or "")]

    def choices(self, changelist):
        # One "choice" carrying what the template's form needs: the value, and the other filters to keep.
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": "All",
            "value": self.value() or "",
            "kept": [
                (name, value) for name, value in changelist.params.items() if name != self.parameter_name
            ],
        }

    def queryset(self, request, queryset):
        value = (self.value() or "").strip()
        if not value:
            return queryset
        local, at, domain = value.partition("@")
        if local and at and domain:
            # A whole address: exactly that owner, not also everyone whose address merely contains it.
            return queryset.filter(user__email__iexact=value)
        return queryset.filter(user__email__icontains=value)


class ForceStopForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        max_length=services.FORCE_STOP_REASON_MAX,
        help_text="The owner reads this on their instance's page and in the email telling them. "
        "It is also recorded in the audit log under your name.",
        error_messages={"required": "Give the reason: the owner is told it."},
    )


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
    list_filter = ["state", OwnerFilter, "host", "image", "size", "created_at"]
    search_fields = ["id", "user__email", "host__name"]
    list_select_related = ["user", "image", "host"]
    date_hierarchy = "created_at"
    ordering = ["-created_at"]
    inlines = [InstanceEventInline]
    actions = ["force_stop"]
    change_form_template = "admin/instances/instance/change_form.html"
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
        "stop_note",
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
        "container_log",
    ]
    fieldsets = [
        (None, {"fields": ["id", "user", "size", "image", "host", "gpus", "state", "step"]}),
        ("Why it ended", {"fields": ["failure_reason", "stop_reason", "stop_note"]}),
        (
            "Times and charges",
            {
                "fields": [
                    "created_at",
                    "provisioning_at",
                    "ready_at",
                    "stopped_at",
                    "state_changed_at",
                    "metered_until",
                    "charged",
                ]
            },
        ),
        ("Driver", {"fields": ["driver", "driver_state"], "classes": ["collapse"]}),
        (f"Container log (last {LOG_TAIL_LINES} lines)", {"fields": ["container_log"]}),
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

    @admin.display(description="Output")
    def container_log(self, obj):
        """The container's last lines, read from its host now by a worker (portal/instances/logs.py).
        Says why when there is nothing to show."""
        found, note = logs.log_lines(obj, lines=LOG_TAIL_LINES)
        if note:
            return note
        return format_html('<pre class="container-log" data-testid="container-log">{}</pre>', "\n".join(found))

    # --- Force stop ----------------------------------------------------------------------------------

    def get_urls(self):
        return [
            path(
                "<uuid:instance_id>/force-stop/",
                self.admin_site.admin_view(self.force_stop_view),
                name="instances_instance_force_stop",
            )
        ] + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = extra_context or {}
        instance = self.get_object(request, object_id)
        live = instance is not None and instance.state not in (Instance.State.STOPPED, Instance.State.FAILED)
        if live and self.has_force_stop_permission(request):
            extra_context["force_stop_url"] = reverse(
                "admin:instances_instance_force_stop", args=[instance.pk]
            )
        return super().change_view(request, object_id, form_url, extra_context)

    def force_stop_view(self, request, instance_id):
        """Force-stop one instance from its page: the reason page, then the stop."""
        if not self.has_force_stop_permission(request):
            raise PermissionDenied
        instance = get_object_or_404(Instance, pk=instance_id)
        response = self._force_stop(request, [instance], from_action=False)
        return response or redirect("admin:instances_instance_change", instance.pk)

    def has_force_stop_permission(self, request):
        # Its own permission (console.OperatorAction), so operators need no change permission here.
        return request.user.has_perm("console.force_stop_instance")

    @admin.action(
        description="Force stop the selected instances (asks for the reason)", permissions=["force_stop"]
    )
    def force_stop(self, request, queryset):
        return self._force_stop(request, list(queryset.select_related("user", "image", "host")))

    def _force_stop(self, request, instances, *, from_action: bool = True):
        """The reason page until a reason is posted; then each live instance is stopped, its owner told.
        Returns the page, or None once done."""
        confirmed = request.method == "POST" and "_confirm" in request.POST
        form = ForceStopForm(request.POST if confirmed else None)
        stoppable = [i for i in instances if i.state not in (Instance.State.STOPPED, Instance.State.FAILED)]
        if confirmed and form.is_valid():
            stopped, skipped = 0, []
            for instance in stoppable:
                try:
                    services.instance_force_stop(
                        instance_id=instance.pk, actor=request.user, reason=form.cleaned_data["reason"]
                    )
                    stopped += 1
                except ValidationError as error:
                    skipped.append(f"{instance.short_id}: {' '.join(error.messages)}")
            if stopped:
                self.message_user(
                    request,
                    f"Stopping {stopped} instance(s); each owner is told your reason.",
                    messages.SUCCESS,
                )
            ended = len(instances) - len(stoppable)
            if ended:
                self.message_user(request, f"{ended} had already stopped or failed.", messages.WARNING)
            for line in skipped:
                self.message_user(request, line, messages.WARNING)
            return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Force stop",
            "form": form,
            "stoppable": stoppable,
            "ended": [i for i in instances if i not in stoppable],
            "selected": instances,
            "from_action": from_action,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "cancel_url": (
                reverse("admin:instances_instance_changelist")
                if from_action
                else reverse("admin:instances_instance_change", args=[instances[0].pk])
            ),
        }
        return TemplateResponse(request, "admin/instances/instance/force_stop.html", context)


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


class CancelBookingForm(forms.Form):
    reason = forms.CharField(
        max_length=ForceStopForm.base_fields["reason"].max_length,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="The person who booked reads this in an email and on their dashboard.",
    )


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    """Bookings, read-only: an operator cancels them with a reason (the action), which tells the booker and
    is audited; the rows change only through portal/instances/reservations.py."""

    list_display = ["short_id", "user", "project", "host", "gpus", "starts_at", "ends_at", "state", "held"]
    list_filter = ["state", "host"]
    search_fields = ["user__email", "project__slug", "id"]
    date_hierarchy = "starts_at"
    actions = ["cancel_bookings"]
    readonly_fields = [f.name for f in Reservation._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        # Operators read bookings through the permission of the action they start here, so the Operators
        # group needs no new permission (and no migration to grant it).
        return self.has_cancel_bookings_permission(request) or super().has_view_permission(request, obj)

    @admin.display(description="Held (GPU-hours)")
    def held(self, obj):
        return hours(obj.hold_gpu_seconds) if obj.state == Reservation.State.BOOKED else "-"

    def has_cancel_bookings_permission(self, request):
        # The operators' action permission, as for a force stop: no change permission is needed here.
        return request.user.has_perm("console.force_stop_instance")

    @admin.action(
        description="Cancel the selected bookings (asks for the reason)", permissions=["cancel_bookings"]
    )
    def cancel_bookings(self, request, queryset):
        selected = list(queryset.select_related("user", "host"))
        standing = [r for r in selected if r.state == Reservation.State.BOOKED]
        confirmed = "_confirm" in request.POST
        form = CancelBookingForm(request.POST if confirmed else None)
        if confirmed and form.is_valid():
            for booking in standing:
                try:
                    reservations.reservation_operator_cancel(
                        reservation_id=booking.pk, actor=request.user, reason=form.cleaned_data["reason"]
                    )
                except ValidationError as error:
                    self.message_user(
                        request, f"{booking.short_id}: {' '.join(error.messages)}", messages.WARNING
                    )
            self.message_user(
                request,
                f"Cancelled {len(standing)} booking(s); each booker is told your reason.",
                messages.SUCCESS,
            )
            return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Cancel bookings",
            "form": form,
            "standing": standing,
            "selected": selected,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/instances/reservation/cancel.html", context)
