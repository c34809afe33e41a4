"""The operators' screens for projects: who is in one and its limits, and the one limit only operators
set, whether it may run 8x (entitled_8x); and the open-source CI programme: reviewing applications (like
bonus applications: approve with a monthly amount, or reject with a reason the owners read), each
programme project's use against its grant, and ending a grant.

Deciding and ending go through portal/projects/ci_grants.py, which writes the audit log in the same
transaction; they need the operators' review permission (console.review_bonus), which also lets an
operator read these screens.
"""

from decimal import Decimal

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from portal.credits.forms import BonusRejectForm, HoursField, hours_to_gpu_seconds
from portal.credits.models import hours

from . import ci_grants, selectors
from .models import CIGrantApplication, Project, ProjectInvitation, ProjectMembership

REVIEW_PERMISSION = "console.review_bonus"


class MembershipInline(admin.TabularInline):
    model = ProjectMembership
    extra = 0
    raw_id_fields = ("user",)


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "entitled_8x", "max_live_instances", "ci_grant", "created_at")
    search_fields = ("slug", "name")
    list_filter = ("entitled_8x",)
    # The grant changes only through the programme's decisions (the CI programme screens).
    readonly_fields = ("created_at", "created_by", "ci_grant_gpu_seconds", "ci_grant_period")
    inlines = [MembershipInline]

    @admin.display(description="CI grant (GPU-h a month)", ordering="ci_grant_gpu_seconds")
    def ci_grant(self, project):
        return hours(project.ci_grant_gpu_seconds) if project.ci_grant_gpu_seconds else "–"


@admin.register(ProjectInvitation)
class ProjectInvitationAdmin(admin.ModelAdmin):
    list_display = ("project", "email", "role", "created_at", "expires_at", "accepted_at", "declined_at")
    search_fields = ("project__slug", "email")
    exclude = ("token_digest",)
    readonly_fields = ("accepted_by", "invited_by")


