"""Operator console for users: balance, identities (email, GitHub) and verification at a glance."""

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.contrib.auth.forms import AdminUserCreationForm, UserChangeForm
from django.db.models import Exists, OuterRef
from django.urls import reverse
from django.utils.html import format_html
from social_django.models import UserSocialAuth

from portal.credits.admin import adjust_url, ledger_table
from portal.credits.models import BonusApplication, hours

from .models import SshKey, User


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
    list_display = ("email", "name", "balance", "verified", "github_login", "date_joined", "is_active")
    list_filter = (VerifiedFilter, GithubFilter, "is_active", "is_staff", "is_superuser")
    search_fields = ("email", "first_name", "last_name")
    ordering = ("-date_joined",)
    list_select_related = ("credit_account",)
    readonly_fields = (
        "balance",
        "bonus_collected",
        "github_login",
        "adjust",
        "ledger",
        "last_login",
        "date_joined",
    )
    fieldsets = (
        (None, {"fields": ("email", "password")}),
        ("Personal info", {"fields": ("first_name", "last_name")}),
        ("Identity", {"fields": ("email_verified_at", "pending_email", "github_login", "deleted_at")}),
        ("Credits", {"fields": ("balance", "bonus_collected", "adjust", "ledger")}),
        ("Permissions", {"fields": ("is_active", "is_staff", "is_superuser", "groups", "user_permissions")}),
        ("Important dates", {"fields": ("last_login", "date_joined")}),
    )
    add_fieldsets = (
        (None, {"classes": ("wide",), "fields": ("email", "usable_password", "password1", "password2")}),
    )
    inlines = [BonusApplicationInline, SshKeyInline]

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
