"""Operator console for users: balance, identities (email, GitHub) and verification at a glance, and one
page per user with their ledger, instances and applications, where operators suspend and unsuspend them
and open more launch sizes to them. Also the launch policy's page (see the end of this module)."""

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.contrib.auth.forms import AdminUserCreationForm, UserChangeForm
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Exists, OuterRef
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from social_django.models import UserSocialAuth

from portal.credits.admin import adjust_url, ledger_table
from portal.credits.models import BonusApplication, hours
from portal.instances import entitlements
from portal.instances.models import Instance, LaunchPolicy
from portal.instances.selectors import stop_reason_text
from portal.instances.sizes import SIZES

from . import services
from .models import SshKey, User, share_text

# How many of a user's instances their page lists; the rest are one link away.
INSTANCE_PREVIEW_ROWS = 50
SIZE_CHOICES = [(size.key, size.name) for size in SIZES.values()]


class UserCreationForm(AdminUserCreationForm):
    """The admin's add form, with the email address as the login name (there is no username)."""

    class Meta:
        model = User
        fields = ("email",)
        field_classes: dict = {}

    def clean_email(self):
        # Stored lower-case (User.save), so compare lower-case to give a form error, not a crash.
        email = self.cleaned_data["email"].strip().lower()
        if User.objects.filter(email__iexact=email).exists():
            raise self.instance.unique_error_message(User, ["email"])
        return email


class UserEditForm(UserChangeForm):
    class Meta:
        model = User
        fields = "__all__"
        field_classes: dict = {}