class CIGrantApproveForm(forms.Form):
    hours = HoursField(label="GPU-hours a month", min_value=Decimal("0.01"))
    note = forms.CharField(
        required=False,
        max_length=500,
        label="Note (optional)",
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Shown to the owners.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["hours"].initial = settings.CI_GRANT_DEFAULT_HOURS
        self.fields[
            "hours"
        ].help_text = (
            f"Granted now for this period, then on day {settings.CI_GRANT_RENEWAL_DAY} of every month (UTC)."
        )


class CIGrantEndForm(forms.Form):
    reason = forms.CharField(
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Recorded in the audit log with your name.",
        error_messages={"required": "Say why the grant ends; it is recorded in the audit log."},
    )


@admin.register(CIGrantApplication)
class CIGrantApplicationAdmin(admin.ModelAdmin):
    """Pending applications open as a review page (approve or reject); decided ones are read-only."""

    list_display = (
        "project",
        "status",
        "repository_link",
        "applicant_email",
        "created_at",
        "monthly",
        "decided_by_name",
    )
    list_filter = ("status",)
    search_fields = ("project__slug", "project__name", "repository_url", "applicant__email")
    list_select_related = ("project", "applicant")
    fields = (
        "project",
        "applicant_email",
        "repository_link",
        "maintainers",
        "purpose",
        "status",
        "created_at",
        "decided_at",
        "decided_by_name",
        "decision_reason",
        "monthly",
    )
    readonly_fields = fields

    @admin.display(description="Applicant", ordering="applicant__email")
    def applicant_email(self, application):
        return application.applicant.email if application.applicant else "–"

    @admin.display(description="Repository")
    def repository_link(self, application):
        # The service accepted only https URLs, so this is always a web link.
        return format_html(
            '<a href="{}" rel="noopener noreferrer" target="_blank">{}</a>',
            application.repository_url,
            application.repository_url,
        )

    @admin.display(description="GPU-hours a month", ordering="granted_gpu_seconds")
    def monthly(self, application):
        if application.status != CIGrantApplication.Status.APPROVED:
            return "–"
        return hours(application.granted_gpu_seconds)

    @staticmethod
    def may_review(request) -> bool:
        return request.user.has_perm(REVIEW_PERMISSION)

    def has_module_permission(self, request):
        return super().has_module_permission(request) or self.may_review(request)

    def has_view_permission(self, request, obj=None):
        return super().has_view_permission(request, obj) or self.may_review(request)

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        # A decision is final: decided applications are shown read-only.
        if obj is not None and obj.status != CIGrantApplication.Status.PENDING:
            return False
        return self.may_review(request)

    def get_urls(self):
        # Before the default URLs, whose "<path:object_id>/" would swallow these.
        return [
            path(
                "programme/",
                self.admin_site.admin_view(self.programme_view),
                name="projects_cigrantapplication_programme",
            ),
            path(
                "programme/<int:project_id>/end/",
                self.admin_site.admin_view(self.end_view),
                name="projects_cigrantapplication_end",
            ),
        ] + super().get_urls()

    def changelist_view(self, request, extra_context=None):
        extra_context = {
            **(extra_context or {}),
            "programme_url": reverse("admin:projects_cigrantapplication_programme"),
        }
        return super().changelist_view(request, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        application = self.get_object(request, unquote(object_id))
        if (
            application is not None
            and application.status == CIGrantApplication.Status.PENDING
            and self.has_change_permission(request, application)
        ):
            return self.review_view(request, application)
        if (
            application is not None
            and request.method == "POST"
            and {"_approve", "_reject"} & set(request.POST)
        ):
            messages.error(
                request,
                f"This application was already {application.get_status_display().lower()} by "
                f"{application.decided_by_name}; nothing changed.",
            )
            return redirect("admin:projects_cigrantapplication_change", application.pk)
        return super().change_view(request, object_id, form_url, extra_context)

    def review_view(self, request, application):
        approve_form = CIGrantApproveForm(prefix="approve")
        reject_form = BonusRejectForm(prefix="reject")
        reject_form.fields["reason"].help_text = "Shown to the owners, so say what they can do about it."
        try:
            if request.method == "POST" and "_approve" in request.POST:
                approve_form = CIGrantApproveForm(request.POST, prefix="approve")
                if approve_form.is_valid():
                    decided = ci_grants.ci_grant_approve(
                        application_id=application.pk,
                        actor=request.user,
                        gpu_seconds=hours_to_gpu_seconds(approve_form.cleaned_data["hours"]),
                        reason=approve_form.cleaned_data["note"],
                    )
                    self.log_change(
                        request, decided, f"Approved: {hours(decided.granted_gpu_seconds)} GPU-h a month"
                    )
                    messages.success(
                        request,
                        f"{decided.project.name} is in the CI programme: {hours(decided.granted_gpu_seconds)} "
                        "GPU-hours a month, this month's granted now. Its owners are told.",
                    )
                    return redirect("admin:projects_cigrantapplication_changelist")
            elif request.method == "POST" and "_reject" in request.POST:
                reject_form = BonusRejectForm(request.POST, prefix="reject")
                if reject_form.is_valid():
                    decided = ci_grants.ci_grant_reject(
                        application_id=application.pk,
                        actor=request.user,
                        reason=reject_form.cleaned_data["reason"],
                    )
                    self.log_change(request, decided, f"Rejected: {decided.decision_reason}")
                    messages.success(
                        request,
                        f"Rejected the application of {decided.project.name}; its owners are told why.",
                    )
                    return redirect("admin:projects_cigrantapplication_changelist")
        except ValidationError as error:
            # Typically another operator decided it first; the page now shows their decision.
            messages.error(request, " ".join(error.messages))
            return redirect("admin:projects_cigrantapplication_change", application.pk)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Review the CI programme application of {application.project.name}",
            "application": application,
            "original": application,
            "repository": self.repository_link(application),
            "approve_form": approve_form,
            "reject_form": reject_form,
            "project_url": reverse("admin:projects_project_change", args=[application.project_id]),
            "earlier": application.project.ci_grant_applications.exclude(pk=application.pk),
        }
        return TemplateResponse(request, "admin/projects/cigrantapplication/review.html", context)

    def programme_view(self, request):
        """Every programme project's grant this period: granted, used, left, and when it renews."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Open-source CI programme: use against grant",
            "grants": selectors.ci_programme(),
            "may_end": self.may_review(request),
            "end_form": CIGrantEndForm(),
        }
        return TemplateResponse(request, "admin/projects/cigrantapplication/programme.html", context)

    def end_view(self, request, project_id):
        """End a project's grant (POST, with a reason): it renews no more."""
        if request.method != "POST" or not self.may_review(request):
            raise PermissionDenied
        project = get_object_or_404(Project, pk=project_id)
        form = CIGrantEndForm(request.POST)
        if not form.is_valid():
            messages.error(request, " ".join(form.errors["reason"]))
        else:
            try:
                ci_grants.ci_grant_end(
                    project_id=project.pk, actor=request.user, reason=form.cleaned_data["reason"]
                )
            except ValidationError as error:
                messages.error(request, " ".join(error.messages))
            else:
                self.log_change(request, project, f"CI programme grant ended: {form.cleaned_data['reason']}")
                messages.success(
                    request, f"Ended the CI programme grant of {project.name}; it renews no more."
                )
        return redirect("admin:projects_cigrantapplication_programme")