class VerifiedFilter(admin.SimpleListFilter):
    title = "email verified"
    parameter_name = "verified"

    def lookups(self, request, model_admin):
        return [("yes", "Yes"), ("no", "No")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(email_verified_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(email_verified_at__isnull=True)
        return queryset


class SuspendedFilter(admin.SimpleListFilter):
    title = "suspended"
    parameter_name = "suspended"

    def lookups(self, request, model_admin):
        return [("yes", "Suspended"), ("no", "Not suspended")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(suspended_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(suspended_at__isnull=True)
        return queryset


class GithubFilter(admin.SimpleListFilter):
    title = "GitHub login"
    parameter_name = "github"

    def lookups(self, request, model_admin):
        return [("yes", "Linked"), ("no", "Not linked")]

    def queryset(self, request, queryset):
        linked = Exists(UserSocialAuth.objects.filter(user=OuterRef("pk"), provider="github"))
        if self.value() == "yes":
            return queryset.filter(linked)
        if self.value() == "no":
            return queryset.filter(~linked)
        return queryset


class BonusApplicationInline(admin.TabularInline):
    """The user's applications, read-only; each links to its review page."""

    model = BonusApplication
    fk_name = "user"
    extra = 0
    can_delete = False
    fields = ("review", "status", "evidence", "granted", "decided_by_name", "decision_reason", "created_at")
    readonly_fields = fields
    ordering = ("-created_at",)

    @admin.display(description="Program")
    def review(self, application):
        url = reverse("admin:credits_bonusapplication_change", args=[application.pk])
        return format_html('<a href="{}">{}</a>', url, application.program.name)

    @admin.display(description="Granted (GPU-hours)")
    def granted(self, application):
        return application.granted_hours if application.status == BonusApplication.Status.APPROVED else "–"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("program")

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class SshKeyInline(admin.TabularInline):
    model = SshKey
    extra = 0
    fields = ("name", "key_type", "fingerprint", "created_at")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    form = UserEditForm
    add_form = UserCreationForm
    list_display = (
        "email",
        "name",
        "balance",
        "verified",
        "github_login",
        "suspended",
        "date_joined",
        "is_active",
    )
    list_filter = (
        VerifiedFilter,
        GithubFilter,
        SuspendedFilter,
        "project_bot",
        "is_active",
        "is_staff",
        "is_superuser",
    )
    search_fields = ("email", "first_name", "last_name")
    ordering = ("-date_joined",)
    list_select_related = ("credit_account",)
    readonly_fields = (
        "balance",
        "bonus_collected",
        "github_login",
        "adjust",
        "ledger",
        "suspension",
        "launch_access",
        "queue_share_display",
        "instances_table",
        "last_login",
        "date_joined",
    )
    # Suspension and extra launch sizes are not form fields: they change only through the audited
    # actions linked from "Account status" (suspend_view, unsuspend_view, launch_sizes_view).
    fieldsets = (
        (None, {"fields": ("email", "password")}),
        ("Account status", {"fields": ("suspension", "launch_access")}),
        ("Personal info", {"fields": ("first_name", "last_name")}),
        ("Identity", {"fields": ("email_verified_at", "pending_email", "github_login", "deleted_at")}),
        ("Credits", {"fields": ("balance", "bonus_collected", "adjust", "ledger")}),
        ("Instances", {"fields": ("instances_table",)}),
        ("Queue", {"fields": ("queue_share_display",)}),
        ("Permissions", {"fields": ("is_active", "is_staff", "is_superuser", "groups", "user_permissions")}),
        ("Important dates", {"fields": ("last_login", "date_joined")}),
    )
    add_fieldsets = (
        (None, {"classes": ("wide",), "fields": ("email", "usable_password", "password1", "password2")}),
    )
    inlines = [BonusApplicationInline, SshKeyInline]

    # --- Only a superuser hands out power ---------------------------------------------------------
    # accounts.change_user must not be a way to become superuser: these fields are read-only (the
    # password hidden) for everyone else, and so is every account that has staff or superuser status.

    def get_fieldsets(self, request, obj=None):
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or request.user.is_superuser:
            return fieldsets
        # The password field is a link to the password form; nobody else gets that form either.
        return [
            (name, {**options, "fields": tuple(f for f in options["fields"] if f != "password")})
            for name, options in fieldsets
        ]

    def get_readonly_fields(self, request, obj=None):
        readonly = super().get_readonly_fields(request, obj)
        if request.user.is_superuser:
            return readonly
        return (*readonly, "is_staff", "is_superuser", "groups", "user_permissions")

    def has_change_permission(self, request, obj=None):
        # Changing a staff account's address and then asking for a reset link would take it over.
        if obj is not None and (obj.is_staff or obj.is_superuser) and not request.user.is_superuser:
            return False
        return super().has_change_permission(request, obj)

    def user_change_password(self, request, id, form_url=""):
        if not request.user.is_superuser:
            raise PermissionDenied("Only a superuser sets another person's password.")
        return super().user_change_password(request, id, form_url)

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("social_auth")

    def get_inlines(self, request, obj):
        return self.inlines if obj is not None else []

    @admin.display(description="Name", ordering="first_name")
    def name(self, user):
        return user.get_full_name()

    @admin.display(description="Balance (GPU-hours)", ordering="credit_account__balance_gpu_seconds")
    def balance(self, user):
        account = getattr(user, "credit_account", None)
        return hours(account.balance_gpu_seconds if account else 0)

    @admin.display(description="Bonus collected (GPU-hours)")
    def bonus_collected(self, user):
        account = getattr(user, "credit_account", None)
        return hours(account.bonus_gpu_seconds if account else 0)

    @admin.display(description="Verified", boolean=True, ordering="email_verified_at")
    def verified(self, user):
        return user.email_verified

    @admin.display(description="GitHub login")
    def github_login(self, user):
        # Read from the prefetched rows, so the list costs one query for all users.
        for social in user.social_auth.all():
            if social.provider == "github":
                return (social.extra_data or {}).get("login") or f"id {social.uid}"
        return "–"

    @admin.display(description="Grant or correct")
    def adjust(self, user):
        return format_html('<a class="button" href="{}">Grant or correct credits</a>', adjust_url(user))

    @admin.display(description="Ledger (latest first)")
    def ledger(self, user):
        return ledger_table(user)

    @admin.display(description="Suspended")
    def suspended(self, user):
        return user.suspended_at.strftime("since %Y-%m-%d") if user.is_suspended else "–"

    @admin.display(description="Suspension")
    def suspension(self, user):
        if user.is_suspended:
            return format_html(
                '<p data-testid="suspension">Suspended since {} by {}. Reason: {}</p>'
                '<a class="button" href="{}">Unsuspend</a>',
                user.suspended_at.strftime("%Y-%m-%d %H:%M UTC"),
                user.suspended_by_name or "an operator",
                user.suspended_reason,
                reverse("admin:accounts_user_unsuspend", args=[user.pk]),
            )
        return format_html(
            '<p data-testid="suspension">Not suspended.</p><a class="button" href="{}">Suspend</a>',
            reverse("admin:accounts_user_suspend", args=[user.pk]),
        )

    @admin.display(description="Launch access")
    def launch_access(self, user):
        access = entitlements.launch_access(user)
        sizes = ", ".join(SIZES[key].name for key in access["sizes"]) or "no size"
        extra = ", ".join(SIZES[key].name for key in access["extra_sizes"] if key in SIZES)
        return format_html(
            '<p data-testid="launch-access">Tier: {}. May launch: {}{}.{}</p>'
            '<a class="button" href="{}">Open or close sizes for this user</a> '
            '<a href="{}">Launch policy for everyone</a>',
            access["tier_label"],
            sizes,
            f" (opened by an operator: {extra})" if extra else "",
            " Suspended: launches nothing." if access["suspended"] else "",
            reverse("admin:accounts_user_launch_sizes", args=[user.pk]),
            reverse("admin:instances_launchpolicy_changelist"),
        )

    @admin.display(description="Share of the queue")
    def queue_share_display(self, user):
        return format_html(
            '<p data-testid="queue-share">Share {}: their GPU use in the fair-share window is divided by it '
            "when the queue is ordered (1 is everyone's default).</p>"
            '<a class="button" href="{}">Change share</a>',
            share_text(user.queue_share),
            reverse("admin:accounts_user_queue_share", args=[user.pk]),
        )

    @admin.display(description="Instances (latest first)")
    def instances_table(self, user):
        return instances_table(user)

    # --- Operator actions on one user, each with a reason for the audit log ---------------------------

    def get_urls(self):
        def view(function, suffix):
            return path(
                f"<int:user_id>/{suffix}/",
                self.admin_site.admin_view(function),
                name=f"accounts_user_{suffix.replace('-', '_')}",
            )

        # Before the default URLs, whose "<path:object_id>/" would swallow these.
        return [
            view(self.suspend_view, "suspend"),
            view(self.unsuspend_view, "unsuspend"),
            view(self.launch_sizes_view, "launch-sizes"),
            view(self.queue_share_view, "queue-share"),
        ] + super().get_urls()

    def _target(self, request, user_id, *, permission) -> User:
        # Each action has its own permission (console.OperatorAction), not accounts.change_user.
        if not request.user.has_perm(permission):
            raise PermissionDenied
        return get_object_or_404(User, pk=user_id)

    def _action_page(self, request, target, *, form, title, intro, submit):
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"{title}: {target.email}",
            "action_title": title,
            "intro": intro,
            "form": form,
            "target": target,
            "submit_label": submit,
            "user_url": reverse("admin:accounts_user_change", args=[target.pk]),
        }
        return TemplateResponse(request, "admin/accounts/user/operator_action.html", context)

    def _run(self, request, target, form, action) -> bool:
        """Run `action` (a service call) for a valid form; report errors on the form. Returns success."""
        if not form.is_valid():
            return False
        try:
            action(form.cleaned_data)
        except (ValidationError, PermissionDenied) as error:
            form.add_error(None, error.messages if isinstance(error, ValidationError) else str(error))
            return False
        return True

    def suspend_view(self, request, user_id):
        """Suspend the user with a reason they read: instances stop, launches and applications are refused."""
        target = self._target(request, user_id, permission="console.suspend_user")
        form = ReasonForm(
            request.POST or None, reason_help="The user reads this in an email and on the launch page."
        )
        if request.method == "POST" and self._run(
            request,
            target,
            form,
            lambda data: services.user_suspend(user=target, actor=request.user, reason=data["reason"]),
        ):
            self.message_user(
                request,
                f"Suspended {target.email}. Their live instances are stopping and they were emailed.",
                messages.SUCCESS,
            )
            return redirect("admin:accounts_user_change", target.pk)
        live = Instance.objects.filter(user=target, state__in=Instance.LIVE_STATES).count()
        intro = (
            f"{target.email} already is suspended; submitting changes nothing."
            if target.is_suspended
            else f"Their {live} live instance(s) will be stopped now (billing ends, workspaces are kept). "
            "They can still log in and see their data and credits, but cannot launch or apply for bonus "
            "hours until the suspension is lifted. They are emailed the reason."
        )
        return self._action_page(request, target, form=form, title="Suspend", intro=intro, submit="Suspend")

    def unsuspend_view(self, request, user_id):
        target = self._target(request, user_id, permission="console.unsuspend_user")
        form = ReasonForm(request.POST or None, reason_help="Kept in the audit log.")
        if request.method == "POST" and self._run(
            request,
            target,
            form,
            lambda data: services.user_unsuspend(user=target, actor=request.user, reason=data["reason"]),
        ):
            self.message_user(
                request, f"Lifted the suspension of {target.email}: they may launch again.", messages.SUCCESS
            )
            return redirect("admin:accounts_user_change", target.pk)
        intro = (
            f"Suspended since {target.suspended_at:%Y-%m-%d %H:%M} UTC by {target.suspended_by_name}: "
            f"{target.suspended_reason}. Lifting it lets them launch and apply again; instances stopped by "
            "the suspension stay stopped."
            if target.is_suspended
            else f"{target.email} is not suspended; submitting changes nothing."
        )
        return self._action_page(
            request, target, form=form, title="Unsuspend", intro=intro, submit="Unsuspend"
        )

    def launch_sizes_view(self, request, user_id):
        """Open sizes to one user beyond their tier (e.g. 8x for a partner without a bonus application)."""
        target = self._target(request, user_id, permission="console.open_launch_sizes")
        form = LaunchSizesForm(
            request.POST or None,
            initial={"sizes": target.extra_sizes},
            reason_help="Kept in the audit log.",
        )
        if request.method == "POST" and self._run(
            request,
            target,
            form,
            lambda data: services.user_launch_sizes_set(
                user=target, actor=request.user, sizes=data["sizes"], reason=data["reason"]
            ),
        ):
            target.refresh_from_db()
            opened = ", ".join(SIZES[key].name for key in target.extra_sizes) or "none"
            self.message_user(request, f"Sizes opened to {target.email}: {opened}.", messages.SUCCESS)
            return redirect("admin:accounts_user_change", target.pk)
        access = entitlements.launch_access(target)
        by_tier = ", ".join(SIZES[key].name for key in access["tier_sizes"]) or "no size"
        intro = (
            f"Their tier is {access['tier_label'].lower()}; it opens {by_tier}. "
            "Tick the sizes to open to this user on top of that."
        )
        return self._action_page(
            request, target, form=form, title="Open or close sizes", intro=intro, submit="Save sizes"
        )

    def queue_share_view(self, request, user_id):
        """Set one user's share of the queue. The operator action that opens sizes (who gets what of the
        fleet) holds it too, so it needs no permission of its own."""
        target = self._target(request, user_id, permission="console.open_launch_sizes")
        form = QueueShareForm(
            request.POST or None,
            initial={"share": share_text(target.queue_share)},
            reason_help="Kept in the audit log.",
        )
        if request.method == "POST" and self._run(
            request,
            target,
            form,
            lambda data: services.user_queue_share_set(
                user=target, actor=request.user, share=data["share"], reason=data["reason"]
            ),
        ):
            target.refresh_from_db()
            self.message_user(
                request, f"{target.email}'s share is now {share_text(target.queue_share)}.", messages.SUCCESS
            )
            return redirect("admin:accounts_user_change", target.pk)
        intro = (
            f"Their share is {share_text(target.queue_share)}. The queue orders waiting launches by each person's GPU use "
            "in the fair-share window divided by their share: 2 queues them as if they had used half as much, "
            "0.5 as if twice as much."
        )
        return self._action_page(
            request, target, form=form, title="Change share", intro=intro, submit="Save share"
        )


class ReasonForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        max_length=1000,
        error_messages={"required": "Give a reason; it is kept in the audit log."},
    )

    def __init__(self, *args, reason_help="", **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["reason"].help_text = reason_help


class LaunchSizesForm(ReasonForm):
    sizes = forms.MultipleChoiceField(
        choices=SIZE_CHOICES,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Extra sizes",
        help_text="Leave all unticked to close every extra size again.",
    )
    field_order = ["sizes", "reason"]


class QueueShareForm(ReasonForm):
    # Text, not a number field: the service says what is wrong with a bad share in words.
    share = forms.CharField(label="Share", max_length=20, help_text="From 0.01 to 9999.99; 1 is the default.")
    field_order = ("share", "reason")


def instances_table(user) -> str:
    """The user's latest instances as a read-only HTML table, each linking to its admin page."""
    instances = list(
        Instance.objects.filter(user=user)
        .select_related("image", "host")
        .order_by("-created_at")[:INSTANCE_PREVIEW_ROWS]
    )
    if not instances:
        return "No instances yet."

    def when(moment):
        return moment.strftime("%Y-%m-%d %H:%M") if moment else "–"

    rows = format_html_join(
        "",
        '<tr data-state="{}"><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
        '<td>{}</td><td>{}</td><td>{}</td><td class="num">{}</td><td>{}</td></tr>',
        (
            (
                instance.state,
                reverse("admin:instances_instance_change", args=[instance.pk]),
                instance.short_id,
                instance.get_state_display(),
                instance.size,
                instance.image.name,
                instance.host.name if instance.host else "–",
                when(instance.created_at),
                when(instance.ready_at),
                when(instance.stopped_at),
                hours(instance.charged_gpu_seconds),
                instance.failure_reason or stop_reason_text(instance) or "–",
            )
            for instance in instances
        ),
    )
    all_of_them = reverse("admin:instances_instance_changelist") + "?" + urlencode({"q": user.email})
    return format_html(
        '<table data-testid="instances"><thead><tr><th>Instance</th><th>State</th><th>Size</th><th>Image</th>'
        "<th>Host</th><th>Launched</th><th>Ready</th><th>Stopped</th><th>Charged (GPU-h)</th>"
        "<th>Stop or failure reason</th></tr></thead><tbody>{}</tbody></table>"
        '<p><a href="{}">All instances of this user</a></p>',
        rows,
        all_of_them,
    )


# --- The launch policy (portal.instances.models.LaunchPolicy) --------------------------------------------
# Registered here, next to the per-user launch sizes it works with, because portal/instances/admin.py
# belongs to the instance console; it can move there unchanged.


def _per_size_fields(form_class):
    """Add a number field per size for the policy's per-size JSON settings (max_session_hours,
    idle_minutes), so operators edit numbers, not JSON. Class decorator."""
    for size in SIZES.values():
        for prefix, label, help_text in (
            ("max_session_hours", f"Longest session at {size.name} (hours)", "0 means no limit."),
            (
                "idle_minutes",
                f"Idle minutes before a warning at {size.name}",
                "0 means never stopped as idle.",
            ),
        ):
            field = forms.IntegerField(min_value=0, label=label, help_text=help_text)
            form_class.base_fields[f"{prefix}_{size.key}"] = field
            form_class.declared_fields[f"{prefix}_{size.key}"] = field
    return form_class


@_per_size_fields
class LaunchPolicyForm(forms.ModelForm):
    free_sizes = forms.MultipleChoiceField(
        choices=SIZE_CHOICES,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Sizes every verified account may launch",
    )
    bonus_sizes = forms.MultipleChoiceField(
        choices=SIZE_CHOICES,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Sizes an approved bonus application opens",
        help_text="Operators can also open sizes to one person from their user page.",
    )
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        max_length=1000,
        help_text="Why you are changing the policy; kept in the audit log with the old and new values.",
    )

    class Meta:
        model = LaunchPolicy
        fields = ["free_sizes", "bonus_sizes", "max_live_instances", "idle_grace_minutes"]
        labels = {
            "max_live_instances": "Instances one person may have running or starting at once",
            "idle_grace_minutes": "Minutes between the idle warning and the stop",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for size_key in SIZES:
            self.fields[f"max_session_hours_{size_key}"].initial = self.instance.max_session_hours_for(
                size_key
            )
            self.fields[f"idle_minutes_{size_key}"].initial = self.instance.idle_minutes_for(size_key)

    def policy_values(self) -> dict:
        """The cleaned values in the shape launch_policy_update takes."""
        data = self.cleaned_data
        return {
            "free_sizes": data["free_sizes"],
            "bonus_sizes": data["bonus_sizes"],
            "max_live_instances": data["max_live_instances"],
            "idle_grace_minutes": data["idle_grace_minutes"],
            "max_session_hours": {key: data[f"max_session_hours_{key}"] for key in SIZES},
            "idle_minutes": {key: data[f"idle_minutes_{key}"] for key in SIZES},
        }


@admin.register(LaunchPolicy)
class LaunchPolicyAdmin(admin.ModelAdmin):
    """One page: the policy in force. Saving goes through launch_policy_update, which audits the change."""

    form = LaunchPolicyForm
    fieldsets = (
        ("Who may launch what", {"fields": ("free_sizes", "bonus_sizes", "max_live_instances")}),
        ("Session length", {"fields": tuple(f"max_session_hours_{key}" for key in SIZES)}),
        (
            "Idle instances",
            {"fields": (*(f"idle_minutes_{key}" for key in SIZES), "idle_grace_minutes")},
        ),
        ("Why", {"fields": ("reason",)}),
    )

    def has_add_permission(self, request):
        return False  # there is one policy, created on first read

    def has_delete_permission(self, request, obj=None):
        return False

    def changelist_view(self, request, extra_context=None):
        # A list of one row is a detour: go straight to the policy.
        return redirect("admin:instances_launchpolicy_change", LaunchPolicy.current().pk)

    def save_model(self, request, obj, form, change):
        _, changes = entitlements.launch_policy_update(
            actor=request.user, reason=form.cleaned_data["reason"], **form.policy_values()
        )
        if changes:
            summary = "; ".join(f"{field}: {c['old']} → {c['new']}" for field, c in changes.items())
            self.message_user(request, f"Launch policy changed ({summary}).", messages.SUCCESS)
        else:
            self.message_user(request, "Nothing changed.", messages.INFO)

    def log_change(self, request, obj, message):
        # The audit log records the change with its reason and values; Django's own history would
        # be a second, thinner record.
        return None

    def response_change(self, request, obj):
        return redirect("admin:instances_launchpolicy_change", obj.pk)
